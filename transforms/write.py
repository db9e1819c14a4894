"""Write: the `documents`, `pages` and `ledger` tables as Parquet, hive-partitioned by `run_id=`.

Each table has one Arrow schema (schemas/tables.py); Beam's Parquet sink writes to a temporary
folder and renames on success, so readers never see half-written files.
"""
from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from schemas import tables
from schemas.records import DocumentRow, PageRow

log = logging.getLogger(__name__)


def join_uri(root: str, *parts: str) -> str:
    return FileSystems.join(root.rstrip("/"), *parts) if root.rstrip("/") else "/".join(parts)


def table_prefix(output: str, table: str, run_id: str) -> str:
    return join_uri(output, table, f"run_id={run_id}", "part")


def clear_run(output: str, run_id: str) -> int:
    """Delete this run id's partitions, so writing a run id again replaces it rather than adding to it."""
    removed = 0
    for table in tables.TABLES:
        pattern = join_uri(output, table, f"run_id={run_id}", "*")
        matches = FileSystems.match([pattern])[0].metadata_list
        if matches:
            FileSystems.delete([m.path for m in matches])
            removed += len(matches)
    return removed


class WriteTable(beam.PTransform):
    def __init__(self, output: str, table: str, run_id: str) -> None:
        super().__init__()
        self.prefix = table_prefix(output, table, run_id)
        self.schema = tables.SCHEMAS[table]

    def expand(self, rows: beam.PCollection) -> beam.PDone:
        return rows | beam.io.WriteToParquet(
            self.prefix, self.schema, file_name_suffix=".parquet", record_batch_size=1000,
            shard_name_template="-SSSSS-of-NNNNN")


class WriteTables(beam.PTransform):
    """(DocumentRows, PageRows) -> the three tables; `run` holds run_id, tenant and created_at."""

    def __init__(self, output: str, run: Mapping[str, Any], pages: beam.PCollection) -> None:
        super().__init__()
        self.output = output
        self.run = dict(run)
        self.pages = pages

    def expand(self, documents: beam.PCollection) -> dict[str, beam.PDone]:
        run, run_id = self.run, self.run["run_id"]
        return {
            "documents": documents
            | "DocumentDicts" >> beam.Map(tables.document_row, run)
            | "WriteDocuments" >> WriteTable(self.output, "documents", run_id),
            "pages": self.pages
            | "PageDicts" >> beam.Map(tables.page_row, run)
            | "WritePages" >> WriteTable(self.output, "pages", run_id),
            "ledger": self.pages
            | "LedgerDicts" >> beam.Map(tables.ledger_row, run)
            | "WriteLedger" >> WriteTable(self.output, "ledger", run_id),
        }


class ProgressDoFn(beam.DoFn):
    """A progress line every few seconds (documents and pages done, pages/s) on this worker's stderr,
    and the same figures as Beam counters, which every runner reports."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self.pages_done = Metrics.counter("pagemill", "pages_done")
        self.documents_done = Metrics.counter("pagemill", "documents_done")

    def setup(self) -> None:
        self.pages = 0
        self.documents = 0
        self.started = time.monotonic()
        self.last = self.started

    def process(self, row: DocumentRow | PageRow) -> Iterator[None]:
        if isinstance(row, PageRow):
            self.pages += 1
            self.pages_done.inc()
        else:
            self.documents += 1
            self.documents_done.inc()
        now = time.monotonic()
        if self.every_s > 0 and now - self.last >= self.every_s:
            self.last = now
            rate = self.pages / max(now - self.started, 1e-9)
            print(f"pagemill: {self.documents} documents, {self.pages} pages done, {rate:.1f} pages/s",
                  file=sys.stderr, flush=True)
        return iter(())
