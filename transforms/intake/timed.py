"""Intake under --document-timeout-s: opening a document to count its pages (pdfium's parse, or Pillow's
walk over an image's frames and its decode of frame 0) runs in a child process that the deadline kills.

The Beam worker reads the bytes (its reader holds the storage options), hashes and sniffs them; only the page
count, the part that can hang inside C code, crosses to the child (transforms/child_process.py: minimal
environment, no credentials, one child per DoFn instance, replaced after a kill). A document that runs past
the limit gets its one `documents` row, `failed` with reason `timeout`; one that kills the child,
`failed` with `worker_crashed`; the next document gets a fresh child. Everything else is decided by the
same pure functions as in process (transforms/intake/inspection.py), so the rows are the same.
"""
from __future__ import annotations

from dataclasses import replace
from functools import partial

from apache_beam.metrics import Metrics

from schemas.reasons import TIMEOUT, WORKER_CRASHED
from schemas.records import DocumentRecord, DocumentRow, ListedObject
from schemas.statuses import FAILED
from transforms.child_process import ChildWorker
from transforms.intake.accept import IntakeDoFn
from transforms.intake.inspection import (
    IntakeLimits,
    PageCounter,
    count_pages,
    counted_in_child,
    inspect_document,
    reject,
)
from transforms.intake.reading import ObjectReader


class IntakeWorker(ChildWorker):
    name = "intake process"
    prepare_failed = "the intake process could not start"
    reply_types = (DocumentRow,)  # a page count (int) or the document's row


def stopped_row(obj: ListedObject, fmt: str, sha: str, stopped: str, detail: str, timeout_s: float) -> DocumentRow:
    """Pure: the row of a document whose page count the child did not finish."""
    known = {"doc_sha256": sha, "format": fmt}
    if stopped == TIMEOUT:
        message = (f"intake stopped: opening this {fmt} to count its pages took over --document-timeout-s "
                   f"{timeout_s:g}")
    else:
        message = f"{detail}, opening this {fmt} to count its pages"
    return replace(reject(obj, stopped, message, **known), outcome=FAILED)


class TimedIntakeDoFn(IntakeDoFn):
    """IntakeDoFn whose page count runs in an IntakeWorker under `timeout_s`. `count`: the counter the
    child runs (tests inject one that hangs; never a product default)."""

    def __init__(self, limits: IntakeLimits, timeout_s: float, reader: ObjectReader | None = None,
                 count: PageCounter = count_pages) -> None:
        super().__init__(limits, reader)
        self.timeout_s = timeout_s
        self.count = count

    def setup(self) -> None:
        self.worker = IntakeWorker(partial(counted_in_child, count=self.count))
        self.worker.spawn()  # boots while the first objects are listed and read
        self.workers_started = Metrics.counter("pagemill", "intake_workers_started")

    def teardown(self) -> None:
        self.worker.stop()

    def finish_bundle(self) -> None:
        self.workers_started.inc(self.worker.new_starts())

    def inspect(self, obj: ListedObject, data: bytes) -> DocumentRecord | DocumentRow:
        return inspect_document(obj, data, self.limits, self.count_in_child)

    def count_in_child(self, obj: ListedObject, data: bytes, fmt: str, sha: str,
                       limits: IntakeLimits) -> int | DocumentRow:
        replies, stopped, detail = self.worker.ask((obj, data, fmt, sha, limits), self.timeout_s)
        if stopped is None and len(replies) == 1:
            return replies[0]
        # A child that finished without exactly one answer broke the protocol: counted as a crash.
        return stopped_row(obj, fmt, sha, stopped or WORKER_CRASHED, detail or "the intake process gave no page count",
                           self.timeout_s)
