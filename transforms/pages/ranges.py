"""Page ranges: a large PDF is rendered as several units, so that several workers share it.

Intake has counted the pages, so a document is cut, before rendering, into records for pages
[first_page, end_page) of at least `--render-range-pages` pages each (and at most MAX_RANGES of them); a
smaller document, and every image input, stays one unit. A reshuffle after the cut lets the runner
hand the units to different workers (without it they stay fused with the step that made them).

What stays as it was: each unit is rendered by the render worker under its share of the document's time
limit (transforms/document_work/timed.py), every page still yields one row, and the `documents` row is still
built once per document, from the pages of all its units (transforms/output/outcome.py joins by doc_sha256).
The cost: each unit reads and checks the document's bytes, and pdfium opens it, once per unit.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import apache_beam as beam

from schemas.records import DocumentRecord

MAX_RANGES = 32  # per document: past this the ranges grow instead (each one re-reads the document's bytes)


def page_ranges(doc: DocumentRecord, range_pages: int) -> Iterator[DocumentRecord]:
    """Pure: the render units of `doc`: itself, or records for consecutive page ranges that cover every
    page once. `range_pages` 0 never splits."""
    if doc.format != "pdf" or range_pages <= 0 or doc.page_count < 2 * range_pages:
        yield doc
        return
    size = max(range_pages, -(-doc.page_count // MAX_RANGES))
    count = doc.page_count // size  # the last range takes the remainder, so none is smaller than `size`
    for i in range(count):
        end = doc.page_count if i == count - 1 else (i + 1) * size
        yield replace(doc, first_page=i * size, end_page=end)


class SplitPageRanges(beam.PTransform):
    """DocumentRecord -> its render units, spread over the workers."""

    def __init__(self, range_pages: int) -> None:
        super().__init__()
        self.range_pages = range_pages

    def expand(self, docs: beam.PCollection) -> beam.PCollection:
        range_pages = self.range_pages
        return (
            docs
            | "Ranges" >> beam.FlatMap(lambda d: page_ranges(d, range_pages))
            | "Spread" >> beam.Reshuffle()
        )
