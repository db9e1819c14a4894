"""`pagemill run --engine openai` against a misbehaving endpoint (the fault injector of
tests/support/served_faults.py, a real HTTP server on 127.0.0.1; no model): an answer whose usage
counts are not counts fails its own page as `invalid_response`, and the run goes on and finishes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines import cli
from tests.support import docmaker
from tests.support.raw import one_row_per, raw_rows
from tests.support.served_faults import Injector, completion, fault_server

FLAGS = ["--schema", "invoice", "--engine", "openai", "--model", "tiny", "--max-tokens", "256",
         "--progress-every-s", "0", "--workers", "1", "--concurrency", "1", "--nsfw-classifier", "none"]


def test_bad_usage_counts_fail_their_pages_and_never_the_run(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    for i in range(5):
        (inputs / f"invoice-{i}.pdf").write_bytes(docmaker.invoice_pdf(seed=i))
    state = Injector()
    # What aborted whole runs before (exit 1, no manifest): a negative count, and one past int64.
    state.bodies = [completion({}, usage={"prompt_tokens": -10_000_000, "completion_tokens": 40}),
                    completion({}, usage={"prompt_tokens": 10**20, "completion_tokens": 40})]
    out = tmp_path / "out"
    with fault_server(state) as url:
        code = cli.main(["run", "--input", str(inputs), "--output", str(out), "--run-id", "f1", "--endpoint", url,
                         "--max-failed-fraction", "0.5", *FLAGS])
    assert code == 0, capsys.readouterr().err  # 2 of 5 pages failed, under --max-failed-fraction
    pages = list(one_row_per(raw_rows(out, "pages", "f1"), "doc_sha256", "page_index").values())
    assert sorted((p["status"], p["reason_code"]) for p in pages) == [
        ("failed", "invalid_response")] * 2 + [("ok", None)] * 3
    messages = sorted(p["message"] for p in pages if p["status"] == "failed")
    assert "usage.prompt_tokens is -10000000" in messages[0] and "usage.prompt_tokens is 1000000" in messages[1]
    (manifest_file,) = (out / "runs").rglob("f1.json")  # written: the run finished
    manifest = json.loads(manifest_file.read_text())
    # The ledger holds the good pages' counts only (the injector's usage: 1500 prompt, 40 completion tokens).
    totals = manifest["totals"]
    assert (totals["image_tokens"] + totals["text_tokens"], totals["output_tokens"]) == (3 * 1500, 3 * 40)
    assert manifest["page_reasons"] == {"invalid_response": 2}
