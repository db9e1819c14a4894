"""`pagemill sql`: DuckDB views over every run under an output root, local or s3://.

Read-only by construction: the tables are pyarrow datasets registered before DuckDB's file access is
switched off and its configuration locked, so a query can read the views and nothing else (no
`read_text`, no `COPY ... TO`, no `ATTACH`, no extensions). Values printed to a terminal come from
documents, so every format escapes what could drive the terminal (transforms/text_safety.py) and CSV also
neutralises spreadsheet formulas. Files (`pagemill export`) get the values as they are, formulas neutralised.
"""
from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from pipelines.config.storage import StorageConfig, arrow_filesystem
from pipelines.tables import typed_views
from schemas import kept_row, tables
from transforms.store import manifest_file
from transforms.store.catalog import ALLOW_HTTP_FLAG
from transforms.store.catalog import CatalogRefused as CatalogRefused
from transforms.store.duplicates import duplicate_keys_sql
from transforms.store.files import manifest_files, table_files
from transforms.text_safety import terminal_safe

# Cell text that a spreadsheet would run as a formula (OWASP's list: = + - @, and tab / CR before them).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
RUNS = pa.schema([
    ("run_id", pa.string()), ("started_at", pa.string()), ("finished_at", pa.string()),
    ("wall_seconds", pa.float64()), ("tenant", pa.string()), ("documents", pa.int64()), ("pages", pa.int64()),
    ("model_calls", pa.int64()), ("cost_usd", pa.float64()), ("api_equivalent_usd", pa.float64()),
    ("manifest", pa.string()),
])


def runs_table(fs: pafs.FileSystem, root: str, tenant: str | None = None) -> pa.Table:
    """One row per readable manifest; a malformed one is skipped with a warning (manifest_file.read)."""
    records = []
    for path, folder_tenant in manifest_files(fs, root, tenant):
        m = manifest_file.read(fs, path)
        if m is None:
            continue
        totals = m.get("totals") or {}
        records.append({"run_id": m.get("run_id"), "started_at": m.get("started_at"),
                        "finished_at": m.get("finished_at"), "wall_seconds": m.get("wall_seconds"),
                        "tenant": folder_tenant or (m.get("options") or {}).get("tenant"),
                        "documents": m.get("documents"), "pages": totals.get("pages"),
                        "model_calls": totals.get("model_calls"), "cost_usd": totals.get("cost_usd"),
                        "api_equivalent_usd": totals.get("api_equivalent_usd"), "legacy": folder_tenant is None,
                        "manifest": json.dumps(m, sort_keys=True)})
    # A run is (tenant, run id): an old-layout file gives way only to a new one of the same tenant and run.
    written = {(r["tenant"], r["run_id"]) for r in records if not r["legacy"]}
    records = [r for r in records if not (r["legacy"] and (r["tenant"], r["run_id"]) in written)]
    if tenant is not None:
        records = [r for r in records if r["tenant"] == tenant]
    return pa.Table.from_pylist(records, schema=RUNS)


def add_catalog_args(parser: Any) -> None:
    """`--catalog` & co. for the commands that read the tables: the committed Iceberg tables instead of the
    part files (docs/lakehouse.md)."""
    group = parser.add_argument_group("catalog")
    group.add_argument("--catalog", default=None, help="read the tables committed to this Iceberg catalog "
                       "(`sqlite`: <output>/catalog.db; a SQLAlchemy URI; a REST catalog's http(s) URI)")
    group.add_argument("--catalog-namespace", default=None, help="the tables' namespace (default pagemill)")
    group.add_argument("--catalog-property", action="append", default=None, metavar="KEY=VALUE",
                       help="a catalog property (a REST catalog's token, ...); repeatable")
    group.add_argument(ALLOW_HTTP_FLAG, action="store_true", dest="catalog_allow_http",
                       help="send a token or credential to a non-loopback catalog over plain http:// (refused "
                            "without it: anyone on the network reads it)")
    group.add_argument("--snapshot", type=int, default=None,
                       help="with --catalog: read every table as of this snapshot's commit (any table's snapshot id)")


@dataclass(frozen=True)
class TableSource:
    """Where `connect` reads the tables: the Parquet part files under the output root (no `catalog`), or the
    tables an Iceberg catalog committed (transforms/store/iceberg.py), now or as of `snapshot`'s commit."""

    catalog: Any = None  # transforms/store/iceberg.py CatalogConfig
    snapshot: int | None = None

    @staticmethod
    def of(output: str, uri: str | None, namespace: str | None = None, properties: Sequence[str] | None = None,
           snapshot: int | None = None, allow_http: bool = False) -> TableSource:
        """From the command line's `--catalog`, `--catalog-namespace`, `--catalog-property`, `--snapshot`,
        `--catalog-allow-http`. A catalog that cannot be used raises CatalogRefused (a usage error: exit 2)."""
        from transforms.store.iceberg import catalog_config, catalog_problems

        if snapshot is not None and not uri:
            raise ValueError("--snapshot reads a catalog's snapshot: give --catalog too")
        problems = catalog_problems(uri, output, properties or (), namespace, allow_http)
        if problems:
            raise CatalogRefused(problems[0])
        return TableSource(catalog_config(uri, namespace, properties), snapshot)

    @staticmethod
    def from_args(args: Any) -> TableSource:
        """From `add_catalog_args`' parsed arguments. Raises ValueError (a usage error)."""
        return TableSource.of(args.output, args.catalog, args.catalog_namespace, args.catalog_property,
                              args.snapshot, getattr(args, "catalog_allow_http", False))

    def committed(self, output: str, storage: StorageConfig | None, tenant: str | None) -> dict[str, pa.Table]:
        """Each table's committed rows (`tenant`'s only, when given)."""
        from transforms.store import iceberg

        catalog = iceberg.open_catalog(self.catalog, output, storage, create=False)
        ns = self.catalog.namespace
        as_of = iceberg.pinned_time(catalog, ns, self.snapshot) if self.snapshot is not None else None
        return {t: iceberg.read_table(catalog, ns, t, tenant, as_of) for t in tables.TABLES}


def connect(output: str, storage: StorageConfig | None = None, tenant: str | None = None,
            read_only: bool = True, typed: bool | str = True,
            source: TableSource | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with views `documents`, `pages`, `ledger` (the kept row per key, by
    schemas/kept_row.py's rule, the one compaction keeps; the ledger's with every attempt's spend), their raw
    rows `documents_all`, `pages_all`, `ledger_all`, and `runs`, over every run under `output`, local or
    s3://; with `typed`, also a typed view per extraction schema (pipelines/tables/typed_views.py; `typed` a
    statement: only the typed views it reads). With `tenant`,
    every view holds that tenant's rows only: only its partitions are listed and each dataset is filtered
    on the `tenant` column too. The tables are pyarrow datasets registered in
    DuckDB, which needs no httpfs extension. A table with no files yet is an empty view of the right
    shape, so queries work before the first run. `read_only`: file access off, configuration locked."""
    fs, root = arrow_filesystem(output, storage or StorageConfig())
    committed = source.committed(output, storage, tenant) if source is not None and source.catalog else None
    con = duckdb.connect()
    for table in tables.TABLES:
        schema = tables.SCHEMAS[table]
        files = table_files(fs, root, table, tenant) if committed is None else []
        data: ds.Dataset | pa.Table = ds.dataset(files, schema=schema, filesystem=fs, format="parquet") if files \
            else pa.Table.from_batches([], schema=schema) if committed is None else committed[table]
        if tenant is not None and files:
            data = data.filter(ds.field("tenant") == tenant)  # a row written to the wrong folder stays out
        con.register(f"{table}_all", data)
        con.execute(f"CREATE VIEW {table} AS {kept_row.view_sql(table, f'{table}_all', schema)}")
    runs = runs_table(fs, root, tenant)
    con.register("runs", runs)
    if typed:
        typed_views.create(con, runs.column("manifest").to_pylist(), typed if isinstance(typed, str) else None)
    if read_only:
        lock(con)
    return con


def lock(con: duckdb.DuckDBPyConnection) -> None:
    """No file, network or extension access from SQL, and no way to turn it back on. Registered Arrow
    data is scanned through Python, so the views keep working."""
    con.execute("SET python_enable_replacements = false")  # no scanning of Python variables by name
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def duplicate_keys(con: duckdb.DuckDBPyConnection, table: str, tenant: str, run_id: str,
                   limit: int = 5) -> tuple[int, list[tuple[Any, ...]]]:
    """Keys of one run that have more than one raw row (the rule: transforms/store/duplicates.py): (how many
    keys, a few examples)."""
    found = con.execute(duplicate_keys_sql(table, f"{table}_all"), [tenant, run_id]).fetchall()
    return len(found), found[:limit]


def query(output: str, sql: str, storage: StorageConfig | None = None, tenant: str | None = None,
          source: TableSource | None = None) -> tuple[list[str], list[tuple[Any, ...]]]:
    try:
        return _answer(connect(output, storage, tenant, typed=sql, source=source), sql)  # the typed views it names
    except duckdb.CatalogException:  # one it names only in a string (`query_table('invoice')`): every view
        return _answer(connect(output, storage, tenant, source=source), sql)


def _answer(con: duckdb.DuckDBPyConnection, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    try:
        rel = con.sql(sql)
        if rel is None:
            return [], []
        return list(rel.columns), rel.fetchall()
    finally:
        con.close()


def error_line(err: Exception) -> str:
    """DuckDB's message on one line; a refused file access says that SQL here is read-only."""
    text = terminal_safe(" ".join(str(err).split()))
    if isinstance(err, duckdb.PermissionException) or "disabled by configuration" in text:
        return f"{text} (pagemill sql is read-only: it reads the views, never a file)"
    return text


def render(columns: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str) -> str:
    if fmt == "json":  # json.dumps escapes every control character
        return json.dumps([dict(zip(columns, r, strict=True)) for r in rows], default=str, indent=1)
    names = [terminal_safe(c) for c in columns]
    if fmt == "csv":  # for a terminal: `pagemill export` writes a CSV file with the values as they are
        return csv_text(names, ([_terminal_value(v) for v in r] for r in rows)).rstrip("\n")
    cells = [[_cell(v) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(names)]
    lines = [" | ".join(c.ljust(w) for c, w in zip(names, widths, strict=True)),
             "-+-".join("-" * w for w in widths)]
    lines += [" | ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    lines.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(lines)


def csv_text(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """CSV with a header; each text cell that starts like a formula neutralised (`csv_cell`)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([csv_cell(c) for c in columns])
    writer.writerows([csv_cell(v) for v in r] for r in rows)
    return buf.getvalue()


def text_value(value: Any) -> Any:
    """A value for a text cell: a list or a struct (a typed view's LIST or STRUCT) as JSON, else as it is."""
    return json.dumps(value, default=str, ensure_ascii=False) if isinstance(value, (list, dict)) else value


def _terminal_value(value: Any) -> Any:
    """A value printed in CSV: numbers as they are, anything else as text escaped by `terminal_safe`."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return terminal_safe(str(text_value(value)))


def csv_cell(value: Any) -> Any:
    """A text cell that starts like a formula gets a leading `'`, so a spreadsheet shows it as text."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def _cell(value: Any) -> str:
    text = terminal_safe("NULL" if value is None else str(text_value(value)))
    return text if len(text) <= 80 else text[:77] + "..."
