"""`pagemill run --evidence-quotes`: the served model (a real HTTP server on 127.0.0.1, tests/support/served_faults.py)
is asked for the sidecar schema (the invoice schema plus `_quotes`) and answers a born-digital invoice
(tests/support/grounded_docs.py) with its values and quotes: a normalised vendor name quoted as printed, the total
quoted as printed, a made-up quote for the tax (whose value is printed). The stored extraction holds no quotes; a
quote found on the page grounds its value where the page prints it (method `model_quote`), the made-up one does
not and flags the page; a value without a quote is looked for as before."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipelines import cli
from pipelines.tables import sql
from tests.support import grounded_docs
from tests.support.served_faults import Injector, completion, fault_server

FLAGS = ["--engine", "openai", "--model", "tiny", "--max-tokens", "512", "--progress-every-s", "0", "--workers", "1",
         "--concurrency", "1", "--nsfw-classifier", "none", "--schema", "invoice"]


class Quoting(Injector):
    """Answers every request with `answer`, and keeps each request's body."""

    def __init__(self, answer: dict[str, Any]) -> None:
        super().__init__()
        self.answer = answer

    def next(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, str], float, Any]:
        with self.lock:
            self.seen.append((0.0, body))
        return 200, {}, 0.0, completion(body, content=json.dumps(self.answer))


def test_a_quote_found_on_the_page_grounds_its_value_and_a_made_up_one_does_not(tmp_path: Path) -> None:
    doc = grounded_docs.invoice(0)
    printed_vendor = doc.answer["vendor_name"]
    answer = {**doc.answer, "vendor_name": "NORTHWIND TRADING COMPANY",  # normalised: not printed as such
              "_quotes": {"vendor_name": printed_vendor, "total": f"£{doc.answer['total']:,.2f}",
                          "tax": "VAT paid in full on 1 March"}}
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / doc.name).write_bytes(doc.data)
    out = tmp_path / "out"
    model = Quoting(answer)
    with fault_server(model) as url:
        code = cli.main(["run", "--input", str(folder), "--output", str(out), "--run-id", "q", "--endpoint", url,
                         "--evidence-quotes", *FLAGS])
    assert code == 0

    (body,) = [b for _, b in model.seen]
    asked = body["response_format"]["json_schema"]["schema"]
    assert "_quotes" in asked["properties"] and "_quotes" in asked["required"]  # the sidecar schema

    columns, values = sql.query(str(out), "SELECT status, extraction, flags, ungrounded_values FROM pages")
    (page,) = [dict(zip(columns, v, strict=True)) for v in values]
    assert page["status"] == "ok"
    assert json.loads(page["extraction"]) == {k: v for k, v in answer.items() if k != "_quotes"}  # no quotes kept
    assert "ungrounded_values" in page["flags"] and page["ungrounded_values"] == 1

    columns, values = sql.query(str(out), "SELECT field_path, method, grounded, quote, x0, y0, x1, y1 FROM evidence")
    rows = {v[0]: dict(zip(columns, v, strict=True)) for v in values}
    vendor, total, tax = rows["vendor_name"], rows["total"], rows["tax"]
    assert (vendor["method"], vendor["grounded"], vendor["quote"]) == ("model_quote", True, printed_vendor)
    assert (total["method"], total["grounded"]) == ("model_quote", True)
    for row, path in ((vendor, "vendor_name"), (total, "total")):
        box = (row["x0"], row["y0"], row["x1"], row["y1"])
        assert max(grounded_docs.iou(box, b) for b in doc.boxes[path]) >= 0.5, (path, box)
    assert (tax["method"], tax["grounded"], tax["x0"]) == ("model_quote", False, None)  # its value is printed
    assert (rows["invoice_number"]["method"], rows["invoice_number"]["grounded"]) == ("text_layer", True)


def test_a_schema_that_cannot_take_quotes_stops_the_run_before_it_starts(tmp_path: Path, capsys: Any) -> None:
    """Markdown output has no fields to quote; a user schema with its own `_quotes` would lose it: exit 2 and the
    reason, nothing written."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "x.png").write_bytes(b"not read")
    own = tmp_path / "own.json"
    taken = {"_quotes": {"type": "string", "pattern": "^[a-z]{0,5}$"}}
    own.write_text(json.dumps({"type": "object", "properties": taken}))
    for schema, why in (("markdown", "markdown output has no fields to quote"),
                        (str(own), "the schema has a property '_quotes', which model quotes would take")):
        capsys.readouterr()
        code = cli.main(["run", "--input", str(folder), "--output", str(tmp_path / "out"), "--evidence-quotes",
                         "--schema", schema, "--engine", "vllm", "--model", "tiny", "--workers", "1"])
        assert code == 2 and f"--evidence-quotes with --schema {schema}: {why}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.parquet"))
