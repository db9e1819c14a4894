"""One row per key in a run's raw part files: assert_one_row_per_key.
Moved from tests/pipelines/test_kill_resume.py, which other test files imported."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

PAGE_KEY = ("run_id", "doc_sha256", "page_index")


def raw_rows(output: Path, table: str, run_id: str) -> list[dict]:
    """Every row of every finished file of the run (any partitions above run_id=), duplicates included."""
    rows: list[dict] = []
    for path in sorted((output / table).rglob(f"run_id={run_id}/*.parquet")):
        try:
            rows += pq.read_table(path).to_pylist()
        except FileNotFoundError:  # compacted away between the listing and the read
            continue
    return rows


def assert_one_row_per_key(output: Path, run_id: str, listed: int, pages: int) -> None:
    documents = raw_rows(output, "documents", run_id)
    assert len(documents) == listed
    assert Counter(d["source_uri"] for d in documents).most_common(1)[0][1] == 1
    for table in ("pages", "ledger"):
        rows = raw_rows(output, table, run_id)
        twice = [k for k, n in Counter(tuple(r[c] for c in PAGE_KEY) for r in rows).items() if n > 1]
        assert twice == [], f"{table}: {len(twice)} keys with two rows"
        assert len(rows) == pages, table
