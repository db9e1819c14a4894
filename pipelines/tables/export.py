"""`pagemill export`: one typed view (pipelines/tables/typed_views.py) written to a Parquet or CSV file, and `read`,
the same view as an Arrow table for a notebook (`pipelines.read`).

Parquet keeps the view's types (DATE, DOUBLE, LIST of STRUCT ...). CSV has no nested types: a list or a
struct is written as JSON text, and a text cell that starts like a spreadsheet formula gets a leading `'`
(`pipelines.tables.sql.csv_cell`). Values are otherwise written as they are: escaping for terminals is `pagemill
sql`'s job, not a file's. xlsx is not offered: no spreadsheet library is a dependency (open the CSV).
"""
from __future__ import annotations

import argparse
import os
import posixpath
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipelines.config.storage import StorageConfig, arrow_filesystem
from pipelines.tables import sql
from schemas.sql_types import quote
from transforms.text_safety import terminal_safe

FORMATS = ("parquet", "csv")


def read(output: str, schema: str, tenant: str | None = None, storage: StorageConfig | None = None,
         source: sql.TableSource | None = None) -> pa.Table:
    """The typed view `schema` (`invoice`, `invoice_line_items`, ... as `typed_views` lists them) over
    every run under `output`, or one tenant's, as an Arrow table. Raises ValueError for an unknown view."""
    con = sql.connect(output, storage, tenant, source=source)
    try:
        known = [v for (v,) in con.execute("SELECT view FROM typed_views ORDER BY view").fetchall()]
        if schema not in known:
            raise ValueError(f"no typed view {schema!r} under {output}; there are: {', '.join(known)}")
        return con.sql(f"SELECT * FROM {quote(schema)}").to_arrow_table()
    finally:
        con.close()


def write(table: pa.Table, to: str, fmt: str, storage: StorageConfig | None = None) -> None:
    """`table` to the file `to` (local or s3://) as Parquet or CSV."""
    fs, path = arrow_filesystem(to, storage or StorageConfig())
    if isinstance(fs, pafs.LocalFileSystem):
        fs.create_dir(posixpath.dirname(path) or ".", recursive=True)
    if fmt == "parquet":
        pq.write_table(table, path, filesystem=fs)
        return
    text = sql.csv_text(table.column_names, _csv_rows(table))
    with fs.open_output_stream(path) as handle:
        handle.write(text.encode("utf-8"))


def _csv_rows(table: pa.Table) -> Iterator[list[Any]]:
    for batch in table.to_batches():
        for row in batch.to_pylist():
            yield [sql.text_value(v) for v in row.values()]


def resolved(uri: str) -> tuple[str, str]:
    """(scheme, path) of a local path or URI as storage will see it: a local path absolute with every symlink
    followed (os.path.realpath); an object store's key as written (`..` is a literal part of a key there)."""
    if "://" in uri and not uri.startswith("file://"):
        scheme, rest = uri.split("://", 1)
        return scheme, rest.rstrip("/")
    return "file", os.path.realpath(uri.removeprefix("file://"))


def target_problem(output: str, to: str) -> str | None:
    """Why the export may not be written to `to`, or None: nothing under the output root, whose files
    pagemill reads as its own (a table's rows, a run's manifest or listing), whatever a symlink says."""
    (scheme, root), (to_scheme, path) = resolved(output), resolved(to)
    if scheme != to_scheme or not (path == root or path.startswith(root.rstrip("/") + "/")):
        return None
    via = "" if path == to.removeprefix("file://") else f" (it resolves to {path})"
    return (f"--to {to}{via} is inside the output root {output}, whose files are read as tables, manifests "
            "and listings; write the export outside it")


def command(argv: Sequence[str]) -> int:
    from pipelines.config.storage import add_storage_args, configure, storage_from
    from schemas.layout import check_identifier

    parser = argparse.ArgumentParser(prog="pagemill export", description="Write one typed view to a file.")
    parser.add_argument("--output", required=True, help="output root that `pagemill run` wrote")
    parser.add_argument("--schema", required=True, help="a typed view: invoice, invoice_line_items, ...")
    parser.add_argument("--to", required=True, help="the file to write (local or s3://)")
    parser.add_argument("--format", choices=FORMATS, default=None, help="default: from --to's suffix, else parquet")
    parser.add_argument("--tenant", default=None, help="this tenant's rows only")
    sql.add_catalog_args(parser)
    add_storage_args(parser)
    args = parser.parse_args(argv)
    if bad := check_identifier("--tenant", args.tenant):
        print(f"pagemill export: {bad}", file=sys.stderr)
        return 2
    fmt = args.format or ("csv" if args.to.lower().endswith(".csv") else "parquet")
    storage = storage_from(vars(args))
    if problem := target_problem(args.output, args.to):
        print(f"pagemill export: {terminal_safe(problem)}", file=sys.stderr)
        return 2
    configure(storage)
    try:
        table = read(args.output, args.schema, args.tenant, storage, sql.TableSource.from_args(args))
    except ValueError as err:
        print(f"pagemill export: {terminal_safe(str(err))}", file=sys.stderr)
        return 2
    try:
        write(table, args.to, fmt, storage)
    except OSError as err:
        print(f"pagemill export: cannot write {terminal_safe(args.to)}: {terminal_safe(str(err))}", file=sys.stderr)
        return 1
    print(f"pagemill export: {table.num_rows} rows of {args.schema} to {terminal_safe(args.to)} ({fmt})")
    return 0
