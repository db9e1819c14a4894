"""DocumentOutcomes on small in-memory collections (the pure document_outcome is tested in
tests/transforms/pages/test_render.py):
pages are tallied per document by a combiner and joined to their document, so every kept document gets
exactly one row, also when none of its pages produced a row."""
from __future__ import annotations

from collections import Counter

import apache_beam as beam
from apache_beam.testing.test_pipeline import TestPipeline as BeamPipeline
from apache_beam.testing.util import assert_that, equal_to

from schemas.records import DocumentRecord, PageRow
from transforms.output.outcome import DocumentOutcomes, _PageTally

A = DocumentRecord("s3://b/a.pdf", 10, "a" * 64, "pdf", 3)
B = DocumentRecord("s3://b/b.pdf", 20, "b" * 64, "pdf", 2)
C = DocumentRecord("s3://b/c.png", 30, "c" * 64, "png", 1)


def page(d: DocumentRecord, index: int, status: str, reason: str | None = None) -> PageRow:
    return PageRow(doc_sha256=d.doc_sha256, source_uri=d.uri, page_index=index, status=status, reason_code=reason)


def test_page_tally_counts_statuses_and_reasons() -> None:
    tally = _PageTally()
    acc = tally.create_accumulator()
    assert acc == (Counter(), Counter())
    for row in (page(A, 0, "ok"), page(A, 1, "failed", "page_too_large"), page(A, 2, "failed", "page_too_large")):
        acc = tally.add_input(acc, row)
    assert acc == (Counter({"ok": 1, "failed": 2}), Counter({"page_too_large": 2}))
    other = tally.add_input(tally.create_accumulator(), page(A, 3, "invalid", "schema_invalid"))
    merged = tally.merge_accumulators([acc, other, tally.create_accumulator()])
    assert merged == (Counter({"ok": 1, "failed": 2, "invalid": 1}),
                      Counter({"page_too_large": 2, "schema_invalid": 1}))
    assert tally.extract_output(merged) is merged


def test_every_kept_document_gets_one_row_from_its_pages() -> None:
    pages = [page(A, 0, "ok"), page(A, 1, "ok"), page(A, 2, "failed", "render_failed"),
             page(B, 0, "cached"), page(B, 1, "cached")]
    with BeamPipeline() as p:
        docs = p | "Docs" >> beam.Create([A, B, C])
        rows = (p | "Pages" >> beam.Create(pages)) | DocumentOutcomes(docs)
        got = rows | beam.Map(lambda r: (r.source_uri, r.outcome, r.reason_code, r.bytes, r.page_count, r.message))
        assert_that(got, equal_to([
            (A.uri, "partial", "render_failed", 10, 3, "1 failed of 3 pages"),
            (B.uri, "cached", None, 20, 2, None),
            # No page row at all: the document still gets its row, and says why.
            (C.uri, "failed", "extraction_failed", 30, 1, "1 of 1 pages produced no row")]))
