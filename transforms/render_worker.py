"""A render worker process: one document's pages rendered under a time limit that actually stops the work.

pdfium cannot be interrupted inside a call (a page of a pathological PDF can take minutes), and a thread
cannot be killed; only a process can. So each RenderPagesDoFn instance keeps one long-lived child process
(started with `spawn`: the Beam worker that owns it has gRPC threads, which `fork` would copy half-way),
sends it one document at a time, and receives the pages over a pipe as the child finishes them. When the
document's deadline (`--document-timeout-s`) or a page's (`--page-timeout-s`) passes with no page ready,
the child is killed and replaced for the next document; pages that arrived before keep their rows, and
every page still missing gets a failed row with reason `timeout` (`worker_crashed` if the child died on
its own). The deadline is wall time from the start of the document, so the safety gate and hints that
Beam runs on each page as it is yielded (fused stages, same thread) count against it too: they are not
interrupted mid-page (Tesseract has its own --ocr-timeout-s), but no further page is started after it.

The parent reads the bytes (its FileSystems hold the storage options) and the child only renders: no
credentials, no I/O, no Beam in the child.
"""
from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from apache_beam.metrics import Metrics

from schemas.records import DocumentRecord, PageImage, PageRow
from transforms.pages import RenderPagesDoFn, RenderSettings, failed_page, render_document

RenderFn = Callable[[DocumentRecord, bytes, RenderSettings], Iterator[PageImage | PageRow]]
DONE = "done"


@dataclass(frozen=True)
class RenderLimits:
    document_timeout_s: float = 600.0  # 0: no limit
    page_timeout_s: float = 0.0  # 0: no limit

    @property
    def enabled(self) -> bool:
        return self.document_timeout_s > 0 or self.page_timeout_s > 0


def serve(conn: Connection, render: RenderFn) -> None:
    """The child's loop: (doc, data, settings) in, each page out as it is finished, then DONE."""
    while True:
        try:
            doc, data, settings = conn.recv()
        except (EOFError, OSError):  # the parent is gone: so is this child's reason to live
            return
        for page in render(doc, data, settings):
            conn.send(page)
        conn.send(DONE)


def _wait_s(now: float, doc_deadline: float, page_deadline: float) -> float | None:
    """Pure: how long to wait for the next page before a deadline passes (never negative; None: forever)."""
    deadline = min(doc_deadline, page_deadline)
    return None if deadline == float("inf") else max(0.0, deadline - now)


def missing_pages(doc: DocumentRecord, seen: set[int], reason_code: str, message: str) -> Iterator[PageRow]:
    """Pure: a failed row for every page of `doc` that produced none."""
    for index in range(doc.page_count):
        if index not in seen:
            yield failed_page(doc, index, reason_code, message)


class RenderWorker:
    """One child process that renders one document at a time; killed and restarted on a deadline."""

    def __init__(self, limits: RenderLimits, render: RenderFn = render_document) -> None:
        self.limits = limits
        self.render = render
        self.proc: Any = None
        self.conn: Connection | None = None
        self.started = 0  # child processes started (a restart after a kill counts)

    def _start(self) -> Connection:
        if self.proc is None or not self.proc.is_alive():
            ctx = multiprocessing.get_context("spawn")
            parent, child = ctx.Pipe()
            self.proc = ctx.Process(target=serve, args=(child, self.render), daemon=True,
                                    name="pagemill-render")
            self.proc.start()
            child.close()
            self.conn = parent
            self.started += 1
        assert self.conn is not None
        return self.conn

    def stop(self) -> None:
        """Kill the child (it may be deep inside pdfium: no polite way exists) and forget it."""
        if self.conn is not None:
            self.conn.close()
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(timeout=10)
        self.proc = self.conn = None

    def pages(self, doc: DocumentRecord, data: bytes, settings: RenderSettings,
              started: float | None = None) -> Iterator[PageImage | PageRow]:
        """Every page of `doc`: rendered in the child, or a failed row (`timeout`, `worker_crashed`)."""
        start = time.monotonic() if started is None else started
        limits = self.limits
        doc_deadline = start + limits.document_timeout_s if limits.document_timeout_s > 0 else float("inf")
        conn = self._start()
        conn.send((doc, data, settings))
        seen: set[int] = set()
        while True:
            page_deadline = time.monotonic() + limits.page_timeout_s if limits.page_timeout_s > 0 else float("inf")
            try:
                ready = conn.poll(_wait_s(time.monotonic(), doc_deadline, page_deadline))
                message = conn.recv() if ready else None
            except (EOFError, OSError):
                if self.proc is not None:
                    self.proc.join(timeout=5)  # the pipe closes a moment before the exit status is there
                code = self.proc.exitcode if self.proc is not None else None
                self.stop()
                yield from missing_pages(doc, seen, "worker_crashed",
                                         f"the render worker died on this document (exit code {code})")
                return
            if message is None:
                self.stop()
                elapsed = time.monotonic() - start
                if time.monotonic() >= doc_deadline:
                    why = f"stopped after {elapsed:.0f} s (--document-timeout-s {limits.document_timeout_s:g})"
                else:
                    why = f"a page took over --page-timeout-s {limits.page_timeout_s:g} to render"
                yield from missing_pages(doc, seen, "timeout", f"{len(seen)} of {doc.page_count} pages done; {why}")
                return
            if isinstance(message, str):  # DONE
                yield from missing_pages(doc, seen, "render_failed", "the renderer produced no row for this page")
                return
            seen.add(message.page_index)
            yield message  # downstream stages run here, on the clock of this document


class TimedRenderPagesDoFn(RenderPagesDoFn):
    """RenderPagesDoFn whose rendering runs in a RenderWorker under RenderLimits."""

    def __init__(self, settings: RenderSettings, limits: RenderLimits, render: RenderFn = render_document) -> None:
        super().__init__(settings)
        self.limits = limits
        self.render_fn = render

    def setup(self) -> None:
        self.worker = RenderWorker(self.limits, self.render_fn)
        self.workers_started = Metrics.counter("pagemill", "render_workers_started")
        self.counted = 0

    def teardown(self) -> None:
        self.worker.stop()

    def finish_bundle(self) -> None:
        self.workers_started.inc(self.worker.started - self.counted)  # restarts after a kill show here
        self.counted = self.worker.started

    def render(self, doc: DocumentRecord, data: bytes, started: float) -> Iterator[PageImage | PageRow]:
        return self.worker.pages(doc, data, self.settings, started)
