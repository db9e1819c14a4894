"""The progress line (done of those known, this invocation's rate, an ETA once there is a rate), and the
watcher's row counts from the part files a run has written."""
from __future__ import annotations

import io
from pathlib import Path

from pipelines.run.progress import Progress, ProgressWatcher, progress_line
from schemas import tables
from schemas.layout import partition
from transforms.store.write import write_rows


def test_progress_line_has_totals_rate_wave_and_eta() -> None:
    line = progress_line(Progress(documents=30, listed=100, pages=40, seconds=20.0, wave=1, waves=4))
    assert line == "wave 2/4: 30/100 documents, 40 pages, 2.0 pages/s, ETA 47 s"
    # A resume: the rates are this invocation's, the counts the run's.
    line = progress_line(Progress(documents=60, listed=100, pages=70, seconds=10.0, documents_before=50,
                                  pages_before=50))
    assert line == "60/100 documents, 70 pages, 2.0 pages/s, ETA 40 s"
    assert "ETA" not in progress_line(Progress(documents=0, listed=5, pages=0, seconds=1.0))  # no rate: no guess
    unlisted = Progress(documents=3, listed=None, pages=3, seconds=1.0)  # `--wave-objects 0`: not listed before
    assert progress_line(unlisted) == "3 documents, 3 pages, 3.0 pages/s"


def test_watcher_counts_rows_on_disk(tmp_path: Path) -> None:
    out = io.StringIO()
    watcher = ProgressWatcher(str(tmp_path), "t", "r", 60.0, listed=10, waves=2, out=out)
    folder = partition(str(tmp_path), "pages", "t", "r")
    write_rows(folder, tables.PAGES, [{"run_id": "r", "tenant": "t", "doc_sha256": "d", "page_index": i}
                                      for i in range(3)])
    write_rows(partition(str(tmp_path), "documents", "t", "r"), tables.DOCUMENTS,
               [{"run_id": "r", "tenant": "t", "source_uri": "a"}])
    write_rows(partition(str(tmp_path), "pages", "t", "other"), tables.PAGES, [{"run_id": "other", "tenant": "t"}])
    watcher.wave = 1
    now = watcher.now()
    assert (now.documents, now.pages, now.listed, now.wave) == (1, 3, 10, 1)
    watcher.report()
    assert out.getvalue().startswith("pagemill: wave 2/2: 1/10 documents, 3 pages")


def test_a_resumed_runs_rate_and_eta_count_only_this_invocations_rows(tmp_path: Path) -> None:
    """Rows an earlier (killed) invocation wrote are on disk when the watcher starts: the counts include them,
    the rate and the ETA do not."""
    def write(table: str, schema: object, n: int, start: int) -> None:
        rows = [{"run_id": "r", "tenant": "t", "source_uri": f"u{i}", "doc_sha256": f"d{i}", "page_index": 0}
                for i in range(start, start + n)]
        write_rows(partition(str(tmp_path), table, "t", "r"), schema, rows)  # type: ignore[arg-type]

    write("documents", tables.DOCUMENTS, 40, 0)  # the killed invocation's rows
    write("pages", tables.PAGES, 90, 0)
    now = [1000.0]
    out = io.StringIO()
    watcher = ProgressWatcher(str(tmp_path), "t", "r", 60.0, listed=100, out=out, clock=lambda: now[0])
    write("documents", tables.DOCUMENTS, 10, 40)  # this invocation's, in its first 20 s
    write("pages", tables.PAGES, 30, 90)
    now[0] += 20.0
    watcher.report()
    # 30 pages / 20 s = 1.5 pages/s; 10 documents / 20 s = 0.5 a second, 100 - 50 left: 100 s.
    assert out.getvalue() == "pagemill: 50/100 documents, 120 pages, 1.5 pages/s, ETA 100 s\n"
