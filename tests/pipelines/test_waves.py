"""Waves (pipelines/run/waves.py): a run over a durable listing, in bounded pipelines under one run id, gives the
rows one pipeline over the whole listing gives (dedup global across waves), shows progress while it works,
and a run killed in its third wave resumes without reading the first two waves' objects again."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest

from pipelines import cli
from pipelines.run import graph
from pipelines.run.waves import merge_metrics, wave_files, wave_of
from tests.support import docmaker
from tests.support.raw import one_row_per, raw_rows
from tests.support.wave_inputs import RENDER_ONLY, make_inputs, manifest
from transforms.hints.ocr import OcrResult
from transforms.intake.dedup import kept_by_sha
from transforms.store.listing_file import first_wave, wave_chunks

ROOT = Path(__file__).resolve().parents[2]
LIVENESS_S = 300  # a wait for a run to reach a point: far above what it takes, never a speed bound


# Pure ----------------------------------------------------------------------------------------------

def test_wave_chunks_ramp_up_then_full_waves() -> None:
    assert first_wave(10, 11) == 1 and first_wave(5000, 64_000) == 500 and first_wave(3, 4) == 1
    assert first_wave(5000, 5000) == 5000  # one wave: no ramp
    assert [len(c) for c in wave_chunks(range(25), 10)] == [1, 10, 10, 4]  # type: ignore[arg-type]
    assert [len(c) for c in wave_chunks(range(10), 10)] == [10]  # type: ignore[arg-type]


def test_wave_files_split_own_and_earlier() -> None:
    files = ["o/part-w00000-a.parquet", "o/part-w00001-b.parquet", "o/part-w00002-c.parquet", "o/part-x.parquet"]
    assert [wave_of(f) for f in files] == [0, 1, 2, None]
    own, earlier = wave_files(files, 1)
    assert own == ["o/part-w00001-b.parquet", "o/part-x.parquet"]
    assert earlier == ["o/part-w00000-a.parquet", "o/part-x.parquet"]


def test_kept_by_sha_takes_kept_copies_only() -> None:
    rows = [{"doc_sha256": "s1", "source_uri": "b", "outcome": "rendered"},
            {"doc_sha256": "s1", "source_uri": "a", "outcome": "extracted"},
            {"doc_sha256": "s2", "source_uri": "c", "outcome": "duplicate"},
            {"doc_sha256": "s3", "source_uri": "d", "outcome": "rejected"},
            {"doc_sha256": None, "source_uri": "e", "outcome": "rejected"},
            {"doc_sha256": "s4", "source_uri": "f", "outcome": "quarantined"}]
    assert kept_by_sha(rows) == {"s1": "a", "s4": "f"}


def test_merge_metrics_adds_counters_and_combines_distributions() -> None:
    a = {"pages_done": 3, "render_ms": {"count": 2, "sum": 10, "mean": 5.0, "max": 7}}
    b = {"pages_done": 4, "render_ms": {"count": 2, "sum": 30, "mean": 15.0, "max": 20}, "other": 1}
    assert merge_metrics(a, b) == {"pages_done": 7, "other": 1,
                                   "render_ms": {"count": 4, "sum": 40, "mean": 10.0, "max": 20}}


# Runs ----------------------------------------------------------------------------------------------

def test_waves_give_the_rows_of_one_pipeline(tmp_path: Path) -> None:
    """25 objects in waves of 1, 10, 10, 4, with copies whose kept twin lies in an earlier wave (and one in
    the same wave): every object's outcome and duplicate_of as one pipeline gives them."""
    copies = {"p0000-copy.png": 0, "z-copy-of-3.png": 3, "z-copy-of-12.png": 12}
    inputs = make_inputs(tmp_path / "in", 22, copies)
    outcomes = {}
    for name, waves in (("waves", "10"), ("one", "0")):
        out = tmp_path / name
        assert cli.main(["run", "--input", str(tmp_path / "in"), "--output", str(out), "--run-id", "r",
                         "--progress-every-s", "0", "--wave-objects", waves, *RENDER_ONLY]) == 0
        docs = one_row_per(raw_rows(out, "documents", "r"), "source_uri")
        assert sorted(docs) == inputs
        outcomes[name] = {u: (d["outcome"], d["duplicate_of"], d["doc_sha256"]) for u, d in docs.items()}
        pages = raw_rows(out, "pages", "r")
        assert len(pages) == 22 and all(p["rendered_at"] is not None for p in pages)  # render-only pages too
    assert outcomes["waves"] == outcomes["one"]
    uri = {n: str(tmp_path / "in" / n) for n in ("p0000-copy.png", "p0000.png", "p0003.png", "z-copy-of-3.png")}
    # "p0000-copy.png" sorts first: it is the first wave (of one object), its twin in the second is the duplicate.
    assert outcomes["waves"][uri["p0000.png"]][:2] == ("duplicate", uri["p0000-copy.png"])
    assert outcomes["waves"][uri["z-copy-of-3.png"]][:2] == ("duplicate", uri["p0003.png"])
    m = manifest(tmp_path / "waves", "r")
    assert {k: v for k, v in m["waves"].items() if k != "seconds"} == \
        {"total": 4, "objects": 25, "skipped": 0, "ran": 4, "first_ran": 0}
    assert sorted(m["waves"]["seconds"]) == [str(w) for w in range(4)]  # a wall time for each wave run
    assert m["stage_timings"]["objects_submitted"] == 25 and m["retried_rows"] == 0


def test_progress_lines_while_the_run_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A slow OCR (0.25 s a page): progress lines come while pages remain, not at the end."""
    def slow_ocr(image: bytes, settings: object) -> OcrResult:
        time.sleep(0.25)
        return OcrResult("ok", text="slow page", mean_conf=90.0)

    monkeypatch.setattr(graph, "build_pipeline", partial(graph.build_pipeline, ocr=slow_ocr))
    make_inputs(tmp_path / "in", 12)
    assert cli.main(["run", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--run-id", "p",
                     "--extract", "false", "--nsfw-classifier", "none", "--hints", "ocr", "--workers", "1",
                     "--document-timeout-s", "0", "--page-timeout-s", "0", "--wave-objects", "4",
                     "--progress-every-s", "0.2"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("pagemill: wave ")]
    pages = [int(line.split(" documents, ")[1].split(" pages")[0]) for line in lines]
    assert len(raw_rows(tmp_path / "out", "pages", "p")) == 12
    assert sum(1 for n in pages if n < 12) >= 5, lines  # printed before the last page was on disk
    assert any(0 < n < 12 for n in pages), lines  # and they moved
    assert all("/12 documents" in line for line in lines)


def pagemill(inputs: Path, output: Path, run_id: str, log: Path, stop: tuple[int, int, Path] | None = None,
             ) -> subprocess.Popen:
    """`pagemill run` in a child process (killable); `stop` = (wave, n, marker): its documents writer blocks once
    n rows of that wave are on disk (tests/support/wave_faults.py), and says so in `marker`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    head = ["-m", "tests.support.wave_faults", *map(str, stop)] if stop else ["-m", "pipelines.cli"]
    argv = [sys.executable, *head, "run", "--input", str(inputs), "--output", str(output), "--run-id", run_id,
            "--progress-every-s", "0", "--wave-objects", "4", "--flush-rows", "1", *RENDER_ONLY,
            "--document-timeout-s", "0", "--page-timeout-s", "0"]
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def test_killed_in_the_third_wave_resumes_without_reading_the_first_two(tmp_path: Path) -> None:
    """13 PDFs of 1-3 pages in waves of 1, 4, 4, 4. The fault: the documents writer blocks once 2 documents of the
    third wave are on disk; kill -9 there (inside the wave, whatever the machine's speed), then resume: waves 1-2
    are skipped unread (the objects handed to intake are counted), the third wave reads only its 2 documents not
    yet written, and every object and page has one row."""
    pages = docmaker.pdf_folder(tmp_path / "in", 13)
    inputs = sorted(pages)
    output, blocked = tmp_path / "out", tmp_path / "blocked"
    proc = pagemill(tmp_path / "in", output, "k", tmp_path / "first.log", stop=(2, 2, blocked))
    deadline = time.monotonic() + LIVENESS_S  # liveness only: a run that never blocks fails here, not at pytest's
    while not blocked.exists():
        assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "the run never reached its third wave's third document"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    listing = output / "listings" / "tenant=default" / "run_id=k"
    assert sorted(p.name for p in listing.glob("*.done")) == ["wave-00000.done", "wave-00001.done"]
    assert not list(output.glob("runs/**/*.json"))  # no manifest (the run's log beside it is appended as it goes)
    done_in_third = {r["source_uri"] for r in raw_rows(output, "documents", "k")} - set(inputs[:5])
    assert done_in_third and done_in_third <= set(inputs[5:9]) and len(done_in_third) == 2
    proc = pagemill(tmp_path / "in", output, "k", tmp_path / "second.log")
    assert proc.wait(timeout=600) == 0, (tmp_path / "second.log").read_text()[-3000:]
    m = manifest(output, "k")
    assert {k: v for k, v in m["waves"].items() if k != "seconds"} == \
        {"total": 4, "objects": 13, "skipped": 2, "ran": 2, "first_ran": 2}
    assert sorted(m["waves"]["seconds"]) == [str(w) for w in (2, 3)]  # a wall time for each wave run
    timings = m["stage_timings"]
    assert timings["objects_submitted"] == 8  # waves 3-4 only: the first two are not listed again
    read = timings.get("documents_accepted", 0) + timings.get("documents_rejected", 0)
    assert read == 8 - len(done_in_third)  # nor are the third wave's documents already written
    assert m["this_invocation"]["documents"] == 13 - 5 - len(done_in_third)
    assert sorted(one_row_per(raw_rows(output, "documents", "k"), "source_uri")) == inputs
    page_rows = one_row_per(raw_rows(output, "pages", "k"), "source_uri", "page_index")
    assert sorted(page_rows) == sorted((u, i) for u, n in pages.items() for i in range(n))
    assert m["documents"] == 13 and m["totals"]["pages"] == sum(pages.values())
    assert m["errors"] == [] and m["exit_code"] == 0


def test_a_resume_reads_the_durable_listing_and_reports_this_invocation_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Waves of 1 and 2 (a.pdf of 1 page; b.pdf, c.pdf of 2 and 3); the run stops before its second wave (the
    fault: its graph builder raises). An object added to the input folder since is not listed on resume: the run
    lists once, and the resume reads its written listing. The manifest and the closing lines count what the resume
    did (b and c) apart from what the run holds."""
    from transforms.intake import listing
    from transforms.store.write import part_prefix

    inputs = tmp_path / "in"
    inputs.mkdir()
    pages = {"a.pdf": 1, "b.pdf": 2, "c.pdf": 3}
    for name, n in pages.items():
        (inputs / name).write_bytes(docmaker.multipage_pdf(n, title=name))
    listed: list[object] = []
    list_matching = listing.list_matching
    monkeypatch.setattr(listing, "list_matching", lambda *a: listed.append(a) or list_matching(*a))
    build, stop_before = graph.build_pipeline, [1]

    def stopped(*args: object, **kwargs: object) -> None:
        if stop_before and kwargs.get("prefix") == part_prefix(stop_before[0]):
            raise RuntimeError("injected: stopped before the second wave")
        build(*args, **kwargs)

    monkeypatch.setattr(graph, "build_pipeline", stopped)
    argv = ["run", "--input", str(inputs), "--output", str(tmp_path / "out"), "--run-id", "l",
            "--progress-every-s", "0", "--wave-objects", "2", *RENDER_ONLY]
    assert cli.main(argv) == 1 and len(listed) == 1
    (inputs / "0-new.pdf").write_bytes(docmaker.multipage_pdf(4, title="new"))  # sorts first
    stop_before.clear()
    capsys.readouterr()
    assert cli.main(argv) == 0
    assert len(listed) == 1, "the resume listed the inputs again instead of reading the run's listing"
    docs = one_row_per(raw_rows(tmp_path / "out", "documents", "l"), "source_uri")
    assert sorted(docs) == [str(inputs / n) for n in pages]
    m = manifest(tmp_path / "out", "l")
    assert {k: v for k, v in m["waves"].items() if k != "seconds"} == \
        {"total": 2, "objects": 3, "skipped": 1, "ran": 1, "first_ran": 1}
    assert sorted(m["waves"]["seconds"]) == [str(w) for w in (1,)]  # a wall time for each wave run
    assert m["resumed"] is True
    assert m["this_invocation"] == {"documents": 2, "pages": 2 + 3, "model_calls": 0}  # b and c
    assert (m["documents"], m["totals"]["pages"]) == (3, 1 + 2 + 3)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("pagemill: 2 documents, 5 pages in ")
    assert out[0].endswith("model calls 0 by this invocation; waves run 1 of 2 (1 finished before)")
    assert out[1:4] == ["  the run:  3 documents, 6 pages in all", "  outcomes: rendered 3", "  pages:    rendered 6"]
