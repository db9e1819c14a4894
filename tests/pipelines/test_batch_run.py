"""`pagemill run --engine openai-batch` against the fake Batch API (tests/support/fake_batch_server.py): exit 75
while the batches work, a second invocation submits nothing, an expired batch's half is kept and the rest sent once
more, a waiting launcher killed -9 mid-poll submits nothing twice, every page ends `ok` in one row, and the
ledger's cost is what the server billed at the batch rate."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelines import cli
from pipelines.run.exit_codes import TRY_LATER
from pipelines.tables.report import collect, summary_rows
from tests.support import docmaker
from tests.support.fake_batch_server import FakeBatches, batch_server
from tests.support.raw import one_row_per, raw_rows
from tests.support.served_faults import ANSWER
from transforms.model.budget import load_prices

FLAGS = ["--schema", "invoice", "--engine", "openai-batch", "--model", "gpt-4o", "--api-price", "gpt-4o",
         "--max-tokens", "256", "--progress-every-s", "0", "--workers", "1", "--nsfw-classifier", "none",
         "--batch-max-requests", "2", "--hints", "text_layer"]
PAGES = 6
ROOT = Path(__file__).resolve().parents[2]


def launcher(inputs: Path, out: Path, url: str) -> subprocess.Popen:
    """`pagemill run --wait` as a child in its own session (the kill reaches all it started)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    argv = [sys.executable, "-m", "pipelines.cli", "run", "--input", str(inputs), "--output", str(out),
            "--run-id", "b1", "--endpoint", url, *FLAGS, "--wait", "--batch-poll-s", "1"]
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def test_a_run_through_hosted_batches_exits_75_while_they_work_and_ends_with_every_page_ok(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    for i in range(PAGES):
        (inputs / f"invoice-{i}.pdf").write_bytes(docmaker.invoice_pdf(seed=i))
    out = tmp_path / "out"
    fake = FakeBatches()
    with batch_server(fake) as url:
        def run() -> int:
            return cli.main(["run", "--input", str(inputs), "--output", str(out), "--run-id", "b1",
                             "--endpoint", url, *FLAGS])

        assert run() == TRY_LATER, capsys.readouterr().err  # every page spooled and submitted
        batches = sorted(fake.batches)
        assert len(batches) == PAGES // 2 and sum(fake.received.values()) == PAGES
        assert not list((out / "runs").rglob("b1.json"))  # not finished: no manifest
        assert run() == TRY_LATER  # still working: submits nothing
        assert sorted(fake.batches) == batches and sum(fake.received.values()) == PAGES
        # A launcher that waits (--wait), killed -9 while it polls: nothing submitted, nothing lost.
        polls = fake.calls["GET v1/batches"]
        waiting = launcher(inputs, out, url)
        try:
            deadline = time.monotonic() + 120
            while fake.calls["GET v1/batches"] < polls + 2 * len(batches):  # two rounds of polls at least
                assert waiting.poll() is None, f"the waiting launcher ended (rc {waiting.returncode})"
                assert time.monotonic() < deadline, "the waiting launcher never polled"
                time.sleep(0.1)
        finally:
            os.killpg(waiting.pid, signal.SIGKILL)
            waiting.wait(timeout=60)
        assert sorted(fake.batches) == batches and sum(fake.received.values()) == PAGES
        fake.run(batches[0])
        fake.run(batches[1], share=0.5, status="expired")
        fake.run(batches[2])
        assert run() == TRY_LATER  # collected; the expired half sent again
        (again,) = fake.working()
        expired = fake.requests(batches[1])[1]["custom_id"]
        assert [line["custom_id"] for line in fake.requests(again)] == [expired]
        fake.run(again)
        assert run() == 0, capsys.readouterr().err
    assert fake.received == {cid: 2 if cid == expired else 1 for cid in fake.received}
    assert len(fake.received) == PAGES
    pages = one_row_per(raw_rows(out, "pages", "b1"), "doc_sha256", "page_index")
    assert sorted(p["status"] for p in pages.values()) == ["ok"] * PAGES
    docs = one_row_per(raw_rows(out, "documents", "b1"), "source_uri")
    assert sorted(d["outcome"] for d in docs.values()) == ["extracted"] * PAGES
    ledger = one_row_per(raw_rows(out, "ledger", "b1"), "doc_sha256", "page_index")
    assert {r["route"] for r in ledger.values()} == {"api:gpt-4o@batch"}
    price = load_prices()["providers"]["gpt-4o"]
    billed = fake.billed_usd(price["input_usd_per_mtok"], price["output_usd_per_mtok"], 0.5)
    assert billed > 0 and sum(r["cost_usd"] for r in ledger.values()) == pytest.approx(billed, rel=1e-3)
    (manifest_file,) = (out / "runs").rglob("b1.json")
    report = json.loads(manifest_file.read_text())["batches"]
    assert (report["submitted"], report["finished"], report["expired"], report["resubmitted"]) == (7, 6, 1, 1)
    assert report["billed_prompt_tokens"] == fake.billed["prompt_tokens"]
    shown = dict(summary_rows(collect(str(out), run_id="b1")))  # what `pagemill report` shows
    assert "4 batches: 7 requests submitted, 6 finished, 1 expired, 1 resubmitted" in shown["hosted batches"]


def test_an_invalid_answers_retry_goes_into_the_next_batch_and_the_page_ends_ok(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "invoice.pdf").write_bytes(docmaker.invoice_pdf(seed=7))
    out = tmp_path / "out"
    answers = iter([json.dumps({k: v for k, v in ANSWER.items() if k != "total"}),  # `total` is required
                    json.dumps(ANSWER)])
    fake = FakeBatches(answer=lambda body: next(answers), ends_at_create=True)
    with batch_server(fake) as url:  # one waiting invocation: pass, batch, pass (invalid: retry), batch, pass
        assert cli.main(["run", "--input", str(inputs), "--output", str(out), "--run-id", "v1", "--endpoint", url,
                         *FLAGS, "--wait"]) == 0, capsys.readouterr().err
    first, second = sorted(fake.batches)
    (tried,), (retry,) = fake.requests(first), fake.requests(second)
    assert retry["custom_id"] != tried["custom_id"]  # another attempt: its own id
    assert retry["body"]["messages"] == tried["body"]["messages"]  # of the same page and prompt
    assert retry["body"]["temperature"] != tried["body"]["temperature"]  # the retry samples, the first did not
    assert fake.received == {tried["custom_id"]: 1, retry["custom_id"]: 1}  # each attempt sent once
    (page,) = one_row_per(raw_rows(out, "pages", "v1"), "doc_sha256", "page_index").values()
    assert page["status"] == "ok" and json.loads(page["extraction"]) == ANSWER


def test_a_small_run_through_anthropic_message_batches_ends_ok_at_the_batch_price(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    for i in range(2):
        (inputs / f"invoice-{i}.pdf").write_bytes(docmaker.invoice_pdf(seed=20 + i))
    out = tmp_path / "out"
    monkeypatch.setenv("PAGEMILL_TEST_ANTHROPIC_KEY", "sk-ant-run")
    fake = FakeBatches(model="claude-sonnet-test", key="sk-ant-run", ends_at_create=True)
    flags = list(FLAGS)
    for flag, value in (("--engine", "anthropic-batch"), ("--model", "claude-sonnet-test"),
                        ("--api-price", "claude-sonnet")):
        flags[flags.index(flag) + 1] = value
    with batch_server(fake) as url:
        assert cli.main(["run", "--input", str(inputs), "--output", str(out), "--run-id", "a1", "--endpoint", url,
                         "--api-key-env", "PAGEMILL_TEST_ANTHROPIC_KEY", *flags, "--wait"]) == 0, \
            capsys.readouterr().err
    assert all(b.get("api") == "anthropic" for b in fake.batches.values()) and sum(fake.received.values()) == 2
    pages = one_row_per(raw_rows(out, "pages", "a1"), "doc_sha256", "page_index")
    assert sorted(p["status"] for p in pages.values()) == ["ok", "ok"]
    assert all(json.loads(p["extraction"]) == ANSWER for p in pages.values())
    ledger = one_row_per(raw_rows(out, "ledger", "a1"), "doc_sha256", "page_index")
    assert {r["route"] for r in ledger.values()} == {"api:claude-sonnet@batch"}
    price = load_prices()["providers"]["claude-sonnet"]
    billed = fake.billed_usd(price["input_usd_per_mtok"], price["output_usd_per_mtok"], 0.5)
    assert billed > 0 and sum(r["cost_usd"] for r in ledger.values()) == pytest.approx(billed, rel=1e-3)
