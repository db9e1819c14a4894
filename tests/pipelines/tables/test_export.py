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
from pipelines.tables import export as export_module
from tests.support import planted
from tests.support.planted import BAD_INVOICE, GOOD_INVOICE, page

INVOICE_SCHEMA = json.loads((resources.files("schemas.extraction") / "invoice.json").read_text(encoding="utf-8"))
BIDI_FORMULA = "=HYPERLINK(\"http://x.invalid\")\u2066"
# By hand from schemas/extraction/invoice.json (strings, two ISO-date patterns, numbers, an array of objects),
# as Arrow types: what a notebook or a BI tool sees in the file.
ITEM = pa.struct([("description", pa.string()), ("quantity", pa.float64()), ("unit_price", pa.float64()),
                  ("amount", pa.float64())])
BOX = pa.struct([("x0", pa.float64()), ("y0", pa.float64()), ("x1", pa.float64()), ("y1", pa.float64())])
INVOICE_ARROW = pa.schema([
    ("tenant", pa.string()), ("run_id", pa.string()), ("doc_sha256", pa.string()), ("source_uri", pa.string()),
    ("page_index", pa.int64()), ("extracted_at", pa.timestamp("us", tz="Etc/UTC")),
    ("vendor_name", pa.string()), ("invoice_number", pa.string()), ("issue_date", pa.date32()),
    ("due_date", pa.date32()), ("currency", pa.string()), ("subtotal", pa.float64()), ("tax", pa.float64()),
    ("total", pa.float64()), ("line_items", pa.list_(ITEM)), ("unfit_columns", pa.list_(pa.string())),
    ("unfit_values", pa.int64()),
    # The evidence of each top-level text, date and number: found on its page, and its box there.
    *[(f"{field}{suffix}", kind) for field in ("vendor_name", "invoice_number", "issue_date", "due_date", "currency",
                                               "subtotal", "tax", "total")
      for suffix, kind in (("_grounded", pa.bool_()), ("_box", BOX))]])


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
    assert code == 2 and "inside the output root" in err and not inside.exists()
    with pytest.raises(SystemExit):
        cli.main(["export", "--output", str(output), "--schema", "invoice", "--to", str(target), "--format", "xlsx"])


def _tables_and_manifests(output: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in output.rglob("*") if p.is_file()}


def test_a_symlink_into_the_output_root_is_refused(output: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Fails before the fix: `--to` was compared as written, so a link (to the file's folder, or the file itself)
    that leads into a table's partition wrote a Parquet file there, read from then on as that table's rows."""
    planted.write_manifest(output, "r1", "invoice")
    before = _tables_and_manifests(output)
    partition = output / "pages" / "tenant=default" / "run_id=r1"
    (tmp_path / "exports").symlink_to(partition)
    (tmp_path / "invoice.parquet").symlink_to(partition / "part-export.parquet")
    for to in (tmp_path / "exports" / "invoice.parquet", tmp_path / "invoice.parquet"):
        code, _, err = export(capsys, "--output", str(output), "--schema", "invoice", "--to", str(to))
        assert code == 2, to
        assert f"resolves to {partition}" in err and "inside the output root" in err and "Traceback" not in err
    assert _tables_and_manifests(output) == before  # nothing written, nothing replaced
    code, _, _ = export(capsys, "--output", str(output), "--schema", "invoice", "--to", str(tmp_path / "x.parquet"))
    assert code == 0 and pq.read_table(tmp_path / "x.parquet").num_rows == 2  # outside the root: as before


@pytest.mark.parametrize("under", ["runs/tenant=default/r1.json", "listings/tenant=default/run_id=r1/x.csv",
                                   "exports/invoice.parquet"])
def test_nothing_under_the_output_root(output: Path, capsys: pytest.CaptureFixture[str], under: str) -> None:
    """Fails before the fix for runs/ and listings/ (only the three tables' folders were guarded): an export over
    a manifest broke every later `pagemill sql` of the root."""
    planted.write_manifest(output, "r1", "invoice")
    before = _tables_and_manifests(output)
    code, _, err = export(capsys, "--output", str(output), "--schema", "invoice", "--to", str(output / under))
    assert code == 2 and "inside the output root" in err
    assert _tables_and_manifests(output) == before
    assert cli.main(["sql", "--output", str(output), "SELECT count(*) FROM runs"]) == 0


def test_tenant_exports_only_that_tenants_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--tenant` selects rows, it is not only checked as a name: acme's export holds acme's two invoices and
    none of globex's (globex also has a run `r1`, so a filter on the run id alone would let its page through)."""
    out = tmp_path / "out"
    planted.write_pages(out, [page(1, GOOD_INVOICE, schema=INVOICE_SCHEMA, tenant="acme"),
                              page(2, BAD_INVOICE, schema=INVOICE_SCHEMA, tenant="acme"),
                              page(3, {**GOOD_INVOICE, "vendor_name": "Globex"}, schema=INVOICE_SCHEMA,
                                   tenant="globex")])
    for tenant, docs in (("acme", ["d1", "d2"]), ("globex", ["d3"]), (None, ["d1", "d2", "d3"])):
        target = tmp_path / f"{tenant}.csv"
        code, _, _ = export(capsys, "--output", str(out), "--schema", "invoice", "--to", str(target),
                            *(["--tenant", tenant] if tenant else []))
        assert code == 0
        rows = list(csv.DictReader(io.StringIO(target.read_text(encoding="utf-8"))))
        assert sorted(r["doc_sha256"] for r in rows) == docs, tenant
        assert {r["tenant"] for r in rows} == ({tenant} if tenant else {"acme", "globex"})


@pytest.mark.parametrize("output, to, inside", [
    ("s3://b/out", "s3://b/out/runs/tenant=t/r.json", True), ("s3://b/out/", "s3://b/out", True),
    ("s3://b/out", "s3://b/out2/x.parquet", False), ("s3://b/out", "s3://c/out/x.parquet", False),
    ("out", "file://{cwd}/out/x.csv", True), ("out", "{cwd}/elsewhere/../out/listings/x", True),
    ("file://{cwd}/out", "./out", True), ("out", "outside/x.csv", False), ("out", "s3://out/x.csv", False)])
def test_target_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: str, to: str, inside: bool) -> None:
    monkeypatch.chdir(tmp_path)
    problem = export_module.target_problem(output.format(cwd=tmp_path), to.format(cwd=tmp_path))
    assert (problem is not None) == inside, problem
