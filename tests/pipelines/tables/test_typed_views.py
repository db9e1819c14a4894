"""Typed views (`pagemill sql "... FROM invoice"`): one view per extraction schema with SQL types from its JSON
Schema, values that do not fit as NULL and counted, an item view per array, user schemas from the manifests.
Output roots are planted with the real writer (tests/support/planted.py); expected types are written by
hand from schemas/extraction/invoice.json, never computed by the code under test."""
from __future__ import annotations

import datetime as dt
import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from pipelines import cli
from pipelines.tables import queries
from tests.support import planted
from tests.support.planted import BAD_INVOICE, GOOD_INVOICE, page
from tests.support.typed_views import BOX, DESCRIBE_INVOICE, KEYS

INVOICE_SCHEMA = json.loads((resources.files("schemas.extraction") / "invoice.json").read_text(encoding="utf-8"))
RECEIPT_SCHEMA = json.loads((resources.files("schemas.extraction") / "receipt.json").read_text(encoding="utf-8"))


def sql(capsys: pytest.CaptureFixture[str], output: Path, query: str | None, *flags: str) -> list[dict[str, Any]]:
    """`pagemill sql --format json` of a query, or (None) of the named query in `flags`."""
    capsys.readouterr()
    assert cli.main(["sql", "--output", str(output), "--format", "json", *flags, *([query] if query else [])]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def invoices(tmp_path: Path) -> Path:
    """Run r1: a good invoice, one with three unfit values, an invoice that failed validation and a cached
    page (neither is an ok page), a receipt; run r2: the good invoice's page extracted again, an hour later."""
    out = tmp_path / "out"
    planted.write_pages(out, [
        page(1, GOOD_INVOICE, schema=INVOICE_SCHEMA),
        page(2, BAD_INVOICE, schema=INVOICE_SCHEMA),
        page(3, {"vendor_name": "Invalid Ltd", "total": 5}, status="invalid", schema=INVOICE_SCHEMA),
        page(4, GOOD_INVOICE, status="cached", schema=INVOICE_SCHEMA),
        page(5, {"merchant": "Corner Shop", "date": "2026-11-04", "address": None, "currency": "GBP", "total": 4.5,
                 "items": []}, schema_id="receipt", schema=RECEIPT_SCHEMA),
        page(1, {**GOOD_INVOICE, "total": 1800.0}, run_id="r2", schema=INVOICE_SCHEMA, minutes=60)])
    return out


def test_describe_invoice_shows_the_types_its_schema_implies(invoices: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    described = sql(capsys, invoices, "DESCRIBE invoice")
    assert [(r["column_name"], r["column_type"]) for r in described] == DESCRIBE_INVOICE


def test_an_empty_root_has_the_shipped_views_with_their_types(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    described = sql(capsys, tmp_path / "nothing-yet", "DESCRIBE invoice")
    assert [(r["column_name"], r["column_type"]) for r in described] == DESCRIBE_INVOICE
    assert sql(capsys, tmp_path / "nothing-yet", "SELECT count(*) AS n FROM receipt_items") == [{"n": 0}]


def test_typed_values_and_values_that_do_not_fit(invoices: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = sql(capsys, invoices, "SELECT run_id, vendor_name, total, issue_date, due_date, unfit_columns, unfit_values "
                                 "FROM invoice ORDER BY run_id, vendor_name")
    assert rows == [
        {"run_id": "r1", "vendor_name": "Contoso Print & Co", "total": 1717.44, "issue_date": "2026-11-03",
         "due_date": "2026-12-03", "unfit_columns": [], "unfit_values": 0},
        {"run_id": "r1", "vendor_name": "Fabrikam", "total": None, "issue_date": None, "due_date": None,
         "unfit_columns": ["issue_date", "total", "line_items"], "unfit_values": 3},  # due_date null: not unfit
        {"run_id": "r2", "vendor_name": "Contoso Print & Co", "total": 1800.0, "issue_date": "2026-11-03",
         "due_date": "2026-12-03", "unfit_columns": [], "unfit_values": 0}]
    typed = sql(capsys, invoices, "SELECT typeof(total) AS t, typeof(issue_date) AS d, sum(total) AS s FROM invoice "
                                  "GROUP BY ALL")
    assert typed == [{"t": "DOUBLE", "d": "DATE", "s": 1717.44 + 1800.0}]
    unfit = sql(capsys, invoices, 'SELECT view, "column", doc_sha256 FROM typed_unfit ORDER BY 2')
    assert unfit == [{"view": "invoice", "column": c, "doc_sha256": "d2"}
                     for c in ("issue_date", "line_items", "total")]
    named = sql(capsys, invoices, None, "--query", "unfit-values")
    assert [(r["view"], r["column"], r["pages"], r["example"], r["expected"]) for r in named] == [
        ("invoice", "issue_date", 1, "s3://bucket/doc-2.pdf#page=1", "DATE"),
        ("invoice", "line_items", 1, "s3://bucket/doc-2.pdf#page=1",
         "STRUCT(description VARCHAR, quantity DOUBLE, unit_price DOUBLE, amount DOUBLE)[]"),
        ("invoice", "total", 1, "s3://bucket/doc-2.pdf#page=1", "DOUBLE")]


def test_a_list_or_an_object_of_the_wrong_shape_is_one_unfit_value(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    planted.write_pages(out, [page(1, {**GOOD_INVOICE, "line_items": "see attached"}, schema=INVOICE_SCHEMA),
                              page(2, {**GOOD_INVOICE, "line_items": ["Posters", GOOD_INVOICE["line_items"][1]]},
                                   schema=INVOICE_SCHEMA),
                              page(3, '["not", "an", "object"]', schema=INVOICE_SCHEMA)])
    rows = sql(capsys, out, "SELECT doc_sha256, len(line_items) AS items, unfit_columns, unfit_values "
                            "FROM invoice ORDER BY 1")
    assert rows == [{"doc_sha256": "d1", "items": None, "unfit_columns": ["line_items"], "unfit_values": 1},
                    {"doc_sha256": "d2", "items": 2, "unfit_columns": ["line_items"], "unfit_values": 1},
                    {"doc_sha256": "d3", "items": None, "unfit_columns": ["extraction"], "unfit_values": 1}]


def test_line_items_have_one_row_per_item(invoices: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = sql(capsys, invoices, "SELECT run_id, doc_sha256, item_index, description, quantity, amount "
                                 "FROM invoice_line_items ORDER BY run_id, doc_sha256, item_index")
    assert [(r["run_id"], r["doc_sha256"], r["item_index"], r["description"], r["quantity"], r["amount"])
            for r in rows] == [("r1", "d1", 0, "Posters", 100.0, 1250.0), ("r1", "d1", 1, "Delivery", 1.0, 181.2),
                               ("r1", "d2", 0, "Paper", None, 12.3),  # "two" does not fit DOUBLE
                               ("r2", "d1", 0, "Posters", 100.0, 1250.0), ("r2", "d1", 1, "Delivery", 1.0, 181.2)]


def test_spend_by_vendor_reads_the_typed_views(invoices: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # By hand: Contoso's page d1 was extracted by r1 (1717.44) and again by r2 (1800.0): once, the latest;
    # Fabrikam's total did not fit (NULL); the invalid and cached pages are not ok pages; one receipt.
    rows = sql(capsys, invoices, None, "--query", "spend-by-vendor")
    assert [(r["kind"], r["vendor"], r["currency"], r["pages"], r["total"], r["pages_without_total"],
             r["first_date"], r["pages_with_unfit_values"]) for r in rows] == [
        ("invoice", "Contoso Print & Co", "GBP", 1, 1800.0, 0, "2026-11-03", 0),
        ("receipt", "Corner Shop", "GBP", 1, 4.5, 0, "2026-11-04", 0),
        ("invoice", "Fabrikam", "EUR", 1, None, 1, None, 1)]
    columns, one_run = queries.run(str(invoices), "spend-by-vendor", run_id="r1")  # r1 alone: its own answer
    assert [dict(zip(columns, r, strict=True))["total"] for r in one_run] == [1717.44, 4.5, None]


def test_a_user_schema_from_the_manifest_with_awkward_names(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    schema = {"type": "object", "required": ["Total", "total", 'x"; DROP VIEW pages; --', "choice", "meta"],
              "properties": {"Total": {"type": "number"}, "total": {"type": "integer"},
                             'x"; DROP VIEW pages; --': {"type": "string"},
                             "choice": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
                             "meta": {"type": "object"}, "": {"type": "string"}}}
    path = tmp_path / "schemas" / "my-schema v2'; --.json"
    path.parent.mkdir()
    path.write_text(json.dumps(schema))
    out = tmp_path / "out"
    value = {"Total": 1.5, "total": 7, 'x"; DROP VIEW pages; --': "text", "choice": 3, "meta": {"k": [1]}}
    planted.write_pages(out, [page(1, value, schema_id=path.stem, schema=schema)])
    planted.write_manifest(out, "r1", str(path))
    views = sql(capsys, out, "SELECT view, schema_id, note FROM typed_views WHERE unnests IS NULL ORDER BY view")
    assert {"view": "my_schema_v2_____", "schema_id": "my-schema v2'; --",
            "note": "property '': a name that is empty or has control characters is not a column"} in views
    columns = sql(capsys, out, 'SELECT "column", type, property, note FROM typed_columns '
                               "WHERE view = 'my_schema_v2_____' AND property IS NOT NULL")
    assert columns == [
        {"column": "Total", "type": "DOUBLE", "property": "Total", "note": None},
        {"column": "total_2", "type": "BIGINT", "property": "total", "note": None},  # DuckDB ignores case
        {"column": "x___DROP_VIEW_pages____", "type": "VARCHAR", "property": 'x"; DROP VIEW pages; --', "note": None},
        {"column": "choice", "type": "JSON", "property": "choice",
         "note": "choice: oneOf of several types, kept as JSON"},
        {"column": "meta", "type": "JSON", "property": "meta",
         "note": "meta: an object without properties (free-form), kept as JSON"}]
    rows = sql(capsys, out, 'SELECT "Total", total_2, x___DROP_VIEW_pages____ AS s, choice, meta, unfit_values '
                            "FROM my_schema_v2_____")
    assert rows == [{"Total": 1.5, "total_2": 7, "s": "text", "choice": "3", "meta": '{"k":[1]}', "unfit_values": 0}]
    assert sql(capsys, out, "SELECT count(*) AS n FROM pages") == [{"n": 1}]  # nothing was dropped


def test_two_versions_of_one_schema_get_the_union_of_columns(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    v1 = {"type": "object", "properties": {"amount": {"type": "integer"}, "payee": {"type": "string"}}}
    v2 = {"type": "object", "properties": {"amount": {"type": "number"}, "paid": {"type": "boolean"}}}
    out = tmp_path / "out"
    for version, schema in (("v1", v1), ("v2", v2)):
        (tmp_path / version).mkdir()
        (tmp_path / version / "acme.json").write_text(json.dumps(schema))
        planted.write_manifest(out, f"run-{version}", str(tmp_path / version / "acme.json"))
    planted.write_pages(out, [page(1, {"amount": 3, "payee": "Bob"}, schema_id="acme", schema=v1, run_id="run-v1"),
                              page(2, {"amount": 2.5, "paid": True}, schema_id="acme", schema=v2, run_id="run-v2")])
    described = sql(capsys, out, "DESCRIBE acme")
    assert [(r["column_name"], r["column_type"]) for r in described][len(KEYS):] == [
        ("amount", "DOUBLE"), ("payee", "VARCHAR"), ("paid", "BOOLEAN"), ("unfit_columns", "VARCHAR[]"),
        ("unfit_values", "BIGINT"), ("amount_grounded", "BOOLEAN"), ("amount_box", BOX), ("payee_grounded", "BOOLEAN"),
        ("payee_box", BOX)]  # integer in v1 and number in v2: DOUBLE holds both; a boolean is not looked for
    rows = sql(capsys, out, "SELECT run_id, amount, payee, paid FROM acme ORDER BY run_id")
    assert rows == [{"run_id": "run-v1", "amount": 3.0, "payee": "Bob", "paid": None},
                    {"run_id": "run-v2", "amount": 2.5, "payee": None, "paid": True}]
    (hashes,) = sql(capsys, out, "SELECT len(schema_hashes) AS n FROM typed_views WHERE view = 'acme'")
    assert hashes == {"n": 2}


def test_no_properties_or_no_schema_file_falls_back_to_json(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    free = {"type": "object"}
    (tmp_path / "free.json").write_text(json.dumps(free))
    out = tmp_path / "out"
    planted.write_manifest(out, "r1", str(tmp_path / "free.json"))
    planted.write_manifest(out, "r2", str(tmp_path / "moved-away.json"))
    planted.write_pages(out, [page(1, {"anything": [1, 2]}, schema_id="free", schema=free),
                              page(2, {"x": 1}, schema_id="moved-away", run_id="r2")])
    views = sql(capsys, out, "SELECT view, note FROM typed_views WHERE view IN ('free', 'moved_away') ORDER BY 1")
    assert views == [{"view": "free", "note": "the schema has no properties: the extraction as JSON"},
                     {"view": "moved_away", "note": "no schema file found: the extraction as JSON"}]
    rows = sql(capsys, out, "SELECT extraction, typeof(extraction) AS t FROM free UNION ALL "
                            "SELECT extraction, typeof(extraction) FROM moved_away ORDER BY 1")
    assert rows == [{"extraction": '{"anything": [1, 2]}', "t": "JSON"}, {"extraction": '{"x": 1}', "t": "JSON"}]


def test_tenant_restricts_the_typed_views(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    planted.write_pages(out, [page(1, GOOD_INVOICE, schema=INVOICE_SCHEMA, tenant="acme"),
                              page(2, BAD_INVOICE, schema=INVOICE_SCHEMA, tenant="globex")])
    assert sql(capsys, out, "SELECT tenant, vendor_name FROM invoice", "--tenant", "globex") == [
        {"tenant": "globex", "vendor_name": "Fabrikam"}]
    assert sql(capsys, out, "SELECT count(*) AS n FROM invoice_line_items", "--tenant", "acme") == [{"n": 2}]


def test_a_page_without_a_schema_hash_is_typed_with_the_schema_found(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    planted.write_pages(out, [{**page(1, GOOD_INVOICE), "schema_hash": None}])
    assert sql(capsys, out, "SELECT total, issue_date FROM invoice") == [{"total": 1717.44, "issue_date": "2026-11-03"}]


HOSTILE = "\u2066\u202eevil\u2069\u200b\x1b]0;pwned\x07\u061c"


def test_terminal_output_escapes_controls_and_bidi_in_every_format(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    planted.write_pages(out, [page(1, {**GOOD_INVOICE, "vendor_name": HOSTILE}, schema=INVOICE_SCHEMA)])
    shown = "\\u2066\\u202eevil\\u2069\\u200b\\x1b]0;pwned\\x07\\u061c"
    for fmt in ("csv", "table"):
        capsys.readouterr()
        query = 'SELECT vendor_name, line_items, 1 AS "\x1b[2Jname" FROM invoice'
        assert cli.main(["sql", "--output", str(out), "--format", fmt, query]) == 0
        printed = capsys.readouterr().out
        assert shown in printed and "\\x1b[2Jname" in printed, fmt
        assert not any(c in printed for c in "\u2066\u202e\u2069\u200b\x1b\x07\u061c"), fmt
        assert '"description": "Posters"' in printed or '""description"": ""Posters""' in printed  # lists as JSON
    assert sql(capsys, out, "SELECT vendor_name FROM invoice") == [{"vendor_name": HOSTILE}]  # json: the value intact


def test_extraction_dates_are_dates(invoices: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (row,) = sql(capsys, invoices, "SELECT due_date - issue_date AS days FROM invoice WHERE run_id = 'r2'")
    assert row == {"days": (dt.date(2026, 12, 3) - dt.date(2026, 11, 3)).days}
