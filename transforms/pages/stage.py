"""The render stage: DocumentRecord -> rendered PageImages (main) and failed PageRows (tag `failed_pages`), over
transforms/pages/render.py's pure functions. Its own module so that a render child (transforms/document_work/
timed.py), which imports render.py, never imports Beam: a child starts per worker and after every timeout.
"""
from __future__ import annotations

import time
from collections.abc import Iterator

import apache_beam as beam
from apache_beam.metrics import Metrics

from schemas.records import DocumentRecord, PageImage, PageRow
from schemas.statuses import FAILED
from transforms.intake.reading import ObjectReader, ReadConfig, ReadFailed
from transforms.pages.render import FAILED_PAGES, RenderSettings, failed_page, render_document


class RenderPagesDoFn(beam.DoFn):
    """DocumentRecord -> PageImage (main) and failed PageRow (tag `failed_pages`)."""

    def __init__(self, settings: RenderSettings, reader: ObjectReader | None = None) -> None:
        self.settings = settings
        self.reader = reader or ObjectReader(ReadConfig())
        self.rendered = Metrics.counter("pagemill", "pages_rendered")
        self.failed = Metrics.counter("pagemill", "pages_failed_render")
        self.render_ms = Metrics.distribution("pagemill", "render_ms")

    def render(self, doc: DocumentRecord, data: bytes, started: float) -> Iterator[PageImage | PageRow]:
        """In this process; transforms/document_work/timed.py overrides it to render in a child under a time limit."""
        return render_document(doc, data, self.settings)

    def process(self, doc: DocumentRecord) -> Iterator[object]:
        started = time.monotonic()  # the document's clock starts before its bytes are read
        try:
            data = self.reader.read(doc.uri, self.settings.max_bytes)
        except ReadFailed as err:  # storage_error after the retries, or unreadable
            for index in doc.page_indices:
                self.failed.inc()
                yield beam.pvalue.TaggedOutput(FAILED_PAGES, failed_page(doc, index, err.reason_code, str(err)))
            return
        start = time.perf_counter()
        for page in self.render(doc, data, started):
            now = time.perf_counter()
            self.render_ms.update(int((now - start) * 1000))
            if isinstance(page, PageRow):
                if page.status == FAILED:  # not a page the render worker's gate quarantined
                    self.failed.inc()
                yield beam.pvalue.TaggedOutput(FAILED_PAGES, page)
            else:
                self.rendered.inc()
                yield page
            start = time.perf_counter()  # downstream time is not render time
