"""The path distributed runners take: the demo job (extraction with the tiny model included) through Beam's
PortableRunner with an external worker pool (`worker_pool_main`, the way Flink and Spark run Python SDK
workers), so the graph is serialised, shipped and run by separate SDK worker processes."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import vllm_available
from tests.pipelines.raw import one_row_per, raw_rows

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (scripts/setup_venv.sh)")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"worker pool exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("worker pool did not start")


def test_demo_job_through_portable_runner_and_external_worker_pool(tmp_path: Path, test_model_dir: Path) -> None:
    port = _free_port()
    # The pool starts each SDK worker as `python -c ...`: the venv's python must come first on PATH, and the
    # workers import pagemill's modules (the DoFns are pickled by reference) from the checkout.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           # The pool pipes each worker's stdout and never reads it: keep vLLM's stdout logging short.
           "VLLM_LOGGING_LEVEL": "WARNING"}
    pool = subprocess.Popen([sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
                             f"--service_port={port}"], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_port(port, pool)
        out = tmp_path / "out"
        args = [sys.executable, "-m", "pipelines.cli", "run", "--job", "jobs/demo.yaml", "--output", str(out),
                "--run-id", "portable", "--model", str(test_model_dir), "--kv-cache-gib", "0.25",
                "--progress-every-s", "0", "--runner", "PortableRunner", "--job_endpoint", "embed",
                "--wave-objects", "5",  # samples/ holds 6 objects: waves of 1 and 5, each through the job service
                "--environment_type", "EXTERNAL", "--environment_config", f"localhost:{port}",
                # The pool is on this host: it sees the checkout's samples/, the output folder and the model.
                "--shared-filesystem"]
        run = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=540)
        assert run.returncode == 0, run.stderr[-4000:]
    finally:
        pool.terminate()
        pool.wait(timeout=30)
    samples = sorted(p.name for p in (REPO / "samples").iterdir())  # README.md too: it is an input
    docs = one_row_per(raw_rows(out, "documents", "portable"), "source_uri")
    assert sorted(Path(u).name for u in docs) == samples  # one documents row per input
    by_name = {Path(u).name: d for u, d in docs.items()}
    assert by_name["corrupt.pdf"]["outcome"] == "rejected"
    extracted = [d for d in docs.values() if d["outcome"] == "extracted"]
    assert extracted, {n: d["outcome"] for n, d in by_name.items()}
    pages = one_row_per(raw_rows(out, "pages", "portable"), "doc_sha256", "page_index")
    assert any(p["status"] == "ok" and p["extraction"] for p in pages.values())
    ledger = one_row_per(raw_rows(out, "ledger", "portable"), "doc_sha256", "page_index")
    assert set(ledger) == set(pages)
    listing = out / "listings" / "tenant=default" / "run_id=portable"
    assert len(list(listing.glob("wave-*.done"))) == 2


def _recipes() -> list[list[str]]:
    """The `pagemill run` command lines of the Runners section of docs/runners.md, as argument lists."""
    import shlex

    text = (REPO / "docs" / "runners.md").read_text()
    section = text[text.index("## Runners\n"):]
    section = section[: section.index("\n## ", 5)].replace("\\\n", " ")
    found = []
    for line in section.splitlines():
        start = line.find("pagemill run ")
        if start < 0:
            continue
        command = line[start:].split("`")[0] if "`" in line[start:] else line[start:]
        args = [a for a in shlex.split(command)[2:] if a not in ("...", "…")]
        found.append(args)
    return found


def test_readme_runner_recipes_use_known_flags() -> None:
    """As far as a recipe can be tested here: every flag of the Dataflow, Flink and Spark lines parses."""
    from pipelines.config.options import check_flags

    recipes = _recipes()
    assert len(recipes) >= 4, recipes
    joined = " ".join(" ".join(r) for r in recipes)
    for runner in ("DataflowRunner", "FlinkRunner", "SparkRunner", "PortableRunner"):
        assert runner in joined
    for args in recipes:
        flags = [a for a in args if a != "--job" and not a.endswith(".yaml")]
        assert check_flags(flags) == [], args
