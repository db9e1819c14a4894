"""--answer-timeout-s in a whole pipeline: an engine that never answers one page (the injected fault) costs that
page `engine_timeout` with ledger stop_reason `deadline`, and the run goes on: every other page is answered,
every document has its row. A simulated engine (no vLLM model), so it runs in seconds; the real engine's abort
is tested in tests/transforms/extract/test_deadline.py."""
from __future__ import annotations

import datetime as dt
import functools
import json
from pathlib import Path
from typing import Any

import apache_beam as beam

from pipelines.config.options import PagemillOptions
from pipelines.run.graph import build_pipeline
from pipelines.run.settings import run_settings
from pipelines.tables import sql
from tests import docmaker
from tests.transforms.extract.test_deadline import Stuck

ANSWER = json.dumps({"vendor_name": None, "invoice_number": None, "issue_date": None, "due_date": None,
                     "currency": None, "subtotal": None, "tax": None, "total": 1.0, "line_items": []})


def stuck_engine(settings: Any, stuck: int) -> Stuck:
    return Stuck(stuck=stuck, slots=4, seconds=0.01, text=ANSWER)


def rows(output: Path, query: str) -> list[dict[str, Any]]:
    columns, values = sql.query(str(output), query)
    return [dict(zip(columns, v, strict=True)) for v in values]


def test_a_page_without_an_answer_ends_engine_timeout_and_the_run_goes_on(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "invoice.pdf").write_bytes(docmaker.invoice_pdf())
    (tmp_path / "in" / "report.pdf").write_bytes(docmaker.multipage_pdf(3))
    output = tmp_path / "out"
    options = PagemillOptions([
        "--input", str(tmp_path / "in"), "--output", str(output), "--run-id", "r1", "--schema", "invoice",
        "--model", "simulated", "--model-family", "qwen2_vl", "--max-side", "400", "--nsfw-classifier", "none",
        "--hints", "text_layer", "--progress-every-s", "0", "--answer-timeout-s", "1", "--max-attempts", "2"])
    o = options.view_as(PagemillOptions)
    with beam.Pipeline(options=options) as p:
        build_pipeline(p, run_settings(o), {"run_id": "r1", "tenant": o.tenant, "created_at": dt.datetime.now(dt.UTC)},
                       engine_factory=functools.partial(stuck_engine, stuck=1))
    found = rows(output, "SELECT p.status, p.reason_code, l.stop_reason, l.route, l.attempts FROM pages p "
                         "JOIN ledger l USING (run_id, doc_sha256, source_uri, page_index) ORDER BY 1")
    assert len(found) == 4  # every page has its row
    timed_out = [r for r in found if r["status"] == "failed"]
    assert [(r["reason_code"], r["stop_reason"], r["route"], r["attempts"]) for r in timed_out] == \
        [("engine_timeout", "deadline", "model", 1)]  # aborted once, not retried
    assert [(r["status"], r["stop_reason"]) for r in found if r["status"] != "failed"] == [("ok", "stop")] * 3
    docs = rows(output, "SELECT outcome FROM documents")
    assert sorted(d["outcome"] for d in docs) in (["extracted", "partial"], ["extracted", "failed"])
