"""Write: the `documents`, `pages` and `ledger` tables as Parquet, hive-partitioned by tenant and run:
`<output>/<table>/tenant=<tenant>/run_id=<run_id>/part-*.parquet`. Resume, `--force` and compaction
touch one (tenant, run id) partition only, so one tenant can never resume, clear or rewrite another's.

Each table has one Arrow schema (schemas/tables.py); Beam's Parquet sink writes to a temporary
folder and renames on success, so readers never see half-written files.
"""
from __future__ import annotations

import logging
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from schemas import tables
from schemas.records import DocumentRow, PageRow

log = logging.getLogger(__name__)


def join_uri(root: str, *parts: str) -> str:
    return FileSystems.join(root.rstrip("/"), *parts) if root.rstrip("/") else "/".join(parts)


def partition(output: str, table: str, tenant: str, run_id: str) -> str:
    """The folder of one run of one tenant in one table (identifiers are validated by the options)."""
    return join_uri(output, table, f"tenant={tenant}", f"run_id={run_id}")


def run_files(output: str, table: str, tenant: str, run_id: str) -> list[str]:
    pattern = join_uri(partition(output, table, tenant, run_id), "*.parquet")
    return sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)


def run_tenants(output: str, run_id: str) -> set[str]:
    """Tenants that have rows under this run id in any table (a run id belongs to one tenant)."""
    found = set()
    for table in tables.TABLES:
        pattern = join_uri(output, table, "tenant=*", f"run_id={run_id}", "*.parquet")
        try:
            matches = FileSystems.match([pattern])[0].metadata_list
        except Exception:  # noqa: BLE001 - nothing written yet
            continue
        for m in matches:
            found.update(part.removeprefix("tenant=") for part in m.path.split("/") if part.startswith("tenant="))
    return found


def clear_run(output: str, tenant: str, run_id: str) -> int:
    """Delete this run's partitions (`--force` over an existing run id starts it afresh)."""
    removed = 0
    for table in tables.TABLES:
        pattern = join_uri(partition(output, table, tenant, run_id), "*")
        matches = FileSystems.match([pattern])[0].metadata_list
        if matches:
            FileSystems.delete([m.path for m in matches])
            removed += len(matches)
    return removed


def compact_run(output: str, tenant: str, run_id: str) -> dict[str, int]:
    """Rewrite a resumed run's partitions with the latest row per key and delete the old files, so
    no (run, document, page) ever has two rows. The new file is written before the old ones go."""
    from pipelines.sql import TABLE_KEYS

    kept: dict[str, int] = {}
    for table in tables.TABLES:
        files = run_files(output, table, tenant, run_id)
        if len(files) < 2:
            continue
        schema = tables.SCHEMAS[table]
        latest: dict[tuple[Any, ...], dict[str, Any]] = {}
        for path in files:
            with FileSystems.open(path) as handle:
                data = pq.read_table(pa.BufferReader(handle.read()), schema=schema)
            for row in data.to_pylist():
                key = tuple(row[k] for k in TABLE_KEYS[table])
                if key not in latest or _rank(row) >= _rank(latest[key]):
                    latest[key] = row
        write_rows(partition(output, table, tenant, run_id), schema, list(latest.values()),
                   name=f"part-compacted-{uuid.uuid4().hex}.parquet")
        FileSystems.delete(files)
        kept[table] = len(latest)
    return kept


def _rank(row: dict[str, Any]) -> tuple[bool, Any]:
    """Within one run, a row that did the work beats a later `cached` copy of it (a resumed run reuses
    its own killed attempt's pages): the tokens and cost actually spent must not vanish."""
    reused = row.get("status") == "cached" or row.get("route") == "cache" or row.get("outcome") == "cached"
    return (not reused, row["created_at"])


class WriteParquetBundles(beam.DoFn):
    """Rows -> one Parquet file per bundle, made visible atomically when the bundle finishes.

    Unlike a sink that finalises once at the end, a run killed midway keeps every finished bundle,
    so a resumed run (same run id) does only what is missing. Local files are written under a
    temporary name and renamed; an S3 object appears only when its upload completes.
    """

    def __init__(self, folder: str, table: str) -> None:
        self.folder = folder  # partition(output, table, tenant, run_id)
        self.table = table

    def setup(self) -> None:
        self.schema = tables.SCHEMAS[self.table]
        self.rows_written = Metrics.counter("pagemill", f"{self.table}_rows_written")

    def start_bundle(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def process(self, row: dict[str, Any]) -> Iterator[None]:
        self.rows.append(row)
        return iter(())

    def finish_bundle(self) -> None:
        if not self.rows:
            return
        write_rows(self.folder, self.schema, self.rows)
        self.rows_written.inc(len(self.rows))
        self.rows = []


def write_rows(folder: str, schema: pa.Schema, rows: list[dict[str, Any]], name: str | None = None) -> str:
    table = pa.Table.from_pylist(rows, schema=schema)
    final = join_uri(folder, name or f"part-{uuid.uuid4().hex}.parquet")
    local = "://" not in folder or folder.startswith("file://")
    target = final + ".inprogress" if local else final
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf, compression="zstd")
    with FileSystems.create(target) as handle:
        handle.write(buf.getvalue().to_pybytes())
    if local:
        FileSystems.rename([target], [final])
    return final


class WriteTable(beam.PTransform):
    def __init__(self, output: str, table: str, tenant: str, run_id: str) -> None:
        super().__init__()
        self.folder, self.table = partition(output, table, tenant, run_id), table

    def expand(self, rows: beam.PCollection) -> beam.PCollection:
        return rows | beam.ParDo(WriteParquetBundles(self.folder, self.table))


class WriteTables(beam.PTransform):
    """(DocumentRows, PageRows) -> the three tables; `run` holds run_id, tenant and created_at."""

    def __init__(self, output: str, run: Mapping[str, Any], pages: beam.PCollection) -> None:
        super().__init__()
        self.output = output
        self.run = dict(run)
        self.pages = pages

    def expand(self, documents: beam.PCollection) -> dict[str, beam.PCollection]:
        run, run_id, tenant = self.run, self.run["run_id"], self.run["tenant"]
        return {
            "documents": documents
            | "DocumentDicts" >> beam.Map(tables.document_row, run)
            | "WriteDocuments" >> WriteTable(self.output, "documents", tenant, run_id),
            "pages": self.pages
            | "PageDicts" >> beam.Map(tables.page_row, run)
            | "WritePages" >> WriteTable(self.output, "pages", tenant, run_id),
            "ledger": self.pages
            | "LedgerDicts" >> beam.Map(tables.ledger_row, run)
            | "WriteLedger" >> WriteTable(self.output, "ledger", tenant, run_id),
        }


class ProgressDoFn(beam.DoFn):
    """A progress line every few seconds (documents and pages done of those listed, pages/s, ETA) on
    this worker's stderr, and the same figures as Beam counters, which every runner reports."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self.pages_done = Metrics.counter("pagemill", "pages_done")
        self.documents_done = Metrics.counter("pagemill", "documents_done")

    def setup(self) -> None:
        self.pages = 0
        self.documents = 0
        self.started = time.monotonic()
        self.last = self.started

    def process(self, row: DocumentRow | PageRow, listed: int = 0, pages_total: int = 0) -> Iterator[None]:
        if isinstance(row, PageRow):
            self.pages += 1
            self.pages_done.inc()
        else:
            self.documents += 1
            self.documents_done.inc()
        now = time.monotonic()
        if self.every_s > 0 and now - self.last >= self.every_s:
            self.last = now
            print("pagemill: " + progress_line(self.documents, listed, self.pages, pages_total, now - self.started),
                  file=sys.stderr, flush=True)
        return iter(())


def progress_line(documents: int, listed: int, pages: int, pages_total: int, seconds: float) -> str:
    """Pure: e.g. `3/10 documents, 40/120 pages, 2.0 pages/s, ETA 40 s`."""
    rate = pages / max(seconds, 1e-9)
    line = f"{documents}/{listed} documents, {pages}/{pages_total} pages, {rate:.1f} pages/s"
    if rate > 0 and pages_total > pages:
        line += f", ETA {(pages_total - pages) / rate:.0f} s"
    return line
