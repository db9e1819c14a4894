"""Write: the `documents`, `pages`, `ledger` and `evidence` tables as Parquet, each run's rows in its own (tenant,
run id) partition (the layout: schemas/layout.py; a run's partitions are listed, cleared and compacted by
transforms/store/compaction.py).

Each table has one Arrow schema (schemas/tables.py). Rows are written as the run goes (every
`--flush-rows` rows or `--flush-seconds` seconds, and at each bundle's end), each file made visible
atomically, so readers never see a half-written file and a killed run keeps what it flushed.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from schemas import tables
from schemas.kept_row import ATTEMPT_SEQ
from schemas.layout import join_uri, partition
from transforms.store.part_names import PART_PREFIX, new_part_name
from transforms.store.part_names import part_prefix as part_prefix  # re-exported: tests import it from here

log = logging.getLogger(__name__)
# Progress as Beam counters (every runner's UI shows them): a row is done once it is written.
DONE_COUNTERS = {"documents": "documents_done", "pages": "pages_done"}


def next_seq(now_ns: int, last: int) -> int:
    """Pure: the next attempt sequence number, the clock's nanoseconds but always past the last one."""
    return max(now_ns, last + 1)


class AttemptSequence:
    """`attempt_seq` of the rows a writer receives (schemas/kept_row.py): it orders a runner's retry of a
    bundle after its first attempt even inside one invocation, where every row shares `created_at`. A retry
    runs after the attempt it replaces failed, so the wall clock orders them, made strictly increasing in
    the process; rows of one attempt written twice (a flush replayed) keep the number they were given."""

    def __init__(self, clock: Callable[[], int] = time.time_ns) -> None:
        self.clock = clock
        self.last = 0
        self.lock = threading.Lock()  # the writers of a process's worker threads share it

    def __call__(self) -> int:
        with self.lock:
            self.last = next_seq(self.clock(), self.last)
            return self.last


ATTEMPTS = AttemptSequence()


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
    upload completes. A bundle that fails after a flush and is retried writes those rows again, each row
    numbered by the attempt that made it (`attempt_seq`): compaction and the SQL views keep one row per key
    by schemas/kept_row.py's rule.
    """

    def __init__(self, folder: str, table: str, policy: FlushPolicy | None = None,
                 clock: Callable[[], float] = time.monotonic, prefix: str = PART_PREFIX,
                 to_row: Callable[[Any], Any] | None = None,
                 written_first: WriteParquetBundles | None = None, many: bool = False) -> None:
        self.folder = folder  # partition(output, table, tenant, run_id)
        self.table = table
        self.policy = policy or FlushPolicy()
        self.clock = clock
        self.prefix = prefix
        self.to_row = to_row  # element -> this table's row (None: the element is the row)
        self.many = many  # to_row gives a list of rows (a page's `evidence` rows), maybe none
        # Another table's writer fed the same elements and flushed just before this one, so that no row of this
        # table is on disk without its row there (a page's `pages` row without its `ledger` row: a resume keeps
        # the page and would never write its spend).
        self.written_first = written_first

    def setup(self) -> None:
        if self.written_first is not None:
            self.written_first.setup()
        self.schema = tables.SCHEMAS[self.table]
        self.rows_written = Metrics.counter("pagemill", f"{self.table}_rows_written")
        self.files_written = Metrics.counter("pagemill", f"{self.table}_files_written")
        self.done = Metrics.counter("pagemill", DONE_COUNTERS[self.table]) if self.table in DONE_COUNTERS else None

    def start_bundle(self) -> None:
        if self.written_first is not None:
            self.written_first.start_bundle()
        self.rows: list[dict[str, Any]] = []
        self.oldest = 0.0

    def process(self, element: Any) -> Iterator[None]:
        if self.buffer(element):
            self.flush()
        return iter(())

    def buffer(self, element: Any) -> bool:
        """Buffer the element's row (and the rows of the writers to flush first); True when the flush policy is
        due (for this table's rows: the writers flushed first follow this one's flushes)."""
        if self.written_first is not None:
            self.written_first.buffer(element)
        now = self.clock()
        if not self.rows:
            self.oldest = now
        made = element if self.to_row is None else self.to_row(element)
        for row in made if self.many else (made,):
            self.rows.append({**row, ATTEMPT_SEQ: ATTEMPTS()})
        return self.policy.due(len(self.rows), now - self.oldest)

    def finish_bundle(self) -> None:
        self.flush()

    def flush(self) -> None:
        if self.written_first is not None:
            self.written_first.flush()
        if not self.rows:
            return
        write_rows(self.folder, self.schema, self.rows, new_part_name(self.prefix))
        self.rows_written.inc(len(self.rows))
        self.files_written.inc()
        if self.done is not None:
            self.done.inc(len(self.rows))
        self.rows = []


def write_rows(folder: str, schema: pa.Schema, rows: list[dict[str, Any]], name: str | None = None) -> str:
    table = pa.Table.from_pylist(rows, schema=schema)
    final = join_uri(folder, name or new_part_name())
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


class WriteTable(beam.PTransform):
    """Rows (one PCollection, or the branches of a Flatten) -> Parquet files of one table; with `written_first`
    (another table and its `to_row`), each element's row of that table too, always flushed just before this
    table's (WriteParquetBundles.written_first).

    Each input of a Flatten is written where it is produced: the in-memory DirectRunner materialises
    every multi-input Flatten, so a writer behind one would see no row until all its inputs were
    done. Writing the branches separately keeps each writer in its producer's fused stage."""

    def __init__(self, output: str, table: str, tenant: str, run_id: str, policy: FlushPolicy | None = None,
                 to_row: Callable[[Any], dict[str, Any]] | None = None, *, prefix: str = PART_PREFIX,
                 written_first: tuple[str, Callable[[Any], dict[str, Any]]] | None = None,
                 rows_first: tuple[str, Callable[[Any], list[dict[str, Any]]]] | None = None) -> None:
        super().__init__()
        self.output, self.tenant, self.run_id, self.table, self.policy = output, tenant, run_id, table, policy
        self.to_row, self.prefix, self.written_first = to_row, prefix, written_first
        # A table of several rows per element (`evidence`), flushed before `written_first`'s (before this one's).
        self.rows_first = rows_first

    def _writer(self, table: str, to_row: Callable[[Any], Any] | None,
                first: WriteParquetBundles | None = None, many: bool = False) -> WriteParquetBundles:
        return WriteParquetBundles(partition(self.output, table, self.tenant, self.run_id), table, self.policy,
                                   prefix=self.prefix, to_row=to_row, written_first=first, many=many)

    def _first(self) -> WriteParquetBundles | None:
        many = None if self.rows_first is None else self._writer(*self.rows_first, many=True)
        if self.written_first is None:
            return many
        return self._writer(*self.written_first, first=many)

    def expand(self, rows: beam.PCollection) -> tuple[beam.PCollection, ...]:
        written = []
        for i, branch in enumerate(flatten_branches(rows)):
            written.append(branch | f"Write{i}" >> beam.ParDo(self._writer(self.table, self.to_row, self._first())))
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
    """(DocumentRows, PageRows) -> the three tables; `run` holds run_id, tenant and created_at; `prefix`
    names the part files (`part_prefix`: a wave's own)."""

    def __init__(self, output: str, run: Mapping[str, Any], pages: beam.PCollection,
                 policy: FlushPolicy | None = None, prefix: str = PART_PREFIX) -> None:
        super().__init__()
        self.output = output
        self.run = dict(run)
        self.pages = pages
        self.policy = policy
        self.prefix = prefix

    def expand(self, documents: beam.PCollection) -> dict[str, tuple[beam.PCollection, ...]]:
        run, run_id, tenant, policy = self.run, self.run["run_id"], self.run["tenant"], self.policy
        out, prefix = self.output, self.prefix
        # A page's ledger row is flushed before its pages row, by one writer: a kill between the two files leaves
        # spend without a page (the resume answers the page again and the ledger sums both attempts), never a
        # page whose spend no row records. Its evidence rows go first of all, so a kept page has its evidence.
        pages = self.pages | "WritePagesAndLedger" >> WriteTable(
            out, "pages", tenant, run_id, policy, partial(tables.page_row, run=run), prefix=prefix,
            written_first=("ledger", partial(tables.ledger_row, run=run)),
            rows_first=("evidence", partial(tables.evidence_rows, run=run)))
        return {
            "documents": documents | "WriteDocuments" >> WriteTable(
                out, "documents", tenant, run_id, policy, partial(tables.document_row, run=run), prefix=prefix),
            "pages": pages,
            "ledger": pages,
            "evidence": pages,
        }
