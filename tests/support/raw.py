"""Raw rows of the output tables, read straight from the Parquet files (not through the SQL views, which
keep one row per key and so would hide a duplicate): what the exactly-one-row invariants are checked on."""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq


def raw_rows(output: Path | str, table: str, run_id: str | None = None,
             tenant: str | None = None) -> list[dict[str, Any]]:
    """Every row of every finished Parquet file of `table` (optionally one run and/or tenant)."""
    files = sorted(Path(output, table).rglob("*.parquet"))
    rows = [r for path in files for r in pq.read_table(path).to_pylist()]
    return [r for r in rows if (run_id is None or r["run_id"] == run_id) and (tenant is None or r["tenant"] == tenant)]


def one_row_per(rows: list[dict[str, Any]], *key: str) -> dict[Any, dict[str, Any]]:
    """Rows by key; fails naming the keys that have more than one row."""
    counts = Counter(tuple(r[k] for k in key) for r in rows)
    repeated = sorted((k, n) for k, n in counts.items() if n > 1)
    assert not repeated, f"keys with more than one raw row: {repeated[:10]}"
    return {(r[key[0]] if len(key) == 1 else tuple(r[k] for k in key)): r for r in rows}
