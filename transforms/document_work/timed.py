"""A render worker process: one document's pages rendered, gated and hinted under a time limit that actually
stops the work.

pdfium cannot be interrupted inside a call (a page of a pathological PDF can take minutes), and a thread
cannot be killed; only a process can. So each RenderPagesDoFn instance keeps one long-lived child process
(a fresh interpreter: transforms/child_process.py says why and how), sends it one document at a time, and
receives the pages over a pipe as the child finishes them (rendered, through the safety gate, with their
hints: transforms/document_work/work.py). When the document's deadline (`--document-timeout-s`) or a page's
(`--page-timeout-s`) passes with no page ready, the child is killed and replaced for the next document;
pages that arrived before keep their rows, and every page still missing gets a failed row with reason
`timeout` (`worker_crashed` if the child died on its own). The document's clock runs while it is read,
rendered, gated and hinted; the time that later stages fused with this one (Beam runs them in the same
thread as each page is yielded: the model) spend on its pages is not charged to it, so a long document is
never cut short by GPU time.

The parent reads the bytes (its reader holds the storage options) and loads the blocklists; the child gets
no credentials (its environment is minimal) and does no storage I/O.
"""
from __future__ import annotations

import pickle
import time
from collections.abc import Iterator
from dataclasses import dataclass

from apache_beam.metrics import Metrics

from schemas.reasons import RENDER_FAILED, TIMEOUT, WORKER_CRASHED
from schemas.records import DocumentRecord, PageImage, PageRow
from transforms.child_process import DONE, BadReply, ChildWorker, wait_s
from transforms.document_work.work import DocumentWork, PageStages, RenderFn
from transforms.intake.reading import ObjectReader
from transforms.pages.render import RenderSettings, failed_page, render_document
from transforms.pages.stage import RenderPagesDoFn
from transforms.safety.blocklist import load_blocklists


@dataclass(frozen=True)
class RenderLimits:
    document_timeout_s: float = 600.0  # 0: no limit
    page_timeout_s: float = 0.0  # 0: no limit

    @property
    def enabled(self) -> bool:
        return self.document_timeout_s > 0 or self.page_timeout_s > 0


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


def reply_problem(doc: DocumentRecord, seen: set[int], message: object) -> str | None:
    """Pure: what is wrong with a render child's reply (None: it is a page of `doc` not seen before). The
    child parses untrusted bytes, so a reply is checked, not believed."""
    if isinstance(message, Exception):
        return str(message)
    if not isinstance(message, PageImage | PageRow):
        return f"a reply of type {type(message).__name__}"
    if message.doc_sha256 != doc.doc_sha256 or message.page_index not in doc.page_indices or \
            message.page_index in seen:
        return f"a reply for page {message.page_index} of another or an already answered page"
    return None


class RenderWorker(ChildWorker):
    """One child process (transforms/child_process.py) that renders one document at a time; killed and
    restarted on a deadline."""

    name = "render worker"
    prepare_failed = "the render worker could not start"
    reply_types = (PageImage, PageRow)

    def __init__(self, limits: RenderLimits, render: RenderFn = render_document) -> None:
        super().__init__(render)
        self.limits = limits

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
        except (EOFError, OSError) as err:  # the child died between documents (one that cannot start raises)
            code = self.exit_code()
            self.stop()
            yield from missing_pages(doc, set(), WORKER_CRASHED, f"render worker unavailable: {err} (exit {code})")
            return
        seen: set[int] = set()
        while True:
            page_deadline = time.monotonic() + limits.page_timeout_s if limits.page_timeout_s > 0 else float("inf")
            try:
                ready = conn.poll(wait_s(time.monotonic(), doc_deadline, page_deadline))
                message = self.receive() if ready else None
            except (EOFError, OSError):
                code = self.exit_code()
                self.stop()
                yield from missing_pages(doc, seen, WORKER_CRASHED,
                                         f"the render worker died on this document (exit code {code})")
                return
            except (BadReply, pickle.UnpicklingError) as err:
                message = err
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
                yield from missing_pages(doc, seen, TIMEOUT, f"{done}; {why}")
                return
            if message == DONE:
                yield from missing_pages(doc, seen, RENDER_FAILED, "the renderer produced no row for this page")
                return
            problem = reply_problem(doc, seen, message)
            if problem is not None:  # a child this document subverted: replaced, and it fails its pages
                self.stop()
                yield from missing_pages(doc, seen, WORKER_CRASHED,
                                         f"the render worker broke the protocol on this document: {problem}"[:500])
                return
            assert isinstance(message, PageImage | PageRow)
            seen.add(message.page_index)
            handed = time.monotonic()
            yield message  # later stages fused with this one run here: off this document's clock
            off_clock += time.monotonic() - handed
            doc_deadline += time.monotonic() - handed


class TimedRenderPagesDoFn(RenderPagesDoFn):
    """RenderPagesDoFn whose rendering runs in a RenderWorker under RenderLimits. With `stages`, the
    worker also runs the safety gate and the hints (transforms/document_work/work.py): its main output is then
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

    def teardown(self) -> None:
        self.worker.stop()

    def finish_bundle(self) -> None:
        self.workers_started.inc(self.worker.new_starts())

    def render(self, doc: DocumentRecord, data: bytes, started: float) -> Iterator[PageImage | PageRow]:
        return self.worker.pages(doc, data, self.settings, started)
