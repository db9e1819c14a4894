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
    assert progress_line(Progress(documents=0, listed=5, pages=0, seconds=1.0)).endswith(", ETA unknown")  # no rate
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


def eta_figure(line: str) -> str | None:
    """The ETA's figure a line shows (`ETA 47 s` -> "47"), or None for `ETA unknown` or no ETA."""
    words = line.split("ETA ", 1)
    return None if len(words) == 1 or words[1].startswith("unknown") else words[1].split(" s")[0]


def test_no_eta_while_no_page_is_done() -> None:
    """Documents that end before the model (rejected, duplicate) finish in the first seconds; an ETA from them alone
    grew with the clock while no page was done (`3/6 documents, 0 pages, ETA 2 s`, then 4 s, 6 s ...)."""
    for seconds in (1.0, 2.0, 20.0, 600.0):
        line = progress_line(Progress(documents=3, listed=6, pages=0, seconds=seconds))
        assert eta_figure(line) is None and line.endswith("ETA unknown"), line
    # A resume whose earlier invocation did pages: still no rate of this invocation's own.
    resumed = progress_line(Progress(documents=40, listed=100, pages=90, seconds=30.0, documents_before=30,
                                     pages_before=90))
    assert eta_figure(resumed) is None and "0.0 pages/s" in resumed, resumed
    # The first page: now there is a rate. 4 of 6 documents in 8 s: 2 left at 0.5 a second, 4 s.
    assert eta_figure(progress_line(Progress(documents=4, listed=6, pages=1, seconds=8.0))) == "4"
    # Everything listed is done: nothing left to estimate.
    assert "ETA" not in progress_line(Progress(documents=6, listed=6, pages=5, seconds=8.0))


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_line_is_redrawn_in_place_and_ended_before_any_other_line(tmp_path: Path) -> None:
    from pipelines.run.run_log import Screen

    terminal = Terminal()
    screen = Screen(terminal, terminal)
    watcher = ProgressWatcher(str(tmp_path), "t", "r", 60.0, listed=4, out=screen.err)
    watcher.report()
    watcher.report()
    print("pagemill: warning: something", file=screen.err)
    print("pagemill: 4 documents", file=screen.out)
    text = terminal.getvalue()
    # Two draws of one line (carriage return, erase to the end), then a newline before the next line.
    first = "\rpagemill: 0/4 documents, 0 pages, 0.0 pages/s, ETA unknown\x1b[K"
    assert text == first * 2 + "\npagemill: warning: something\npagemill: 4 documents\n", repr(text)


def test_not_on_a_terminal_each_report_is_a_line(tmp_path: Path) -> None:
    out = io.StringIO()
    watcher = ProgressWatcher(str(tmp_path), "t", "r", 60.0, listed=4, out=out)
    watcher.report()
    watcher.report()
    assert out.getvalue() == "pagemill: 0/4 documents, 0 pages, 0.0 pages/s, ETA unknown\n" * 2
