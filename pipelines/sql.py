"""`pagemill sql`: DuckDB views `documents`, `pages`, `ledger` over every run under an output root."""
from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from schemas import tables


def _table_glob(output: str, table: str) -> str:
    return f"{output.rstrip('/')}/{table}/run_id=*/*.parquet"


def connect(output: str) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with one view per table. A table with no files yet is an empty view of
    the right shape, so queries work before the first run and on a run with no pages."""
    con = duckdb.connect()
    for table in tables.TABLES:
        pattern = _table_glob(output, table)
        if any(Path(output).glob(f"{table}/run_id=*/*.parquet")):
            con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet('{_quote(pattern)}', "
                        "union_by_name = true, hive_partitioning = false)")
        else:
            empty = pa.Table.from_batches([], schema=tables.SCHEMAS[table])
            con.register(f"_{table}_empty", empty)
            con.execute(f"CREATE VIEW {table} AS SELECT * FROM _{table}_empty")
    return con


def _quote(text: str) -> str:
    return text.replace("'", "''")


def query(output: str, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    con = connect(output)
    try:
        rel = con.sql(sql)
        if rel is None:
            return [], []
        return list(rel.columns), rel.fetchall()
    finally:
        con.close()


def render(columns: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str) -> str:
    if fmt == "json":
        return json.dumps([dict(zip(columns, r, strict=True)) for r in rows], default=str, indent=1)
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(rows)
        return buf.getvalue().rstrip("\n")
    cells = [[_cell(v) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = [" | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)),
             "-+-".join("-" * w for w in widths)]
    lines += [" | ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    lines.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    text = "NULL" if value is None else str(value)
    return text if len(text) <= 80 else text[:77] + "..."
