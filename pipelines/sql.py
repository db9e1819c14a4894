"""`pagemill sql`: DuckDB views over every run under an output root, local or s3://."""
from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from pipelines.storage import StorageConfig, arrow_filesystem
from schemas import tables

# The latest row per key wins, so a run resumed under the same run id never shows a row twice.
TABLE_KEYS = {
    "documents": ("run_id", "source_uri"),
    "pages": ("run_id", "doc_sha256", "page_index"),
    "ledger": ("run_id", "doc_sha256", "page_index"),
}
RUNS = pa.schema([
    ("run_id", pa.string()), ("started_at", pa.string()), ("finished_at", pa.string()),
    ("wall_seconds", pa.float64()), ("tenant", pa.string()), ("documents", pa.int64()), ("pages", pa.int64()),
    ("model_calls", pa.int64()), ("cost_usd", pa.float64()), ("api_equivalent_usd", pa.float64()),
    ("manifest", pa.string()),
])


def table_files(fs: pafs.FileSystem, root: str, table: str) -> list[str]:
    """Finished Parquet files of one table (Beam's temporary folders are skipped)."""
    selector = pafs.FileSelector(f"{root}/{table}", allow_not_found=True, recursive=True)
    return sorted(i.path for i in fs.get_file_info(selector)
                  if i.type == pafs.FileType.File and i.path.endswith(".parquet") and "beam-temp" not in i.path)


def runs_table(fs: pafs.FileSystem, root: str) -> pa.Table:
    selector = pafs.FileSelector(f"{root}/runs", allow_not_found=True)
    records = []
    for info in fs.get_file_info(selector):
        if info.type != pafs.FileType.File or not info.path.endswith(".json"):
            continue
        with fs.open_input_stream(info.path) as handle:
            m = json.loads(handle.read())
        totals = m.get("totals", {})
        records.append({"run_id": m.get("run_id"), "started_at": m.get("started_at"),
                        "finished_at": m.get("finished_at"), "wall_seconds": m.get("wall_seconds"),
                        "tenant": m.get("options", {}).get("tenant"), "documents": m.get("documents"),
                        "pages": totals.get("pages"), "model_calls": totals.get("model_calls"),
                        "cost_usd": totals.get("cost_usd"), "api_equivalent_usd": totals.get("api_equivalent_usd"),
                        "manifest": json.dumps(m, sort_keys=True)})
    return pa.Table.from_pylist(records, schema=RUNS)


def connect(output: str, storage: StorageConfig | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with views `documents`, `pages`, `ledger` (latest row per key) and `runs`
    over every run under `output`, local or s3://. The tables are pyarrow datasets registered in
    DuckDB, which needs no httpfs extension. A table with no files yet is an empty view of the right
    shape, so queries work before the first run."""
    fs, root = arrow_filesystem(output, storage or StorageConfig())
    con = duckdb.connect()
    for table in tables.TABLES:
        schema = tables.SCHEMAS[table]
        files = table_files(fs, root, table)
        data = ds.dataset(files, schema=schema, filesystem=fs, format="parquet") if files \
            else pa.Table.from_batches([], schema=schema)
        con.register(f"{table}_all", data)
        keys = ", ".join(TABLE_KEYS[table])
        con.execute(f"CREATE VIEW {table} AS SELECT * FROM {table}_all "
                    f"QUALIFY row_number() OVER (PARTITION BY {keys} ORDER BY created_at DESC) = 1")
    con.register("runs", runs_table(fs, root))
    return con


def query(output: str, sql: str, storage: StorageConfig | None = None) -> tuple[list[str], list[tuple[Any, ...]]]:
    con = connect(output, storage)
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
