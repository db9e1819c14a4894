"""Progress: a line every few seconds on a worker's stderr, and the same figures as Beam counters."""
from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import apache_beam as beam
from apache_beam.metrics import Metrics

from schemas.records import DocumentRow, PageRow


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
