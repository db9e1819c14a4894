"""Intake: gate each listed object on size before reading, read, hash, sniff, validate.

Outputs a `DocumentRecord` for every acceptable document, and a `DocumentRow` with outcome
`rejected` and a reason code for every other listed object. Nothing raises across the pipeline.
The inspection itself (hash, sniff, page count) is transforms/intake/inspection.py; with --document-timeout-s,
transforms/intake/timed.py counts the pages in a child process that the deadline can kill.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace

import apache_beam as beam
from apache_beam.metrics import Metrics

from schemas.reasons import EMPTY, NOT_FOUND, OUTSIDE_INPUT, STORAGE_ERROR, TOO_LARGE
from schemas.records import DocumentRecord, DocumentRow, ListedObject
from schemas.statuses import FAILED, REJECTED
from transforms.intake.inspection import IntakeLimits, inspect_document, reject
from transforms.intake.listing import MISSING, OUTSIDE
from transforms.intake.reading import ObjectReader, ReadConfig, ReadFailed

log = logging.getLogger(__name__)


def size_gate(obj: ListedObject, limits: IntakeLimits) -> DocumentRow | None:
    """Decided from the listing alone, so an oversized object is never downloaded."""
    if obj.size == MISSING:
        return reject(obj, NOT_FOUND, "the object was listed by name but does not exist")
    if obj.size == OUTSIDE:
        return reject(obj, OUTSIDE_INPUT, "a symlink in the listed folder leads outside it: not followed")
    if obj.size > limits.max_bytes:
        return reject(obj, TOO_LARGE, f"{obj.size:,} bytes is over the limit of {limits.max_bytes:,}")
    if obj.size == 0:
        return reject(obj, EMPTY, "the object has zero bytes")
    return None


def read_failed(obj: ListedObject, err: ReadFailed) -> DocumentRow:
    """The row of an object that could not be read: the store's failure (after its retries) is `failed`
    (a system failure), any other refusal `rejected`."""
    row = reject(obj, err.reason_code, str(err))
    return replace(row, outcome=FAILED) if err.reason_code == STORAGE_ERROR else row


class IntakeDoFn(beam.DoFn):
    """ListedObject -> DocumentRecord, or DocumentRow (tag `rejected`)."""

    def __init__(self, limits: IntakeLimits, reader: ObjectReader | None = None) -> None:
        self.limits = limits
        self.reader = reader or ObjectReader(ReadConfig())
        self.rejected = Metrics.counter("pagemill", "documents_rejected")
        self.accepted = Metrics.counter("pagemill", "documents_accepted")

    def process(self, obj: ListedObject) -> Iterator[object]:
        # First: a URI outside this run's --input is refused as such, whatever size its listing claims.
        outside = self.reader.outside(obj.uri)
        gated = read_failed(obj, outside) if outside is not None else size_gate(obj, self.limits)
        if gated is None:
            try:
                data = self.reader.read(obj.uri, self.limits.max_bytes)
            except ReadFailed as err:  # any storage error is this object's outcome
                gated = read_failed(obj, err)
        result = gated if gated is not None else self.inspect(obj, data)
        if isinstance(result, DocumentRow):
            self.rejected.inc()
            yield beam.pvalue.TaggedOutput(REJECTED, result)
        else:
            self.accepted.inc()
            yield result

    def inspect(self, obj: ListedObject, data: bytes) -> DocumentRecord | DocumentRow:
        """In this process; transforms/intake/timed.py counts the pages in a child under a time limit."""
        return inspect_document(obj, data, self.limits)
