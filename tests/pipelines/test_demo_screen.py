"""`pagemill run --job jobs/demo.yaml` as a new user runs it (a process of its own, the tiny model): every line on
its stdout and stderr is one pagemill wrote (its prefix, or a line of the closing summary's shape), no progress line
shows an ETA before a page is done, and vLLM's lines are in the run's log file, which the summary names."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import vllm_available

ROOT = Path(__file__).resolve().parents[2]
# The closing summary's lines after its first (pipelines/run/run.py `summary`), each under its label.
SUMMARY_LINE = re.compile(r"^  (the run: |outcomes: |reasons: |pages: |model calls \d|tables: |log: |query: "
                          r"|markdown: )")
# vLLM's own log format: `INFO 12-07 04:28:27 [core.py:402] ...` (its logger, in its engine core process or here).
VLLM_LINE = re.compile(r"\b(INFO|WARNING|DEBUG) \d\d-\d\d \d\d:\d\d:\d\d \[[\w.]+\.py:\d+\]")
PROGRESS = re.compile(r"^pagemill: (wave \d+/\d+: )?\d+/\d+ documents, (\d+) pages, [\d.]+ pages/s(, ETA (.+))?$")


@pytest.mark.vllm
@pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (scripts/setup_venv.sh)")
def test_the_demo_prints_only_pagemills_lines_and_logs_vllms(tmp_path: Path, test_model_dir: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    out = tmp_path / "demo"
    argv = [sys.executable, "-m", "pipelines.cli", "run", "--job", "jobs/demo.yaml", "--output", str(out),
            "--model", str(test_model_dir), "--progress-every-s", "1"]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    stdout, stderr = done.stdout.splitlines(), done.stderr.splitlines()
    # stdout: the summary, first line and last line pagemill's, the lines between of its shape.
    assert stdout[0].startswith("pagemill: ") and stdout[-1].startswith("pagemill: exit 0: "), done.stdout
    strays = [line for line in stdout[1:-1] if not SUMMARY_LINE.match(line)]
    strays += [line for line in stderr if not line.startswith(("pagemill: ", "pagemill run: "))]
    assert not strays, "lines pagemill did not write:\n" + "\n".join(strays)
    # Each of pagemill's own lines once (progress lines repeat by nature: they are redrawn or repeated).
    said = [line for line in stderr if not PROGRESS.match(line)]
    assert len(said) == len(set(said)), said
    # No ETA figure while no page is done.
    for line in stderr:
        progress = PROGRESS.match(line)
        if progress and progress.group(4) is not None and int(progress.group(2)) == 0:
            assert progress.group(4) == "unknown", line
    # The log: beside the manifest, named in the summary, holding vLLM's lines.
    log = out / "runs" / "tenant=default" / "demo.log"
    assert any(line.startswith("  log:") and str(log) in line for line in stdout), done.stdout
    text = log.read_text(errors="replace")
    assert len(VLLM_LINE.findall(text)) >= 3, text[-3000:]
    assert not VLLM_LINE.search(done.stdout + done.stderr)
