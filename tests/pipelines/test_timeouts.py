"""--document-timeout-s end to end: a folder with a slow PDF (one shared content stream of line operators that
pdfium takes seconds a page to draw) and a normal PDF finishes on time, with `timeout` on the slow one and the
normal one done, under the in-memory and the multi-process DirectRunner."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import docmaker
from tests.pipelines.raw import one_row_per, raw_rows

REPO = Path(__file__).resolve().parents[2]
SLOW_PAGES = 40


@pytest.mark.parametrize("mode", [[], ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]],
                         ids=["in_memory", "multi_processing"])
def test_slow_pdf_times_out_and_the_run_goes_on(tmp_path: Path, mode: list[str]) -> None:
    inputs, out = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    (inputs / "slow.pdf").write_bytes(docmaker.slow_pdf(SLOW_PAGES))
    (inputs / "normal.pdf").write_bytes(docmaker.multipage_pdf(2))
    args = ["run", "--input", str(inputs), "--output", str(out), "--run-id", "t", "--extract", "false",
            "--hints", "none", "--nsfw-classifier", "none", "--document-timeout-s", "20",
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
    manifest = json.loads((out / "runs" / "t.json").read_text())
    assert manifest["exit_code"] == run.returncode == 1
    assert "failed for system reasons" in manifest["exit_reason"]
    print(f"{mode or 'in_memory'}: {elapsed:.1f} s wall, slow.pdf {slow['outcome']}: {slow['message']}")
