"""`pagemill export` and `pipelines.read`: a typed view to Parquet (read back with plain pyarrow: the same
types) or CSV (nested values as JSON, formulas neutralised, values otherwise as they are)."""
from __future__ import annotations

import csv
import datetime as dt
import io
import json
from importlib import resources
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pipelines
from pipelines import cli
from tests.pipelines import planted
from tests.pipelines.planted import BAD_INVOICE, GOOD_INVOICE, page

INVOICE_SCHEMA = json.loads((resources.files("schemas.extraction") / "invoice.json").read_text(encoding="utf-8"))
BIDI_FORMULA = "=HYPERLINK(\"http://x.invalid\")\u2066"
# By hand from schemas/extraction/invoice.json (strings, two ISO-date patterns, numbers, an array of objects),
# as Arrow types: what a notebook or a BI tool sees in the file.
ITEM = pa.struct([("description", pa.string()), ("quantity", pa.float64()), ("unit_price", pa.float64()),
                  ("amount", pa.float64())])
INVOICE_ARROW = pa.schema([
    ("tenant", pa.string()), ("run_id", pa.string()), ("doc_sha256", pa.string()), ("source_uri", pa.string()),
    ("page_index", pa.int64()), ("extracted_at", pa.timestamp("us", tz="Etc/UTC")),
    ("vendor_name", pa.string()), ("invoice_number", pa.string()), ("issue_date", pa.date32()),
    ("due_date", pa.date32()), ("currency", pa.string()), ("subtotal", pa.float64()), ("tax", pa.float64()),
    ("total", pa.float64()), ("line_items", pa.list_(ITEM)), ("unfit_columns", pa.list_(pa.string())),
    ("unfit_values", pa.int64())])


@pytest.fixture
def output(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    planted.write_pages(out, [page(1, GOOD_INVOICE, schema=INVOICE_SCHEMA),
                              page(2, {**BAD_INVOICE, "vendor_name": BIDI_FORMULA}, schema=INVOICE_SCHEMA)])
    return out


def export(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main(["export", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_parquet_round_trip_keeps_the_types(output: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "exports" / "invoice.parquet"
    code, out, _ = export(capsys, "--output", str(output), "--schema", "invoice", "--to", str(target))
    assert code == 0 and "2 rows of invoice" in out
    table = pq.read_table(target)  # plain pyarrow, no pagemill
    assert table.schema.remove_metadata() == INVOICE_ARROW
    rows = sorted(table.to_pylist(), key=lambda r: r["doc_sha256"])
    assert rows[0]["issue_date"] == dt.date(2026, 11, 3) and rows[0]["total"] == 1717.44
    assert rows[0]["line_items"] == [
        {"description": "Posters", "quantity": 100.0, "unit_price": 12.5, "amount": 1250.0},
        {"description": "Delivery", "quantity": 1.0, "unit_price": 181.2, "amount": 181.2}]
    assert rows[1]["vendor_name"] == BIDI_FORMULA  # a file holds the value as it is
    assert (rows[1]["total"], rows[1]["unfit_columns"], rows[1]["unfit_values"]) == (
        None, ["issue_date", "total", "line_items"], 3)


def test_csv_export(output: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "items.csv"
    code, _, _ = export(capsys, "--output", str(output), "--schema", "invoice_line_items", "--to", str(target))
    assert code == 0
    items = list(csv.DictReader(io.StringIO(target.read_text(encoding="utf-8"))))
    assert sorted((r["doc_sha256"], r["item_index"], r["description"], r["quantity"]) for r in items) == [
        ("d1", "0", "Posters", "100.0"), ("d1", "1", "Delivery", "1.0"), ("d2", "0", "Paper", "")]
    target = tmp_path / "invoice.txt"
    code, _, _ = export(capsys, "--output", str(output), "--schema", "invoice", "--to", str(target), "--format", "csv")
    assert code == 0
    rows = sorted(csv.DictReader(io.StringIO(target.read_text(encoding="utf-8"))), key=lambda r: r["doc_sha256"])
    assert rows[1]["vendor_name"] == "'" + BIDI_FORMULA  # a formula neutralised; the character kept
    assert json.loads(rows[0]["line_items"])[1] == {"description": "Delivery", "quantity": 1.0, "unit_price": 181.2,
                                                    "amount": 181.2}
    assert rows[0]["issue_date"] == "2026-11-03"


def test_read_for_notebooks(output: Path) -> None:
    table = pipelines.read(str(output), "invoice")
    assert table.schema == INVOICE_ARROW and table.num_rows == 2
    assert pipelines.read(str(output), "invoice_line_items").num_rows == 3
    with pytest.raises(ValueError, match="no typed view 'pages'"):
        pipelines.read(str(output), "pages")  # typed views only


def test_bad_requests(output: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "x.parquet"
    code, _, err = export(capsys, "--output", str(output), "--schema", 'invoice"; --', "--to", str(target))
    assert code == 2 and "no typed view" in err and "invoice_line_items" in err and not target.exists()
    code, _, err = export(capsys, "--output", str(output), "--schema", "invoice", "--to", str(target),
                          "--tenant", "../x")
    assert code == 2 and not target.exists()
    inside = output / "pages" / "tenant=default" / "run_id=r1" / "part-x.parquet"
    code, _, err = export(capsys, "--output", str(output), "--schema", "invoice", "--to", str(inside))
    assert code == 2 and "inside the pages table" in err and not inside.exists()
    with pytest.raises(SystemExit):
        cli.main(["export", "--output", str(output), "--schema", "invoice", "--to", str(target), "--format", "xlsx"])
