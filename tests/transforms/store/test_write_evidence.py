"""The `evidence` table's rows are written by the pages writer (transforms/store/write.py WriteTables): several rows a
page, flushed before the page's ledger and pages rows, so that a page on disk always has its evidence there."""
from __future__ import annotations

import datetime as dt
from pathlib import Path

import apache_beam as beam
import pyarrow.parquet as pq
import pytest
from apache_beam.io.filesystems import FileSystems

from schemas import tables
from schemas.evidence import EvidenceRow
from schemas.records import PageRow
from transforms.store.write import FlushPolicy, WriteTables

RUN = {"run_id": "r", "tenant": "t", "created_at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC)}


def page(i: int, values: int) -> PageRow:
    evidence = tuple(EvidenceRow(f"items[{k}].amount", str(k), "text_layer", 1.0, True, quote=str(k),
                                 box=(0.1, 0.2, 0.3, 0.4)) for k in range(values))
    return PageRow(f"d{i}", f"s3://b/{i}.pdf", 0, "ok", schema_id="invoice", evidence=evidence,
                   evidence_values=values, ungrounded_values=0)


def rows(folder: Path) -> list[dict]:
    return [r for f in sorted(folder.rglob("*.parquet")) for r in pq.read_table(f).to_pylist()]


def test_each_page_s_evidence_rows_reach_disk_before_its_ledger_and_pages_rows(tmp_path: Path, monkeypatch) -> None:
    order: list[str] = []
    create = FileSystems.create

    def recording(path: str, *args, **kwargs):
        order.append(Path(path).parts[-4])  # <output>/<table>/tenant=t/run_id=r/<file>
        return create(path, *args, **kwargs)

    monkeypatch.setattr(FileSystems, "create", recording)
    with beam.Pipeline() as p:
        docs = p | "Docs" >> beam.Create([])
        pages = p | "Pages" >> beam.Create([page(0, 3), page(1, 0), page(2, 2)])
        _ = docs | WriteTables(str(tmp_path), RUN, pages, FlushPolicy(rows=1, seconds=0))
    # One flush per page (rows=1): evidence (when the page has any), then ledger, then pages.
    assert [t for t in order if t != "documents"] == ["evidence", "ledger", "pages", "ledger", "pages",
                                                       "evidence", "ledger", "pages"]
    evidence = rows(tmp_path / "evidence")
    assert sorted((r["doc_sha256"], r["field_path"]) for r in evidence) == [
        ("d0", "items[0].amount"), ("d0", "items[1].amount"), ("d0", "items[2].amount"),
        ("d2", "items[0].amount"), ("d2", "items[1].amount")]
    first = next(r for r in evidence if r["doc_sha256"] == "d0" and r["field_path"] == "items[1].amount")
    assert {k: first[k] for k in ("tenant", "run_id", "source_uri", "page_index", "status", "schema_id", "value",
                                  "quote", "method", "score", "grounded")} == {
        "tenant": "t", "run_id": "r", "source_uri": "s3://b/0.pdf", "page_index": 0, "status": "ok",
        "schema_id": "invoice", "value": "1", "quote": "1", "method": "text_layer", "score": 1.0, "grounded": True}
    assert (first["x0"], first["y0"], first["x1"], first["y1"]) == pytest.approx((0.1, 0.2, 0.3, 0.4))
    pages_rows = {r["doc_sha256"]: r for r in rows(tmp_path / "pages")}
    assert {d: r["evidence_values"] for d, r in pages_rows.items()} == {"d0": 3, "d1": 0, "d2": 2}
    assert set(pages_rows["d0"]) == set(tables.PAGES.names)  # the evidence itself is no `pages` column
