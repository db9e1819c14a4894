"""The writer's pure parts: progress lines, and atomic Parquet files per bundle."""
from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow.parquet as pq

from schemas import tables
from transforms.write import clear_run, compact_run, partition, progress_line, run_files, run_tenants, write_rows


def test_progress_line_has_totals_rate_and_eta() -> None:
    assert progress_line(3, 10, 40, 120, 20.0) == "3/10 documents, 40/120 pages, 2.0 pages/s, ETA 40 s"
    assert progress_line(10, 10, 120, 120, 60.0) == "10/10 documents, 120/120 pages, 2.0 pages/s"
    assert "ETA" not in progress_line(0, 5, 0, 50, 1.0)  # no rate yet: no guess


def test_write_rows_leaves_no_partial_file(tmp_path: Path) -> None:
    folder = tmp_path / "documents" / "run_id=r"
    path = write_rows(str(folder), tables.DOCUMENTS, [{"run_id": "r", "source_uri": "a", "outcome": "rejected"}])
    assert Path(path).exists() and path.endswith(".parquet")
    assert [p.name for p in folder.iterdir()] == [Path(path).name]  # the .inprogress name is gone
    assert pq.read_table(path).schema.equals(tables.DOCUMENTS)


def test_compact_run_keeps_the_latest_row_per_key(tmp_path: Path) -> None:
    out = str(tmp_path)
    early, late = dt.datetime(2026, 1, 1, tzinfo=dt.UTC), dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    folder = partition(out, "documents", "t", "r")
    row = {"run_id": "r", "tenant": "t"}
    write_rows(folder, tables.DOCUMENTS, [{**row, "source_uri": "a", "outcome": "failed", "created_at": early},
                                          {**row, "source_uri": "b", "outcome": "rejected", "created_at": early}])
    write_rows(folder, tables.DOCUMENTS, [{**row, "source_uri": "a", "outcome": "extracted", "created_at": late}])
    assert compact_run(out, "t", "r") == {"documents": 2}
    (only,) = run_files(out, "documents", "t", "r")
    rows = {r["source_uri"]: r["outcome"] for r in pq.read_table(only).to_pylist()}
    assert rows == {"a": "extracted", "b": "rejected"}


def test_compaction_keeps_the_row_that_did_the_work_over_a_later_cached_copy(tmp_path: Path) -> None:
    early, late = dt.datetime(2026, 1, 1, tzinfo=dt.UTC), dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    folder = partition(str(tmp_path), "ledger", "t", "r")
    key = {"run_id": "r", "tenant": "t", "doc_sha256": "d", "page_index": 0}
    write_rows(folder, tables.LEDGER, [{**key, "route": "model", "cost_usd": 0.5, "created_at": early}])
    write_rows(folder, tables.LEDGER, [{**key, "route": "cache", "cost_usd": 0.0, "created_at": late}])
    compact_run(str(tmp_path), "t", "r")
    (only,) = run_files(str(tmp_path), "ledger", "t", "r")
    assert [(r["route"], r["cost_usd"]) for r in pq.read_table(only).to_pylist()] == [("model", 0.5)]


def test_partitions_keep_tenants_apart(tmp_path: Path) -> None:
    """Two tenants with one run id: each sees, compacts and clears its own partition only."""
    out = str(tmp_path)
    assert partition(out, "pages", "acme", "r1") == str(tmp_path / "pages" / "tenant=acme" / "run_id=r1")
    for tenant in ("acme", "globex"):
        for outcome in ("failed", "extracted"):  # two files each: compaction has work to do
            write_rows(partition(out, "documents", tenant, "r1"), tables.DOCUMENTS,
                       [{"run_id": "r1", "tenant": tenant, "source_uri": "a", "outcome": outcome}])
    assert run_tenants(out, "r1") == {"acme", "globex"} and run_tenants(out, "r2") == set()
    globex = run_files(out, "documents", "globex", "r1")
    assert len(globex) == 2 and all("/tenant=globex/" in f for f in globex)
    assert compact_run(out, "acme", "r1") == {"documents": 1}
    assert len(run_files(out, "documents", "acme", "r1")) == 1
    assert run_files(out, "documents", "globex", "r1") == globex  # untouched
    assert clear_run(out, "acme", "r1") == 1
    assert run_files(out, "documents", "acme", "r1") == [] and run_files(out, "documents", "globex", "r1") == globex
