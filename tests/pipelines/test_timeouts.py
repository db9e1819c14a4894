"""--document-timeout-s end to end: a folder with a slow PDF (one shared content stream of line operators that
pdfium takes seconds a page to draw) and a normal PDF finishes on time, with `timeout` on the slow one and the
normal one done, under the in-memory and the multi-process DirectRunner. Intake is under the limit too: a page
count that hangs ends its document `failed`/`timeout`, and the limit changes no row of a document that does not
run into it."""
from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import apache_beam as beam
import pytest

from pipelines import cli
from pipelines.config.options import PagemillOptions
from pipelines.run.graph import build_pipeline
from pipelines.run.settings import run_settings
from tests.conftest import CORPUS
from tests.support import docmaker
from tests.support.intake_hangs import MARK, hangs_on_mark
from tests.support.raw import one_row_per, raw_rows

REPO = Path(__file__).resolve().parents[2]
SLOW_PAGES = 40


@pytest.mark.parametrize("mode", [["--workers=1"],
                                  ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]],
                         ids=["in_memory", "multi_processing"])
def test_slow_pdf_times_out_and_the_run_goes_on(tmp_path: Path, mode: list[str]) -> None:
    inputs, out = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    (inputs / "slow.pdf").write_bytes(docmaker.slow_pdf(SLOW_PAGES))
    (inputs / "normal.pdf").write_bytes(docmaker.multipage_pdf(2))
    args = ["run", "--input", str(inputs), "--output", str(out), "--run-id", "t", "--extract", "false",
            "--hints", "none", "--nsfw-classifier", "none", "--document-timeout-s", "10",
            "--progress-every-s", "0", *mode]
    start = time.monotonic()
    # The subprocess limit is the hang guard: 40 pages of this stream take many minutes unstopped.
    run = subprocess.run([sys.executable, "-m", "pipelines.cli", *args], cwd=REPO, capture_output=True, text=True,
                         timeout=150, env={**os.environ, "PYTHONPATH": str(REPO)})
    elapsed = time.monotonic() - start
    assert run.returncode in (0, 1), run.stderr[-3000:]
    docs = {Path(u).name: d for u, d in one_row_per(raw_rows(out, "documents", "t"), "source_uri").items()}
    assert set(docs) == {"slow.pdf", "normal.pdf"}
    assert (docs["normal.pdf"]["outcome"], docs["normal.pdf"]["reason_code"]) == ("rendered", None)
    slow = docs["slow.pdf"]
    assert slow["outcome"] in ("partial", "failed") and slow["reason_code"] == "timeout", slow
    pages = one_row_per(raw_rows(out, "pages", "t"), "source_uri", "page_index")
    slow_pages = [p for (uri, _), p in pages.items() if uri.endswith("slow.pdf")]
    assert len(slow_pages) == SLOW_PAGES  # every page accounted for: rendered before the deadline, or timeout
    assert {p["reason_code"] for p in slow_pages if p["status"] != "rendered"} == {"timeout"}
    # One slow document in two is a system failure over 5%: the exit code says so, and why.
    manifest = json.loads((out / "runs" / "tenant=default" / "t.json").read_text())
    assert manifest["exit_code"] == run.returncode == 1
    assert "failed for system reasons" in manifest["exit_reason"]
    print(f"{mode or 'in_memory'}: {elapsed:.1f} s wall, slow.pdf {slow['outcome']}: {slow['message']}")


def test_hung_safety_check_times_out_its_document_and_the_run_goes_on(tmp_path: Path) -> None:
    """The gate runs under the limit too: a --safety-check that stops answering on one document's second
    page (tests/transforms/document_work/test_work.py's fault injector) ends that document `timeout`, its first page
    keeps its row, and the other document is done."""
    inputs, out = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    (inputs / "hangs.pdf").write_bytes(docmaker.multipage_pdf(3, title="Hangs"))
    (inputs / "normal.pdf").write_bytes(docmaker.multipage_pdf(1))
    args = ["run", "--input", str(inputs), "--output", str(out), "--run-id", "h", "--extract", "false",
            "--hints", "text_layer", "--nsfw-classifier", "none", "--document-timeout-s", "10",
            "--safety-check", "tests.transforms.document_work.test_work:hangs_in_hangs_pdf", "--progress-every-s", "0",
            "--workers", "1"]
    run = subprocess.run([sys.executable, "-m", "pipelines.cli", *args], cwd=REPO, capture_output=True, text=True,
                         timeout=150, env={**os.environ, "PYTHONPATH": str(REPO)})  # the hang guard
    assert run.returncode == 1, run.stderr[-3000:]  # one document in two failed for a system reason
    docs = {Path(u).name: d for u, d in one_row_per(raw_rows(out, "documents", "h"), "source_uri").items()}
    assert (docs["normal.pdf"]["outcome"], docs["normal.pdf"]["reason_code"]) == ("rendered", None)
    assert (docs["hangs.pdf"]["outcome"], docs["hangs.pdf"]["reason_code"]) == ("partial", "timeout")
    pages = one_row_per(raw_rows(out, "pages", "h"), "source_uri", "page_index")
    hung = sorted((i, p["status"], p["reason_code"]) for (uri, i), p in pages.items() if uri.endswith("hangs.pdf"))
    assert hung == [(0, "rendered", None), (1, "failed", "timeout"), (2, "failed", "timeout")]


def test_hung_page_count_at_intake_times_out_its_document_and_the_run_goes_on(tmp_path: Path) -> None:
    """Intake's page count runs under the limit: a document whose opening hangs (an injected counter, test
    only) gets its one `documents` row, failed with `timeout`; the other document is rendered."""
    inputs, out = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    (inputs / "hangs.pdf").write_bytes(docmaker.multipage_pdf(2) + MARK)
    (inputs / "normal.pdf").write_bytes(docmaker.multipage_pdf(2))
    options = PagemillOptions(["--input", str(inputs), "--output", str(out), "--run-id", "i", "--extract", "false",
                               "--hints", "none", "--nsfw-classifier", "none", "--document-timeout-s", "5",
                               "--progress-every-s", "0"])
    o = options.view_as(PagemillOptions)
    o.run_id = "i"
    with beam.Pipeline(options=options) as p:  # the hang guard is the test's own timeout: the child sleeps an hour
        build_pipeline(p, run_settings(o), {"run_id": "i", "tenant": o.tenant, "created_at": dt.datetime.now(dt.UTC)},
                       intake_count=hangs_on_mark)
    docs = {Path(u).name: d for u, d in one_row_per(raw_rows(out, "documents", "i"), "source_uri").items()}
    assert (docs["normal.pdf"]["outcome"], docs["normal.pdf"]["reason_code"]) == ("rendered", None)
    hung = docs["hangs.pdf"]
    assert (hung["outcome"], hung["reason_code"], hung["format"]) == ("failed", "timeout", "pdf"), hung
    assert "--document-timeout-s 5" in hung["message"]
    pages = one_row_per(raw_rows(out, "pages", "i"), "source_uri", "page_index")
    assert sorted(Path(u).name for u, _ in pages) == ["normal.pdf", "normal.pdf"]  # none for a document never opened


def _some_corpus_files() -> list[Path]:
    """A few of each kind: the first (by path) small files of each suffix, hostile and ordinary."""
    chosen: list[Path] = []
    for folder, per_suffix in ((CORPUS / "hostile", 2), (CORPUS / "extraction_gt", 2)):
        seen: dict[str, int] = {}
        for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.stat().st_size < 300_000):
            suffix = path.suffix.lower()
            if suffix in {".pdf", ".png", ".jpg", ".jpeg", ".tif", ".tiff", ".gif", ".webp", ".bmp", ".md"} \
                    and seen.get(suffix, 0) < per_suffix:
                seen[suffix] = seen.get(suffix, 0) + 1
                chosen.append(path)
    return chosen


@pytest.mark.skipif(not (CORPUS / "hostile").is_dir(), reason=f"{CORPUS} is absent")
def test_limits_change_no_documents_row(tmp_path: Path) -> None:
    """The same corpus files, with the time limits on (intake and rendering in child processes) and off
    (both in the Beam worker): the same `documents` rows, messages included."""
    files = _some_corpus_files()
    listing = tmp_path / "list.txt"
    listing.write_text("".join(f"{p}\n" for p in files))
    rows = {}
    for name, limits in (("on", ["--document-timeout-s", "300"]),
                         ("off", ["--document-timeout-s", "0", "--page-timeout-s", "0"])):
        out = tmp_path / name
        code = cli.main(["run", "--input", f"@{listing}", "--output", str(out), "--run-id", name, "--extract", "false",
                         "--nsfw-classifier", "none", "--progress-every-s", "0", "--workers", "1", *limits])
        assert code in (0, 1), name
        rows[name] = {u: {k: v for k, v in r.items() if k not in ("run_id", "created_at", "attempt_seq")}
                      for u, r in one_row_per(raw_rows(out, "documents", name), "source_uri").items()}
    assert len(rows["on"]) == len(files)
    assert rows["on"] == rows["off"]
    assert {r["outcome"] for r in rows["on"].values()} >= {"rendered", "rejected"}  # both paths were exercised
