"""The typed views' evidence columns: `<field>_grounded` and `<field>_box` of each top-level text, date and number,
read from the `evidence` row of that field path on the same page (its kept row). Roots are planted with the real
writer (tests/support/planted.py); the expected values are the planted rows, written here by hand."""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from pipelines import cli
from tests.support import planted
from tests.support.planted import GOOD_INVOICE, evidence, page

INVOICE_SCHEMA = json.loads((resources.files("schemas.extraction") / "invoice.json").read_text(encoding="utf-8"))
TOTAL_BOX = (0.61, 0.82, 0.74, 0.85)


def sql(capsys: pytest.CaptureFixture[str], output: Path, query: str) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert cli.main(["sql", "--output", str(output), "--format", "json", query]) == 0
    return json.loads(capsys.readouterr().out)


def box(b: tuple[float, float, float, float]) -> dict[str, float]:
    return dict(zip(("x0", "y0", "x1", "y1"), b, strict=True))


def test_each_page_gets_its_own_values_evidence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """d1: total found (with its box), vendor not found, a line item's amount found (no column of its own);
    d2: no evidence rows (an older run); d3 in run r2: the same field paths, the opposite answers."""
    out = tmp_path / "out"
    planted.write_pages(out, [page(1, GOOD_INVOICE, schema=INVOICE_SCHEMA),
                              page(2, GOOD_INVOICE, schema=INVOICE_SCHEMA),
                              page(3, GOOD_INVOICE, schema=INVOICE_SCHEMA, run_id="r2")])
    planted.write_evidence(out, [
        evidence(1, "total", True, TOTAL_BOX), evidence(1, "vendor_name", False),
        evidence(1, "line_items[0].amount", True, (0.1, 0.1, 0.2, 0.2)),
        evidence(3, "total", False, run_id="r2"), evidence(3, "vendor_name", True, (0.1, 0.05, 0.4, 0.08), run_id="r2"),
        evidence(3, "tax", None, run_id="r2")])  # not checked (no words): null, as the table says
    rows = sql(capsys, out, "SELECT doc_sha256 AS d, total_grounded, total_box, vendor_name_grounded, vendor_name_box, "
                            "tax_grounded, subtotal_grounded FROM invoice ORDER BY d")
    assert rows == [
        {"d": "d1", "total_grounded": True, "total_box": box(TOTAL_BOX), "vendor_name_grounded": False,
         "vendor_name_box": None, "tax_grounded": None, "subtotal_grounded": None},
        {"d": "d2", "total_grounded": None, "total_box": None, "vendor_name_grounded": None, "vendor_name_box": None,
         "tax_grounded": None, "subtotal_grounded": None},
        {"d": "d3", "total_grounded": False, "total_box": None, "vendor_name_grounded": True,
         "vendor_name_box": box((0.1, 0.05, 0.4, 0.08)), "tax_grounded": None, "subtotal_grounded": None}]
    assert sql(capsys, out, "SELECT count(*) AS n FROM invoice_line_items") == [{"n": 6}]  # the join adds no rows


def test_the_kept_evidence_row_of_a_field_is_the_one_shown(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A page answered twice in one run (a retry an hour later): the later attempt's rows are kept, for the page
    and for its evidence alike; a reused (`cached`) copy written later still gives way to a row that did the work."""
    out = tmp_path / "out"
    planted.write_pages(out, [page(1, GOOD_INVOICE, schema=INVOICE_SCHEMA),
                              page(1, GOOD_INVOICE, schema=INVOICE_SCHEMA, minutes=60)])
    planted.write_evidence(out, [evidence(1, "total", False), evidence(1, "total", True, TOTAL_BOX, minutes=60),
                                 evidence(1, "tax", True, (0.6, 0.7, 0.7, 0.72), minutes=60),
                                 evidence(1, "tax", False, status="cached", minutes=90)])
    assert sql(capsys, out, "SELECT total_grounded, total_box, tax_grounded FROM invoice") == [
        {"total_grounded": True, "total_box": box(TOTAL_BOX), "tax_grounded": True}]


def test_names_that_clash_booleans_and_json_get_no_evidence_columns_of_their_own(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A property already named `amount_grounded` keeps its name (the evidence column takes `_2`); a boolean is
    never looked for on a page and free-form JSON's values have their own paths: neither gets columns."""
    schema = {"type": "object", "properties": {"amount": {"type": "number"}, "amount_grounded": {"type": "string"},
                                               "paid": {"type": "boolean"}, "meta": {"type": "object"}}}
    path = tmp_path / "acme.json"
    path.write_text(json.dumps(schema))
    out = tmp_path / "out"
    planted.write_manifest(out, "r1", str(path))
    planted.write_pages(out, [page(1, {"amount": 3, "amount_grounded": "yes", "paid": True, "meta": {"k": "v"}},
                                   schema_id="acme", schema=schema)])
    planted.write_evidence(out, [evidence(1, "amount", True, TOTAL_BOX, schema_id="acme"),
                                 evidence(1, "amount_grounded", False, schema_id="acme"),
                                 evidence(1, "meta.k", True, TOTAL_BOX, schema_id="acme")])
    columns = [r["column_name"] for r in sql(capsys, out, "DESCRIBE acme")]
    assert columns[6:] == ["amount", "amount_grounded", "paid", "meta", "unfit_columns", "unfit_values",
                           "amount_grounded_2", "amount_box", "amount_grounded_grounded", "amount_grounded_box"]
    assert sql(capsys, out, "SELECT amount_grounded, amount_grounded_2, amount_box, amount_grounded_grounded "
                            "FROM acme") == [{"amount_grounded": "yes", "amount_grounded_2": True,
                                              "amount_box": box(TOTAL_BOX), "amount_grounded_grounded": False}]
    described = sql(capsys, out, "SELECT \"column\", property, note FROM typed_columns WHERE \"view\" = 'acme' "
                                 "AND \"column\" IN ('amount_grounded_2', 'amount_box')")
    assert [(r["column"], r["property"]) for r in described] == [("amount_grounded_2", None), ("amount_box", None)]
    assert all("evidence of 'amount'" in r["note"] for r in described)


def test_a_view_reads_only_its_own_schemas_evidence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One page key, two schemas' rows (a re-run with another schema would write such): the receipt's evidence of
    `total` is not the invoice's."""
    out = tmp_path / "out"
    planted.write_pages(out, [page(1, GOOD_INVOICE, schema=INVOICE_SCHEMA)])
    planted.write_evidence(out, [evidence(1, "currency", True, TOTAL_BOX, schema_id="receipt")])
    assert sql(capsys, out, "SELECT currency_grounded FROM invoice") == [{"currency_grounded": None}]
