"""Write: the `documents`, `pages` and `ledger` tables as Parquet, hive-partitioned by tenant and run:
`<output>/<table>/tenant=<tenant>/run_id=<run_id>/part-*.parquet`. Resume, `--force` and compaction
touch one (tenant, run id) partition only, so one tenant can never resume, clear or rewrite another's.

Each table has one Arrow schema (schemas/tables.py). Rows are written as the run goes (every
`--flush-rows` rows or `--flush-seconds` seconds, and at each bundle's end), each file made visible
atomically, so readers never see a half-written file and a killed run keeps what it flushed.
"""
from __future__ import annotations

import errno
import logging
import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
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
        pattern = join_uri(partition(output, table, "*", run_id), "*.parquet")
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


@dataclass(frozen=True)
class FlushPolicy:
    """When a writer makes its buffered rows a file: every `rows` rows or when the oldest buffered
    row is `seconds` old (0 turns either off), and always at the end of a bundle."""

    rows: int = 500
    seconds: float = 10.0

    def due(self, buffered: int, oldest_age_s: float) -> bool:
        """Pure. The age rule can only fire when a row arrives (no timers: Beam DoFns do their I/O on
        the bundle's thread), so rows wait at most until the next row after `seconds`, or the bundle's end."""
        if buffered <= 0:
            return False
        if self.rows > 0 and buffered >= self.rows:
            return True
        return self.seconds > 0 and oldest_age_s >= self.seconds


class WriteParquetBundles(beam.DoFn):
    """Rows -> Parquet files written as the run goes: one file each time the flush policy is due,
    and one at the end of the bundle, each made visible atomically.

    A runner may hand a fused stage its whole input as one bundle (the in-memory DirectRunner does),
    so writing only at bundle end would keep every row in memory until the run ends and lose all of
    them to a kill. A run killed midway keeps every flushed file, so a resumed run (same run id) does
    only what is missing; it loses at most the rows buffered since the last flush, per writer.
    Local files are written under a temporary name and renamed; an S3 object appears only when its
    upload completes. A bundle that fails after a flush and is retried writes those rows again: the
    compaction of a resumed run and the SQL views keep one row per key.
    """

    def __init__(self, folder: str, table: str, policy: FlushPolicy | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.folder = folder  # partition(output, table, tenant, run_id)
        self.table = table
        self.policy = policy or FlushPolicy()
        self.clock = clock

    def setup(self) -> None:
        self.schema = tables.SCHEMAS[self.table]
        self.rows_written = Metrics.counter("pagemill", f"{self.table}_rows_written")
        self.files_written = Metrics.counter("pagemill", f"{self.table}_files_written")

    def start_bundle(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.oldest = 0.0

    def process(self, row: dict[str, Any]) -> Iterator[None]:
        now = self.clock()
        if not self.rows:
            self.oldest = now
        self.rows.append(row)
        if self.policy.due(len(self.rows), now - self.oldest):
            self.flush()
        return iter(())

    def finish_bundle(self) -> None:
        self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        write_rows(self.folder, self.schema, self.rows)
        self.rows_written.inc(len(self.rows))
        self.files_written.inc()
        self.rows = []


def write_rows(folder: str, schema: pa.Schema, rows: list[dict[str, Any]], name: str | None = None) -> str:
    table = pa.Table.from_pylist(rows, schema=schema)
    final = join_uri(folder, name or f"part-{uuid.uuid4().hex}.parquet")
    local = "://" not in folder or folder.startswith("file://")
    target = final + ".inprogress" if local else final
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf, compression="zstd")
    try:
        with FileSystems.create(target) as handle:
            handle.write(buf.getvalue().to_pybytes())
        if local:
            FileSystems.rename([target], [final])
    except Exception as err:
        # A full disk or a failed upload leaves nothing behind: readers only list *.parquet, and a
        # half-written .inprogress file would still hold the space.
        _discard(target)
        if isinstance(err, OSError) and err.errno and not err.filename:
            raise OSError(err.errno, err.strerror, target) from err  # say which file, for the one-line error
        raise
    return final


def _discard(path: str) -> None:
    try:
        FileSystems.delete([path])
    except Exception:  # noqa: BLE001 - best effort; the original error is the one to report
        log.warning("could not remove the partial file %s", path)


def run_failure(err: BaseException) -> str:
    """One line for a run that failed: what went wrong at its root, in words. Pure. Runners wrap a
    DoFn's exception (in-process as its __cause__, across processes only as text), so both are read."""
    chain: list[BaseException] = []
    seen: BaseException | None = err
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    for exc in chain:
        if isinstance(exc, OSError) and exc.errno in _STORAGE_ERRNOS:
            where = f" ({exc.filename})" if exc.filename else ""
            return f"{_STORAGE_ERRNOS[exc.errno]}{where}"
    text = " ".join(str(e) for e in chain)
    for code, words in _STORAGE_ERRNOS.items():
        if f"[Errno {code}]" in text or os.strerror(code) in text:
            return words
    root = chain[-1]
    raised = _RAISED.findall(str(root)) if _TRACEBACK in str(root) else []
    if raised:  # a worker process's traceback as text: its last exception line says what happened
        return raised[-1].strip()[:300]
    first = (str(root).strip().splitlines() or [""])[0]
    return f"{type(root).__name__}: {first}"[:300]


_TRACEBACK = "Traceback (most recent call last)"
_RAISED = re.compile(r"^\s*((?:\w+\.)*\w*(?:Error|Exception|Exit|Interrupt)\b.*)$", re.MULTILINE)


_STORAGE_ERRNOS = {errno.ENOSPC: "no space left on the output's storage",
                   errno.EDQUOT: "the output's storage quota is exhausted",
                   errno.EROFS: "the output's storage is read-only"}


class WriteTable(beam.PTransform):
    """Rows (one PCollection, or the branches of a Flatten) -> Parquet files of one table.

    Each input of a Flatten is written where it is produced: the in-memory DirectRunner materialises
    every multi-input Flatten, so a writer behind one would see no row until all its inputs were
    done. Writing the branches separately keeps each writer in its producer's fused stage."""

    def __init__(self, output: str, table: str, tenant: str, run_id: str, policy: FlushPolicy | None = None,
                 to_row: Callable[..., dict[str, Any]] | None = None, *args: Any) -> None:
        super().__init__()
        self.folder, self.table, self.policy = partition(output, table, tenant, run_id), table, policy
        self.to_row, self.args = to_row, args

    def expand(self, rows: beam.PCollection) -> tuple[beam.PCollection, ...]:
        written = []
        for i, branch in enumerate(flatten_branches(rows)):
            if self.to_row is not None:
                branch = branch | f"Rows{i}" >> beam.Map(self.to_row, *self.args)
            writer = WriteParquetBundles(self.folder, self.table, self.policy)
            written.append(branch | f"Write{i}" >> beam.ParDo(writer))
        return tuple(written)


def flatten_branches(pcoll: beam.PCollection) -> list[beam.PCollection]:
    """The PCollections a Flatten (or a Flatten of Flattens) merged into `pcoll`, else [pcoll]."""
    producer = pcoll.producer
    if producer is None or not isinstance(producer.transform, beam.Flatten):
        return [pcoll]
    branches: list[beam.PCollection] = []
    for part in producer.inputs:
        branches.extend(flatten_branches(part))
    return branches


class WriteTables(beam.PTransform):
    """(DocumentRows, PageRows) -> the three tables; `run` holds run_id, tenant and created_at."""

    def __init__(self, output: str, run: Mapping[str, Any], pages: beam.PCollection,
                 policy: FlushPolicy | None = None) -> None:
        super().__init__()
        self.output = output
        self.run = dict(run)
        self.pages = pages
        self.policy = policy

    def expand(self, documents: beam.PCollection) -> dict[str, tuple[beam.PCollection, ...]]:
        run, run_id, tenant, policy = self.run, self.run["run_id"], self.run["tenant"], self.policy
        out = self.output
        return {
            "documents": documents
            | "WriteDocuments" >> WriteTable(out, "documents", tenant, run_id, policy, tables.document_row, run),
            "pages": self.pages
            | "WritePages" >> WriteTable(out, "pages", tenant, run_id, policy, tables.page_row, run),
            "ledger": self.pages
            | "WriteLedger" >> WriteTable(out, "ledger", tenant, run_id, policy, tables.ledger_row, run),
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
