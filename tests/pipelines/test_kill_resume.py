"""Kill -9 and resume: `pagemill run` in its own process group, killed once finished rows are on disk,
then run again with the same --run-id. Nothing lost, nothing duplicated, no page paid for twice.

Rows are read from the raw Parquet files with pyarrow (never through the SQL views, which hide
duplicates by keeping the latest row per key)."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from schemas import layout
from tests.conftest import vllm_available
from tests.support import docmaker
from tests.support.row_keys import assert_one_row_per_key, raw_rows
from transforms.intake.inspection import IntakeLimits, count_pages

ROOT = Path(__file__).resolve().parents[2]


def pagemill(inputs: Path, output: Path, run_id: str, *flags: str) -> subprocess.Popen:
    """`pagemill run` as a child in a new session, so the kill reaches every process it started."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    argv = [sys.executable, "-m", "pipelines.cli", "run", "--input", str(inputs), "--output", str(output),
            "--run-id", run_id, "--progress-every-s", "0", *flags]
    with open(output.parent / f"{output.name}-{run_id}-{time.monotonic_ns()}.log", "wb") as log:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def kill_when_durable(proc: subprocess.Popen, output: Path, run_id: str, rows: int, timeout_s: float) -> int:
    """Wait until at least `rows` page rows are on disk, then kill -9 the whole process group.
    Returns the page rows on disk after the kill. Fails if the run ended by itself first."""
    deadline = time.monotonic() + timeout_s
    while len(raw_rows(output, "pages", run_id)) < rows:
        assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before {rows} page rows were on disk"
        assert time.monotonic() < deadline, f"fewer than {rows} page rows on disk after {timeout_s} s"
        time.sleep(0.2)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    return len(raw_rows(output, "pages", run_id))


def manifests(output: Path) -> list[Path]:
    """Run manifests (the only JSON a run writes), wherever the layout puts them."""
    return sorted(output.rglob("*.json"))


# With the model -------------------------------------------------------------------------------------

N_PAGES = 24
KILL_AT = 6


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (scripts/setup_venv.sh)")
def test_killed_extraction_resumes_paying_only_for_the_rest(tmp_path: Path, test_model_dir: Path) -> None:
    inputs, output = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    (inputs / "report.pdf").write_bytes(docmaker.multipage_pdf(N_PAGES))
    (inputs / "corrupt.pdf").write_bytes(docmaker.truncated_pdf())
    flags = ["--schema", "invoice", "--model", str(test_model_dir), "--model-revision", "tiny", "--max-tokens", "256",
             "--max-attempts", "1", "--kv-cache-gib", "0.25", "--max-side", "640", "--flush-rows", "4",
             "--flush-seconds", "2"]

    first = pagemill(inputs, output, "k1", *flags)
    on_disk = kill_when_durable(first, output, "k1", KILL_AT, timeout_s=600)
    # The premise: the run was killed midway, with some of its pages durable and no manifest.
    assert KILL_AT <= on_disk < N_PAGES
    assert manifests(output) == []
    before = {(r["doc_sha256"], r["page_index"]): r for r in raw_rows(output, "pages", "k1")}
    paid = {(r["doc_sha256"], r["page_index"]): r["cost_usd"] for r in raw_rows(output, "ledger", "k1")
            if r["route"] == "model"}
    assert paid and all(c > 0 for c in paid.values())

    resumed_at = time.time()
    second = pagemill(inputs, output, "k1", *flags)
    assert second.wait(timeout=600) == 0
    assert len(manifests(output)) == 1

    assert_one_row_per_key(output, "k1", listed=2, pages=N_PAGES)
    ledger = {(r["doc_sha256"], r["page_index"]): r for r in raw_rows(output, "ledger", "k1")}
    by_resume = {k for k, r in ledger.items() if r["route"] == "model" and r["created_at"].timestamp() >= resumed_at}
    print(f"\nkilled with {len(before)}/{N_PAGES} pages on disk; the resume sent {len(by_resume)} to the model")
    # Model calls in the resumed run: exactly the pages that were not on disk.
    assert by_resume.isdisjoint(before)
    assert by_resume == set(ledger) - set(before)
    # What was paid before the kill is kept once: not dropped, not doubled.
    for key, cost in paid.items():
        if key in before:
            assert ledger[key]["route"] == "model" and ledger[key]["cost_usd"] == pytest.approx(cost)
    pages = {(r["doc_sha256"], r["page_index"]): r for r in raw_rows(output, "pages", "k1")}
    assert sorted(i for _, i in pages) == list(range(N_PAGES))
    for key, row in before.items():  # the killed run's rows are the ones kept (they did the work)
        assert (pages[key]["status"], pages[key]["extraction"]) == (row["status"], row["extraction"])


# Render only (no model): kill -9 at seeded random points -------------------------------------------

N_DOCS = 8


@pytest.mark.slow
@pytest.mark.parametrize("seed", [7, 11])
def test_kill_at_a_random_point_then_resume_loses_and_duplicates_nothing(tmp_path: Path, seed: int) -> None:
    """Real rendering and Tesseract (OCR'd hints make each page take a while); the kill comes once a
    seeded random number of page rows is durable, 0 included (killed before anything was written)."""
    inputs, output = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    pages = 0
    for i in range(N_DOCS):
        n = 1 + i % 3
        (inputs / f"doc-{i:02d}.pdf").write_bytes(docmaker.multipage_pdf(n, title=f"Report {i}"))
        pages += n
    (inputs / "corrupt.pdf").write_bytes(docmaker.truncated_pdf())
    flags = ["--extract", "false", "--hints", "ocr", "--flush-rows", "2", "--flush-seconds", "1"]
    point = random.Random(seed).randrange(0, pages // 2)

    first = pagemill(inputs, output, "r1", *flags)
    on_disk = kill_when_durable(first, output, "r1", point, timeout_s=300)
    assert on_disk < pages and manifests(output) == []
    print(f"\nseed {seed}: killed once {point} page rows were durable ({on_disk} after the kill) of {pages}")

    assert pagemill(inputs, output, "r1", *flags).wait(timeout=300) == 0
    assert_one_row_per_key(output, "r1", listed=N_DOCS + 1, pages=pages)
    statuses = Counter(r["status"] for r in raw_rows(output, "pages", "r1"))
    assert statuses == {"rendered": pages}


# What a resumed run reads and sends to the model -----------------------------------------------------

def logged_count(data: bytes, fmt: str, limits: IntakeLimits, log: str) -> int:
    """Intake's page counter (it runs once per document intake reads, in the intake process), logging the
    document's sha256 first."""
    with open(log, "a") as handle:
        handle.write(hashlib.sha256(data).hexdigest() + "\n")
    return count_pages(data, fmt, limits)


class Probes:
    """The run's own graph (pipelines/run/graph.py), with intake's reads and the engine's requests logged; a wave
    named in `fail_wave` raises before its pipeline runs (the run stopped there, as a kill between waves)."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        from pipelines.run import graph

        self.reads, self.calls, self.fail_wave = root / "reads.log", root / "calls.log", None
        self.build = graph.build_pipeline
        monkeypatch.setattr(graph, "build_pipeline", self.probed)

    def probed(self, *args: Any, **kwargs: Any) -> None:
        from tests.support.probe_engine import ProbeEngine
        from transforms.store.write import part_prefix

        if self.fail_wave is not None and kwargs.get("prefix") == part_prefix(self.fail_wave):
            raise RuntimeError(f"stopped before wave {self.fail_wave}")
        self.build(*args, **kwargs, engine_factory=functools.partial(ProbeEngine, log=str(self.calls)),
                   intake_count=functools.partial(logged_count, log=str(self.reads)))

    def run(self, inputs: Path, output: Path, run_id: str, *flags: str) -> tuple[int, list[str], int]:
        """Exit code, the sha256 of each document intake read, and how many requests reached the engine."""
        from pipelines import cli

        self.reads.write_text("")
        self.calls.write_text("")
        code = cli.main(["run", "--input", str(inputs), "--output", str(output), "--run-id", run_id,
                         "--progress-every-s", "0", "--workers", "1", *flags])
        return code, self.reads.read_text().split(), len(self.calls.read_text().splitlines())


def documents(inputs: Path, pages: dict[str, int]) -> dict[str, str]:
    """One PDF a name with its pages, each different; their sha256 by name."""
    sha = {}
    for name, n in pages.items():
        data = docmaker.multipage_pdf(n, title=f"Document {name}")
        (inputs / name).write_bytes(data)
        sha[name] = hashlib.sha256(data).hexdigest()
    return sha


def resume_with_more(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str], calls: tuple[int, int]) -> None:
    """One pipeline listing its inputs itself (--wave-objects 0): a finished run, run again under its id with
    one more document, reads (and sends to the model: `calls`, before and after) that one only. The finished
    ones are dropped before intake, not read again and answered from the result cache (which compaction would
    then hide)."""
    inputs, output = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    probes = Probes(tmp_path, monkeypatch)
    flags = ["--wave-objects", "0", *flags]
    sha = documents(inputs, {"a.pdf": 1, "b.pdf": 2})
    code, read, model_calls = probes.run(inputs, output, "grow", *flags)
    assert (code, sorted(read), model_calls) == (0, sorted(sha.values()), calls[0])
    sha |= documents(inputs, {"c.pdf": 2})
    code, read, model_calls = probes.run(inputs, output, "grow", *flags)
    assert (code, read, model_calls) == (0, [sha["c.pdf"]], calls[1])
    manifest = json.loads(Path(layout.manifest_path(str(output), "default", "grow")).read_text())
    assert manifest["resumed"] is True and manifest["stage_timings"]["documents_accepted"] == 1
    assert_one_row_per_key(output, "grow", listed=3, pages=5)


@pytest.mark.vllm
@pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (scripts/setup_venv.sh)")
def test_a_resumed_run_reads_and_extracts_only_the_new_documents(tmp_path: Path, test_model_dir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    flags = ["--schema", "invoice", "--model", str(test_model_dir), "--model-revision", "tiny", "--max-tokens", "64",
             "--max-attempts", "1", "--kv-cache-gib", "0.25", "--max-side", "400"]
    resume_with_more(tmp_path, monkeypatch, flags, calls=(1 + 2, 2))  # a's and b's pages, then c's


def test_a_resumed_render_only_run_reads_only_the_new_documents(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The same without the model (seconds): what intake reads again is the cost a resume must not pay."""
    resume_with_more(tmp_path, monkeypatch, ["--extract", "false"], calls=(0, 0))


def test_a_run_stopped_between_waves_resumes_with_the_unfinished_wave_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Waves (--wave-objects 2): the run stops before its second wave; run again, it reads that wave's
    documents only (the finished wave is not read again) and ends with one row a key."""
    inputs, output = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    probes = Probes(tmp_path, monkeypatch)
    flags = ["--wave-objects", "2", "--extract", "false"]
    sha = documents(inputs, {"a.pdf": 1, "b.pdf": 2, "c.pdf": 2})
    probes.fail_wave = 1
    code, first, _ = probes.run(inputs, output, "waves", *flags)
    assert code == 1 and manifests(output) == []
    # Which documents each wave holds: the run's own written listing.
    waves = [sorted(sha[Path(r["uri"]).name] for r in pq.read_table(path).to_pylist())
             for path in sorted(output.rglob("wave-*.parquet"))]
    assert len(waves) == 2 and all(waves) and sorted(waves[0] + waves[1]) == sorted(sha.values())
    assert sorted(first) == waves[0]
    probes.fail_wave = None
    code, second, _ = probes.run(inputs, output, "waves", *flags)
    assert (code, sorted(second)) == (0, waves[1])
    manifest = json.loads(Path(layout.manifest_path(str(output), "default", "waves")).read_text())
    assert (manifest["waves"]["skipped"], manifest["waves"]["ran"]) == (1, 1)
    assert manifest["stage_timings"]["documents_accepted"] == len(waves[1])
    assert_one_row_per_key(output, "waves", listed=3, pages=5)
