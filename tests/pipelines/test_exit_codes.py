"""`pagemill run`'s exit code: the pure rule over a run's counts, and a run whose model cannot load."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from pipelines import cli
from pipelines.run.exit_codes import exit_code
from schemas.reasons import INPUT_REASONS, MODEL_OUTPUT_REASONS, REASON_CODES, SYSTEM_REASONS
from tests.conftest import vllm_available
from tests.support import docmaker
from tests.support.raw import one_row_per, raw_rows


def counts(documents: int, pages: dict[str, int], page_reasons: dict[str, int] | None = None,
           document_reasons: dict[str, int] | None = None, errors: list[str] | None = None) -> dict[str, Any]:
    return {"documents": documents, "pages": pages, "page_reasons": page_reasons or {},
            "document_reasons": document_reasons or {}, "errors": errors or []}


def test_every_reason_code_is_classified_once() -> None:
    assert SYSTEM_REASONS | MODEL_OUTPUT_REASONS | INPUT_REASONS == set(REASON_CODES)
    assert not SYSTEM_REASONS & INPUT_REASONS and not MODEL_OUTPUT_REASONS & INPUT_REASONS
    assert {"engine_error", "timeout"} <= SYSTEM_REASONS
    assert {"unreadable", "encrypted", "too_large", "render_failed"} <= INPUT_REASONS


def test_a_clean_run_exits_0() -> None:
    code, why = exit_code(counts(3, {"ok": 10}), 0.05)
    assert code == 0 and "within" in why


def test_bad_input_alone_never_fails_the_run() -> None:
    # 9 of 10 documents rejected as unreadable/encrypted, 2 pages unrenderable: the run did its job.
    c = counts(10, {"ok": 5, "failed": 2}, {"render_failed": 2}, {"unreadable": 6, "encrypted": 3})
    assert exit_code(c, 0.05)[0] == 0


def test_system_failures_over_the_fraction_exit_1() -> None:
    # 1 of 10 documents timed out (10%) with one page: over 5% of documents, under 5% of 40 pages.
    c = counts(10, {"ok": 39, "failed": 1}, {"timeout": 1}, {"timeout": 1})
    code, why = exit_code(c, 0.05)
    assert code == 1 and "1 of 10 documents" in why and "timeout" not in why.split("(")[0]
    assert exit_code(c, 0.10)[0] == 0  # exactly at the fraction is not over it
    assert exit_code(c, 0.0)[0] == 1


def test_page_fraction_counts_too() -> None:
    # One document of 100, 30 of its 200 pages failed with engine_error (15% of pages).
    c = counts(100, {"ok": 170, "failed": 30}, {"engine_error": 30}, {"engine_error": 1})
    code, why = exit_code(c, 0.05)
    assert code == 1 and "30 of 200 pages" in why


def test_model_output_failures_are_not_system_failures() -> None:
    c = counts(2, {"ok": 1, "invalid": 9}, {"schema_invalid": 5, "truncated": 4})
    assert exit_code(c, 0.05)[0] == 0


def test_model_unusable_exits_3() -> None:
    c = counts(4, {"failed": 7, "cached": 3}, {"engine_error": 7}, {"engine_error": 3})
    code, why = exit_code(c, 0.05)
    assert code == 3 and "engine_error" in why
    # One page answered by the model: it could be used, so the fraction rule decides (exit 1).
    c = counts(4, {"failed": 7, "ok": 1}, {"engine_error": 7}, {"engine_error": 3})
    assert exit_code(c, 0.05)[0] == 1


def test_invariant_errors_exit_1() -> None:
    c = counts(1, {"ok": 1}, errors=["pages: 1 key(s) with more than one row"])
    code, why = exit_code(c, 0.05)
    assert code == 1 and "invariant" in why


def test_an_empty_run_exits_0() -> None:
    assert exit_code(counts(0, {}), 0.05)[0] == 0


@pytest.mark.vllm
@pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (scripts/setup_venv.sh)")
def test_corrupt_weights_exit_3_with_every_document_accounted_for(
        tmp_path: Path, test_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "corrupt-model"
    shutil.copytree(test_model_dir, model)
    weights = sorted(model.glob("*.safetensors"))
    assert weights, "the test model has no safetensors file"
    for path in weights:  # keep the header's promise of sizes, lose the tensors behind it
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 3])
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "invoice.pdf").write_bytes(docmaker.invoice_pdf())
    (inputs / "report.pdf").write_bytes(docmaker.multipage_pdf(2))
    (inputs / "corrupt.pdf").write_bytes(docmaker.truncated_pdf())
    out = tmp_path / "out"
    code = cli.main(["run", "--input", str(inputs), "--output", str(out), "--run-id", "bad-model",
                     "--model", str(model), "--kv-cache-gib", "0.25", "--max-side", "640", "--hints", "none",
                     "--nsfw-classifier", "none", "--progress-every-s", "0"])
    captured = capsys.readouterr()
    assert code == 3, captured.err[-3000:]
    assert "exit 3" in captured.err
    docs = one_row_per(raw_rows(out, "documents", "bad-model"), "source_uri")
    assert sorted(Path(u).name for u in docs) == ["corrupt.pdf", "invoice.pdf", "report.pdf"]
    by_name = {Path(u).name: d for u, d in docs.items()}
    assert by_name["corrupt.pdf"]["outcome"] == "rejected"
    for name in ("invoice.pdf", "report.pdf"):
        assert (by_name[name]["outcome"], by_name[name]["reason_code"]) == ("failed", "engine_error")
    pages = raw_rows(out, "pages", "bad-model")
    assert len(pages) == 3 and {p["reason_code"] for p in pages} == {"engine_error"}
    # The cause on the screen: pagemill's line saying the engine could not start (once, though every page tried),
    # and the engine's own last lines with the path of the log that holds the rest (pipelines/run/run_log.py).
    log = out / "runs" / "tenant=default" / "bad-model.log"
    assert f"the last lines of the log {log}:" in captured.err
    assert captured.err.count("pagemill: error: vLLM engine could not start") == 1
    assert all(line.startswith(("pagemill: ", "pagemill run: ")) for line in captured.err.splitlines()), captured.err


def test_a_pipeline_that_fails_exits_1_keeps_its_rows_and_writes_no_manifest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import apache_beam as beam

    import pipelines.run.graph

    real = pipelines.run.graph.build_pipeline

    def failing(p: beam.Pipeline, *args: Any, **kwargs: Any) -> None:  # fault injection: a worker that raises
        real(p, *args, **kwargs)
        _ = p | "Boom" >> beam.Create([1]) | "Raise" >> beam.Map(lambda _: 1 / 0)

    monkeypatch.setattr(pipelines.run.graph, "build_pipeline", failing)
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "a.pdf").write_bytes(docmaker.multipage_pdf(1))
    out = tmp_path / "out"
    code = cli.main(["run", "--input", str(inputs), "--output", str(out), "--run-id", "boom", "--no-extract",
                     "--progress-every-s", "0"])
    err = capsys.readouterr().err
    assert code == 1
    assert "ZeroDivisionError" in err and "run boom failed" in err and "--run-id boom to resume" in err
    # Not finished: no manifest, so a --since-last-run nightly cannot start after this run.
    assert not list(out.rglob("boom.json"))
