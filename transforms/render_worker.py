"""A render worker process: one document's pages rendered, gated and hinted under a time limit that actually
stops the work.

pdfium cannot be interrupted inside a call (a page of a pathological PDF can take minutes), and a thread
cannot be killed; only a process can. So each RenderPagesDoFn instance keeps one long-lived child process
(a fresh interpreter, not a fork: the Beam worker that owns it has gRPC threads, which `fork` would copy
half-way; and not multiprocessing's `spawn`, which re-imports the launching script as `__main__`), sends it
one document at a time, and receives the pages over a pipe as the child finishes them (rendered, through
the safety gate, with their hints: transforms/page_work.py). When the
document's deadline (`--document-timeout-s`) or a page's (`--page-timeout-s`) passes with no page ready,
the child is killed and replaced for the next document; pages that arrived before keep their rows, and
every page still missing gets a failed row with reason `timeout` (`worker_crashed` if the child died on
its own). The document's clock runs while it is read, rendered, gated and hinted; the time that later
stages fused with this one (Beam runs them in the same thread as each page is yielded: the model) spend on
its pages is not charged to it, so a long document is never cut short by GPU time.

The parent reads the bytes (its reader holds the storage options) and loads the blocklists; the child gets
no credentials (its environment is minimal) and does no storage I/O.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection

from apache_beam.metrics import Metrics

from schemas.records import DocumentRecord, PageImage, PageRow
from transforms.blocklist import load_blocklists
from transforms.page_work import DocumentWork, PageStages, RenderFn
from transforms.pages import RenderPagesDoFn, RenderSettings, failed_page, render_document
from transforms.reading import ObjectReader

DONE, READY = "done", "ready"
STARTUP_TIMEOUT_S = 120.0  # a child that cannot import its modules in this long is broken, not slow


@dataclass(frozen=True)
class RenderLimits:
    document_timeout_s: float = 600.0  # 0: no limit
    page_timeout_s: float = 0.0  # 0: no limit

    @property
    def enabled(self) -> bool:
        return self.document_timeout_s > 0 or self.page_timeout_s > 0


CHILD_ENV_KEYS = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "TESSDATA_PREFIX")
# A --safety-check that needs a key of its own (a vendor service) reads it from a variable named so.
CHILD_ENV_PREFIXES = ("PAGEMILL_CHECK_",)
CHILD_COMMAND = "from transforms.render_worker import child_main; child_main()"


def child_env(environ: Mapping[str, str], path: list[str]) -> dict[str, str]:
    """Pure: the child's environment: what Python needs, and this process's import path; no credentials
    (the worker's environment holds Beam's PIPELINE_OPTIONS, storage keys among them)."""
    env = {k: v for k, v in environ.items() if k in CHILD_ENV_KEYS or k.startswith(CHILD_ENV_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    return env


def serve(requests: Connection, replies: Connection, render: RenderFn) -> None:
    """The child's loop: (doc, data, settings) in, each page out as it is finished, then DONE."""
    while True:
        try:
            doc, data, settings = requests.recv()
        except (EOFError, OSError):  # the parent is gone: so is this child's reason to live
            return
        for page in render(doc, data, settings):
            replies.send(page)
        replies.send(DONE)


def child_main() -> None:
    """Entry point of the child: requests on stdin, replies on the original stdout. fd 1 is pointed at
    stderr, so that a library that prints cannot corrupt the reply stream."""
    replies = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)
    requests = Connection(os.dup(0), writable=False)
    render = requests.recv()  # the render function (pickled by reference), or a DocumentWork
    try:
        getattr(render, "prepare", lambda: None)()  # the classifier and checks: once, off any clock
    except Exception as err:  # noqa: BLE001 - told to the parent, which stops the run with it
        replies.send(("error", f"{type(err).__name__}: {err}"))
        return
    replies.send(READY)
    serve(requests, replies, render)


def _wait_s(now: float, doc_deadline: float, page_deadline: float) -> float | None:
    """Pure: how long to wait for the next page before a deadline passes (never negative; None: forever)."""
    deadline = min(doc_deadline, page_deadline)
    return None if deadline == float("inf") else max(0.0, deadline - now)


def range_limit_s(doc: DocumentRecord, document_timeout_s: float) -> float:
    """Pure: a page range's share of the document's limit, by its pages: the ranges of a split
    document together get what the whole document would have had."""
    return document_timeout_s * len(doc.page_indices) / max(doc.page_count, 1)


def range_note(doc: DocumentRecord, document_timeout_s: float) -> str:
    pages = doc.page_indices
    if len(pages) == doc.page_count:
        return ""
    return (f"; pages {pages.start + 1}-{pages.stop} of {doc.page_count} had "
            f"{range_limit_s(doc, document_timeout_s):.0f} s of it")


def missing_pages(doc: DocumentRecord, seen: set[int], reason_code: str, message: str) -> Iterator[PageRow]:
    """Pure: a failed row for every page of `doc` (of its page range) that produced none."""
    for index in doc.page_indices:
        if index not in seen:
            yield failed_page(doc, index, reason_code, message)


class RenderWorker:
    """One child process that renders one document at a time; killed and restarted on a deadline."""

    def __init__(self, limits: RenderLimits, render: RenderFn = render_document) -> None:
        self.limits = limits
        self.render = render
        self.proc: subprocess.Popen[bytes] | None = None
        self.requests: Connection | None = None
        self.replies: Connection | None = None
        self.started = 0  # child processes started (a restart after a kill counts)
        self.booted = False

    def spawn(self) -> None:
        """Start a child if none is alive, without waiting for it (it boots while the caller works on)."""
        if self.proc is not None and self.proc.poll() is None:
            return
        self.stop()
        proc = subprocess.Popen([sys.executable, "-c", CHILD_COMMAND], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, env=child_env(os.environ, sys.path), close_fds=True)
        assert proc.stdin is not None and proc.stdout is not None
        self.requests = Connection(os.dup(proc.stdin.fileno()), readable=False)
        self.replies = Connection(os.dup(proc.stdout.fileno()), writable=False)
        proc.stdin.close()
        proc.stdout.close()
        self.proc, self.booted = proc, False
        self.started += 1
        self.requests.send(self.render)

    def _boot(self) -> float:
        """Spawn if needed and wait until the child is ready; the seconds waited (a child's start is not
        its document's time). Raises EOFError/OSError if it cannot start."""
        self.spawn()
        assert self.requests is not None and self.replies is not None
        if self.booted:
            return 0.0
        waited = time.monotonic()
        reply = self.replies.recv() if self.replies.poll(STARTUP_TIMEOUT_S) else None
        if isinstance(reply, tuple):  # its checks could not be built: a configuration error, not this document's
            self.stop()
            raise RuntimeError(f"the render worker could not load the safety checks or OCR: {reply[1]}")
        if reply != READY:
            raise EOFError(f"the render worker did not start within {STARTUP_TIMEOUT_S:g} s")
        self.booted = True
        return time.monotonic() - waited

    def stop(self) -> None:
        """Kill the child (it may be deep inside pdfium: no polite way exists) and forget it."""
        for conn in (self.requests, self.replies):
            if conn is not None:
                conn.close()
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(timeout=30)
        self.proc = self.requests = self.replies = None

    def exit_code(self) -> int | None:
        """The child's exit status once it has died (the pipe closes a moment before it is there)."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None

    def pages(self, doc: DocumentRecord, data: bytes, settings: RenderSettings,
              started: float | None = None) -> Iterator[PageImage | PageRow]:
        """Every page of `doc`: rendered in the child, or a failed row (`timeout`, `worker_crashed`)."""
        finished = False
        try:
            yield from self._pages(doc, data, settings, started)
            finished = True
        finally:
            if not finished:  # abandoned mid-document (a later stage raised): its pages must not reach the next
                self.stop()

    def _pages(self, doc: DocumentRecord, data: bytes, settings: RenderSettings,
               started: float | None) -> Iterator[PageImage | PageRow]:
        start = time.monotonic() if started is None else started
        limits = self.limits
        doc_deadline = start + range_limit_s(doc, limits.document_timeout_s) if limits.document_timeout_s > 0 \
            else float("inf")
        off_clock = 0.0  # the child's boot and the time later stages spent on yielded pages
        try:
            off_clock = self._boot()
            doc_deadline += off_clock
            assert self.requests is not None and self.replies is not None
            conn = self.replies
            self.requests.send((doc, data, settings))
        except (EOFError, OSError) as err:  # the child could not start, or died between documents
            code = self.exit_code()
            self.stop()
            yield from missing_pages(doc, set(), "worker_crashed", f"render worker unavailable: {err} (exit {code})")
            return
        seen: set[int] = set()
        while True:
            page_deadline = time.monotonic() + limits.page_timeout_s if limits.page_timeout_s > 0 else float("inf")
            try:
                ready = conn.poll(_wait_s(time.monotonic(), doc_deadline, page_deadline))
                message = conn.recv() if ready else None
            except (EOFError, OSError):
                code = self.exit_code()
                self.stop()
                yield from missing_pages(doc, seen, "worker_crashed",
                                         f"the render worker died on this document (exit code {code})")
                return
            if message is None:
                elapsed, over = time.monotonic() - start - off_clock, time.monotonic() >= doc_deadline
                self.stop()
                self.spawn()  # the next document's child boots while this one's rows go downstream
                if over:
                    why = (f"stopped after {elapsed:.0f} s of reading, rendering, safety checks and hints "
                           f"(--document-timeout-s {limits.document_timeout_s:g}"
                           f"{range_note(doc, limits.document_timeout_s)})")
                else:
                    why = f"a page took over --page-timeout-s {limits.page_timeout_s:g} to render, check and hint"
                done = f"{len(seen)} of {len(doc.page_indices)} pages done"
                yield from missing_pages(doc, seen, "timeout", f"{done}; {why}")
                return
            if isinstance(message, str):  # DONE
                yield from missing_pages(doc, seen, "render_failed", "the renderer produced no row for this page")
                return
            seen.add(message.page_index)
            handed = time.monotonic()
            yield message  # later stages fused with this one run here: off this document's clock
            off_clock += time.monotonic() - handed
            doc_deadline += time.monotonic() - handed


class TimedRenderPagesDoFn(RenderPagesDoFn):
    """RenderPagesDoFn whose rendering runs in a RenderWorker under RenderLimits. With `stages`, the
    worker also runs the safety gate and the hints (transforms/page_work.py): its main output is then
    pages ready for the model, and quarantined rows leave with the failed ones (tag `failed_pages`)."""

    def __init__(self, settings: RenderSettings, limits: RenderLimits, render: RenderFn = render_document,
                 reader: ObjectReader | None = None, stages: PageStages | None = None) -> None:
        super().__init__(settings, reader)
        self.limits = limits
        self.render_fn = render
        self.stages = stages

    def setup(self) -> None:
        work: RenderFn = self.render_fn
        if self.stages is not None:  # the lists are read here, where the storage options are
            work = DocumentWork(self.stages, load_blocklists(self.stages.safety.blocklists), self.render_fn)
        self.worker = RenderWorker(self.limits, work)
        self.worker.spawn()  # boots while the first documents are listed and read
        self.workers_started = Metrics.counter("pagemill", "render_workers_started")
        self.counted = 0

    def teardown(self) -> None:
        self.worker.stop()

    def finish_bundle(self) -> None:
        self.workers_started.inc(self.worker.started - self.counted)  # restarts after a kill show here
        self.counted = self.worker.started

    def render(self, doc: DocumentRecord, data: bytes, started: float) -> Iterator[PageImage | PageRow]:
        return self.worker.pages(doc, data, self.settings, started)
