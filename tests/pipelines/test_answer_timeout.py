"""--answer-timeout-s in a whole pipeline: an engine that never answers one page (the injected fault) costs that
page `engine_timeout` with ledger stop_reason `deadline`, and the run goes on: every other page is answered,
every document has its row. A simulated engine (no vLLM model), so it runs in seconds; the real engine's abort
is tested in tests/transforms/extract/test_deadline.py.

When the limit does not reach the stage, nothing ever aborts the held page: a liveness bound (LIVENESS_S, far above
the 1 s limit) then fails it, so the run ends and the test fails saying why, instead of waiting for pytest's
timeout."""
from __future__ import annotations

import datetime as dt
import functools
import json
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import apache_beam as beam

from pipelines.config.options import PagemillOptions
from pipelines.run.graph import build_pipeline
from pipelines.run.settings import run_settings
from pipelines.tables import sql
from tests.support import docmaker
from tests.support.stuck_engine import Stuck
from transforms.engines.base import RequestFailed

ANSWER = json.dumps({"vendor_name": None, "invoice_number": None, "issue_date": None, "due_date": None,
                     "currency": None, "subtotal": None, "tax": None, "total": 1.0, "line_items": []})


LIVENESS_S = 60.0  # not a speed bound: the 1 s limit aborts the page long before this
NEVER_ABORTED = "never aborted"


class BoundedStuck(Stuck):
    """Stuck, whose held requests fail NEVER_ABORTED after LIVENESS_S unless the stage aborted them first."""

    def submit(self, prepared: Any, sampling: Any) -> Future:
        future = super().submit(prepared, sampling)
        if future in self.held:
            timer = threading.Timer(LIVENESS_S, _fail_if_pending, (future,))
            timer.daemon = True
            timer.start()
        return future


def _fail_if_pending(future: Future) -> None:
    if not future.done():
        future.set_exception(RequestFailed("engine_error", NEVER_ABORTED))  # ends the page: the run finishes


def stuck_engine(settings: Any, stuck: int) -> Stuck:
    return BoundedStuck(stuck=stuck, slots=4, seconds=0.01, text=ANSWER)


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
    messages = [m for (m,) in sql.query(str(output), "SELECT message FROM pages WHERE message IS NOT NULL")[1]]
    assert not any(NEVER_ABORTED in m for m in messages), \
        f"the held page was not aborted within {LIVENESS_S:g} s: --answer-timeout-s did not reach the stage"
    found = rows(output, "SELECT p.status, p.reason_code, l.stop_reason, l.route, l.attempts FROM pages p "
                         "JOIN ledger l USING (run_id, doc_sha256, source_uri, page_index) ORDER BY 1")
    assert len(found) == 4  # every page has its row
    timed_out = [r for r in found if r["status"] == "failed"]
    assert [(r["reason_code"], r["stop_reason"], r["route"], r["attempts"]) for r in timed_out] == \
        [("engine_timeout", "deadline", "model", 1)]  # aborted once, not retried
    assert [(r["status"], r["stop_reason"]) for r in found if r["status"] != "failed"] == [("ok", "stop")] * 3
    docs = rows(output, "SELECT outcome FROM documents")
    assert sorted(d["outcome"] for d in docs) in (["extracted", "partial"], ["extracted", "failed"])
