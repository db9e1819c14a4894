"""The writer's pure parts: progress lines, and atomic Parquet files per bundle."""
from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow.parquet as pq

from schemas import tables
from transforms.write import compact_run, progress_line, run_files, write_rows


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
    folder = str(tmp_path / "documents" / "run_id=r")
    write_rows(folder, tables.DOCUMENTS, [{"run_id": "r", "source_uri": "a", "outcome": "failed", "created_at": early},
                                          {"run_id": "r", "source_uri": "b", "outcome": "rejected",
                                           "created_at": early}])
    write_rows(folder, tables.DOCUMENTS, [{"run_id": "r", "source_uri": "a", "outcome": "extracted",
                                           "created_at": late}])
    assert compact_run(out, "r") == {"documents": 2}
    (only,) = run_files(out, "documents", "r")
    rows = {r["source_uri"]: r["outcome"] for r in pq.read_table(only).to_pylist()}
    assert rows == {"a": "extracted", "b": "rejected"}


def test_compaction_keeps_the_row_that_did_the_work_over_a_later_cached_copy(tmp_path: Path) -> None:
    early, late = dt.datetime(2026, 1, 1, tzinfo=dt.UTC), dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    folder = str(tmp_path / "ledger" / "run_id=r")
    key = {"run_id": "r", "doc_sha256": "d", "page_index": 0}
    write_rows(folder, tables.LEDGER, [{**key, "route": "model", "cost_usd": 0.5, "created_at": early}])
    write_rows(folder, tables.LEDGER, [{**key, "route": "cache", "cost_usd": 0.0, "created_at": late}])
    compact_run(str(tmp_path), "r")
    (only,) = run_files(str(tmp_path), "ledger", "r")
    assert [(r["route"], r["cost_usd"]) for r in pq.read_table(only).to_pylist()] == [("model", 0.5)]
