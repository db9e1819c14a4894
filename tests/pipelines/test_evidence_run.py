"""`pagemill run` writes the `evidence` table: a served model (the fault injector of tests/support/served_faults.py,
a real HTTP server on 127.0.0.1) answers each page with its document's true values, as a perfect model would; the
values are then looked for on the page (pdfium's text layer for born-digital invoices, Tesseract for scanned
receipts) and each found value's box is compared with where tests/support/grounded_docs.py measured it printed. One
invoice's answer has a made-up total: its page is flagged. The invoice run commits to an Iceberg catalog, which
holds the same evidence rows as `pagemill sql`."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from pipelines import cli
from pipelines.tables import queries, sql
from schemas import tables
from schemas.layout import TABLE_KEYS
from tests.support import grounded_docs
from tests.support.served_faults import Injector, completion, fault_server
from transforms.hints.ocr import available_languages

pytestmark = pytest.mark.skipif("eng" not in available_languages(), reason="tesseract with eng is not installed")
FLAGS = ["--engine", "openai", "--model", "tiny", "--max-tokens", "512", "--progress-every-s", "0", "--workers", "1",
         "--concurrency", "2", "--nsfw-classifier", "none"]


class TrueValues(Injector):
    """Answers each request with the values of the document whose key its prompt's text holds."""

    def __init__(self, docs: list[grounded_docs.MadeDoc]) -> None:
        super().__init__()
        self.docs = docs

    def next(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, str], float, Any]:
        text = " ".join(part.get("text", "") if isinstance(part, dict) else str(part)
                        for m in body.get("messages", []) for part in
                        (m["content"] if isinstance(m.get("content"), list) else [m.get("content") or ""]))
        found = [d for d in self.docs if re.search(rf"\b{re.escape(d.key)}\b", text)]
        answer = found[0].answer if len(found) == 1 else {}
        return 200, {}, 0.0, completion(body, content=json.dumps(answer))


def rows(output: Path, query: str) -> list[dict]:
    columns, values = sql.query(str(output), query)
    return [dict(zip(columns, v, strict=True)) for v in values]


def test_values_are_grounded_where_printed_and_a_made_up_total_flags_its_page(tmp_path: Path) -> None:
    invoices = [grounded_docs.invoice(0), grounded_docs.invoice(1), grounded_docs.invoice(2, made_up_total=True)]
    receipts = [grounded_docs.receipt(0), grounded_docs.receipt(1)]
    out = tmp_path / "out"
    for run_id, schema, docs, extra in (("inv", "invoice", invoices, ["--catalog", "sqlite"]),
                                        ("rec", "receipt", receipts, [])):
        folder = tmp_path / run_id
        folder.mkdir()
        for doc in docs:
            (folder / doc.name).write_bytes(doc.data)
        with fault_server(TrueValues(docs)) as url:
            code = cli.main(["run", "--input", str(folder), "--output", str(out), "--run-id", run_id, "--schema",
                             schema, "--endpoint", url, *FLAGS, *extra])
        assert code == 0

    by_name = {d.name: d for d in invoices + receipts}
    pages = {Path(p["source_uri"]).name: p for p in rows(out, "SELECT * FROM pages")}
    assert {n: p["status"] for n, p in pages.items()} == {n: "ok" for n in by_name}
    assert {n: p["hint_source"] for n, p in pages.items()} == {
        n: "text_layer" if n.endswith(".pdf") else "ocr" for n in by_name}
    evidence = rows(out, "SELECT * FROM evidence")
    made_up = ("invoice-2.pdf", "total")
    honest = [e for e in evidence if (Path(e["source_uri"]).name, e["field_path"]) != made_up]
    expected = sum(1 for d in by_name.values() for _ in _leaves(d.answer))
    assert len(evidence) == expected  # one row per non-empty value of every page
    grounded = [e for e in honest if e["grounded"]]
    assert len(grounded) / len(honest) >= 0.95, [(e["source_uri"], e["field_path"]) for e in honest
                                                 if not e["grounded"]]
    for e in grounded:
        doc = by_name[Path(e["source_uri"]).name]
        box = (e["x0"], e["y0"], e["x1"], e["y1"])
        assert max(grounded_docs.iou(box, b) for b in doc.boxes[e["field_path"]]) >= 0.5, e
        assert e["method"] == ("text_layer" if doc.name.endswith(".pdf") else "ocr") and e["quote"]

    (total,) = [e for e in evidence if (Path(e["source_uri"]).name, e["field_path"]) == made_up]
    assert total["grounded"] is False and total["x0"] is None and total["value"] == "98765.43"
    flagged = {n for n, p in pages.items() if "ungrounded_values" in p["flags"]}
    assert "invoice-2.pdf" in flagged and not flagged & {"invoice-0.pdf", "invoice-1.pdf"}
    assert pages["invoice-2.pdf"]["ungrounded_values"] >= 1
    assert {n: p["evidence_values"] for n, p in pages.items()} == {
        n: sum(1 for _ in _leaves(d.answer)) for n, d in by_name.items()}

    columns, found = queries.run(str(out), "ungrounded-values", run_id="inv")
    listed = [dict(zip(columns, r, strict=True)) for r in found]
    assert [(Path(r["page"]).name, r["field_path"]) for r in listed] == [("invoice-2.pdf#page=1", "total")]

    columns, found = queries.run(str(out), "grounded-by-field", run_id="inv")
    share = {r[columns.index("field")]: r for r in found}
    assert share["total"][columns.index("grounded_share")] == pytest.approx(2 / 3, abs=1e-4)  # one made up of three
    assert share["line_items[].amount"][columns.index("values_checked")] == sum(len(d.answer["line_items"])
                                                                                for d in invoices)

    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("pagemill", uri=f"sqlite:///{out / 'catalog.db'}")
    committed = catalog.load_table("pagemill.evidence").scan().to_arrow()
    committed = committed.select(tables.EVIDENCE.names).cast(tables.EVIDENCE).to_pylist()
    shown = [e for e in evidence if e["run_id"] == "inv"]

    def key(r: dict) -> tuple:
        return tuple(r[k] for k in TABLE_KEYS["evidence"])

    assert sorted(map(key, committed)) == sorted(map(key, shown))
    assert {key(r): r["grounded"] for r in committed} == {key(r): r["grounded"] for r in shown}


def _leaves(answer: Any) -> list:
    """The answer's values that are not null or blank (the made documents' answers hold no booleans)."""
    if isinstance(answer, dict):
        return [v for item in answer.values() for v in _leaves(item)]
    if isinstance(answer, list):
        return [v for item in answer for v in _leaves(item)]
    return [] if answer is None or (isinstance(answer, str) and not answer.strip()) else [answer]
