"""The safety gate's two stages (transforms/safety/gate.py says what they check): `DocumentGateDoFn` on accepted
documents, `SafetyGateDoFn` on rendered pages, and `LoadsChecks`, what holds the checks once per worker process.
Their own module so that a render child, which runs the gate's functions, never imports Beam.
"""
from __future__ import annotations

import time
from collections.abc import Iterator

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.utils import shared

from schemas.records import DocumentRecord, PageImage
from schemas.statuses import QUARANTINED
from transforms.safety.gate import (
    Checks,
    SafetyConfig,
    load_checks,
    match_verdict,
    quarantined_document,
    quarantined_page,
    screen_page,
)


class LoadsChecks(beam.DoFn):
    """A DoFn that holds the checks of `cfg`, loaded once per worker process."""

    def __init__(self, cfg: SafetyConfig) -> None:
        self.cfg = cfg
        self._shared = shared.Shared()

    def setup(self) -> None:
        cfg = self.cfg
        self.checks: Checks = self._shared.acquire(lambda: load_checks(cfg), tag=repr(cfg))


class DocumentGateDoFn(LoadsChecks):
    """DocumentRecord -> DocumentRecord (main), or a quarantined DocumentRow (tag `quarantined`)."""

    def __init__(self, cfg: SafetyConfig) -> None:
        # Only the lists are needed here: no classifier is loaded for documents.
        super().__init__(cfg.lists_only())
        self.quarantined = Metrics.counter("pagemill", "documents_quarantined")

    def process(self, doc: DocumentRecord) -> Iterator[object]:
        found = self.checks.lists.match_sha256(doc.doc_sha256)
        if found is None:
            yield doc
            return
        self.quarantined.inc()
        yield beam.pvalue.TaggedOutput(QUARANTINED, quarantined_document(doc, match_verdict(found, "document")))


class SafetyGateDoFn(LoadsChecks):
    """PageImage -> PageImage with its PDQ hash (main), or a quarantined PageRow (tag `quarantined`)."""

    def __init__(self, cfg: SafetyConfig) -> None:
        super().__init__(cfg)
        self.passed = Metrics.counter("pagemill", "pages_passed_safety")
        self.quarantined = Metrics.counter("pagemill", "pages_quarantined")
        self.gate_ms = Metrics.distribution("pagemill", "safety_ms")
        self.skipped = Metrics.counter("pagemill", "pages_picture_checks_skipped")

    def process(self, page: PageImage) -> Iterator[object]:
        start = time.perf_counter()
        checked, verdict = screen_page(page, self.checks, self.cfg.low_detail_side)
        self.gate_ms.update(int((time.perf_counter() - start) * 1000))
        if any(d.endswith(":skipped_no_raster") for d in checked.flag_detail[len(page.flag_detail):]):
            self.skipped.inc()
        if verdict is None:
            self.passed.inc()
            yield checked
        else:
            self.quarantined.inc()
            yield beam.pvalue.TaggedOutput(QUARANTINED, quarantined_page(checked, verdict))
