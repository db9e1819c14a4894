"""Progress while a run works: the launching process watches what the run has written (its part files under
the output root) and prints a line every `--progress-every-s`. It needs nothing from the runner, so it works
the same on the DirectRunner, a portable runner or Dataflow; the workers count the same figures as Beam
counters (`pagemill/documents_done`, `pagemill/pages_done`: transforms/store/write.py).

A step of the graph cannot do this: in a batch runner a step fed by side inputs (the listed count, the
pages total) runs after the stages that make them, so its lines came at the end.
"""
from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems


@dataclass(frozen=True)
class Progress:
    """What a progress line says: rows on disk, of those known, and this invocation's share."""

    documents: int
    listed: int | None  # None: not known before the run (`--wave-objects 0` lists inside the pipeline)
    pages: int
    seconds: float  # since this invocation started
    documents_before: int = 0  # rows on disk when this invocation started (a resume)
    pages_before: int = 0
    wave: int | None = None  # 0-based
    waves: int | None = None


def device_rates(before: dict[str, int], now: dict[str, int], seconds: float) -> str:
    """Pure: each engine's pages/s since `before` when there are several, e.g. ` (devices: 0 10.1, 1 9.8 pages/s)`;
    '' for one engine or none."""
    if len(now) < 2:
        return ""
    rates = ", ".join(f"{d} {(n - before.get(d, 0)) / max(seconds, 1e-9):.1f}" for d, n in now.items())
    return f" (devices: {rates} pages/s)"


def progress_line(p: Progress) -> str:
    """Pure: e.g. `wave 2/8: 1500/8000 documents, 1620 pages, 40.0 pages/s, ETA 160 s` (`ETA unknown` until this
    invocation has done a page)."""
    seconds = max(p.seconds, 1e-9)
    rate = (p.pages - p.pages_before) / seconds
    line = f"{p.documents}/{p.listed} documents" if p.listed is not None else f"{p.documents} documents"
    line += f", {p.pages} pages, {rate:.1f} pages/s"
    doc_rate = (p.documents - p.documents_before) / seconds
    if p.listed is not None and p.listed > p.documents:
        # Only once this invocation has done pages: documents that end before the model (rejected, duplicate)
        # finish fast, and an ETA from them alone only grows with the clock while no page is done.
        measured = p.pages > p.pages_before and doc_rate > 0
        line += f", ETA {(p.listed - p.documents) / doc_rate:.0f} s" if measured else ", ETA unknown"
    if p.wave is not None and p.waves is not None:
        line = f"wave {p.wave + 1}/{p.waves}: {line}"
    return line


class RowCounter:
    """Rows in one run's part files of one table, reading each new file's footer once."""

    def __init__(self, output: str, table: str, tenant: str, run_id: str) -> None:
        self.output, self.table, self.tenant, self.run_id = output, table, tenant, run_id
        self.rows: dict[str, int] = {}

    def count(self) -> int:
        from transforms.store.files import run_files

        try:
            paths = run_files(self.output, self.table, self.tenant, self.run_id)
        except Exception:  # noqa: BLE001 - nothing written yet
            return sum(self.rows.values())
        for path in paths:
            if path not in self.rows:
                try:
                    self.rows[path] = footer_rows(path)
                except Exception:  # noqa: BLE001 - compacted away between the listing and the read
                    continue
        return sum(self.rows.values())


def footer_rows(path: str) -> int:
    """The rows of a Parquet file, from its footer (a local file is not read whole)."""
    if "://" not in path:
        return pq.read_metadata(path).num_rows
    with FileSystems.open(path) as handle:
        return pq.read_metadata(pa.BufferReader(handle.read())).num_rows


class ProgressWatcher:
    """A thread of the launching process that prints a progress line every `every_s` seconds (0: never)
    while the run works. `wave` is set by the wave loop (pipelines/run/waves.py)."""

    def __init__(self, output: str, tenant: str, run_id: str, every_s: float, listed: int | None = None,
                 waves: int | None = None, out: IO[str] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 devices: Callable[[], dict[str, int]] | None = None) -> None:
        self.documents = RowCounter(output, "documents", tenant, run_id)
        self.pages = RowCounter(output, "pages", tenant, run_id)
        self.every_s, self.listed, self.waves, self.wave = every_s, listed, waves, None
        self.out, self.clock = out, clock
        self.devices = devices  # each engine's pages answered so far (the engine service's figures), or None
        self.devices_before = devices() if devices is not None and every_s > 0 else {}
        self.lines = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.started = clock()
        self.before = (self.documents.count(), self.pages.count()) if every_s > 0 else (0, 0)

    def now(self) -> Progress:
        return Progress(documents=self.documents.count(), listed=self.listed, pages=self.pages.count(),
                        seconds=self.clock() - self.started, documents_before=self.before[0],
                        pages_before=self.before[1], wave=self.wave, waves=self.waves)

    def report(self) -> None:
        out = self.out or sys.stderr
        now = self.now()
        line = "pagemill: " + progress_line(now)
        if self.devices is not None:  # several engines: each one's rate
            line += device_rates(self.devices_before, self.devices(), now.seconds)
        if out.isatty():  # a terminal: the line is redrawn in place (pipelines/run/run_log.py Screen ends it)
            out.write(f"\r{line}\x1b[K")
            out.flush()
        else:  # a scheduler's log: a line each interval
            print(line, file=out, flush=True)
        self.lines += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.report()
            except Exception:  # noqa: BLE001 - progress must never fail a run
                continue

    def __enter__(self) -> ProgressWatcher:
        if self.every_s > 0:
            self._thread = threading.Thread(target=self._loop, name="pagemill-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
