"""document_outcome, the pure rule, and DocumentOutcomes on small in-memory collections:
pages are tallied per document by a combiner and joined to their document, so every kept document gets
exactly one row, also when none of its pages produced a row."""
from __future__ import annotations

from collections import Counter

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamPipeline
from apache_beam.testing.util import assert_that, equal_to

from schemas.reasons import REASON_CODES
from schemas.records import DocumentRecord, DocumentRow, PageRow
from schemas.statuses import OUTCOMES
from transforms.output.outcome import DocumentOutcomes, PageTally, document_outcome

A = DocumentRecord("s3://b/a.pdf", 10, "a" * 64, "pdf", 3)
B = DocumentRecord("s3://b/b.pdf", 20, "b" * 64, "pdf", 2)
C = DocumentRecord("s3://b/c.png", 30, "c" * 64, "png", 1)


def page(d: DocumentRecord, index: int, status: str, reason: str | None = None) -> PageRow:
    return PageRow(doc_sha256=d.doc_sha256, source_uri=d.uri, page_index=index, status=status, reason_code=reason)


def test_page_tally_counts_statuses_and_reasons() -> None:
    tally = PageTally()
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


# --- document_outcome ----------------------------------------------------------------------------

DOC = DocumentRecord(uri="/data/d.pdf", size=123, doc_sha256="ab" * 32, format="pdf", page_count=4)


def _outcome(statuses: dict[str, int], reasons: dict[str, int] | None = None,
             doc: DocumentRecord = DOC) -> DocumentRow:
    row = document_outcome(doc, Counter(statuses), Counter(reasons or {}))
    assert row.outcome in OUTCOMES
    assert row.reason_code is None or row.reason_code in REASON_CODES
    assert (row.source_uri, row.bytes, row.doc_sha256, row.format, row.page_count) == (
        doc.uri, doc.size, doc.doc_sha256, doc.format, doc.page_count)
    return row


def test_outcome_all_rendered() -> None:
    row = _outcome({"rendered": 4})
    assert (row.outcome, row.reason_code, row.message) == ("rendered", None, None)


@pytest.mark.parametrize("statuses", [{"ok": 4}, {"ok": 2, "cached": 1, "duplicate": 1}, {"cached": 3, "ok": 1}])
def test_outcome_extracted(statuses: dict[str, int]) -> None:
    row = _outcome(statuses)
    assert (row.outcome, row.reason_code, row.message) == ("extracted", None, None)


def test_outcome_all_pages_from_the_cache_is_cached() -> None:
    row = _outcome({"cached": 4})
    assert (row.outcome, row.reason_code, row.message) == ("cached", None, None)


def test_outcome_partial_takes_the_commonest_reason() -> None:
    row = _outcome({"ok": 1, "failed": 2, "invalid": 1}, {"render_failed": 2, "schema_invalid": 1})
    assert (row.outcome, row.reason_code) == ("partial", "render_failed")
    assert row.message and "2 failed" in row.message and "1 invalid" in row.message


def test_outcome_rendered_and_failed_is_partial() -> None:
    row = _outcome({"rendered": 3, "failed": 1}, {"page_too_large": 1})
    assert (row.outcome, row.reason_code) == ("partial", "page_too_large")


def test_outcome_all_failed() -> None:
    row = _outcome({"failed": 4}, {"render_failed": 3, "page_too_large": 1})
    assert (row.outcome, row.reason_code) == ("failed", "render_failed")


def test_outcome_all_invalid_without_reasons() -> None:
    row = _outcome({"invalid": 4})
    assert (row.outcome, row.reason_code) == ("failed", "extraction_failed")


def test_outcome_all_quarantined() -> None:
    row = _outcome({"quarantined": 4}, {"blocked_hash": 4})
    assert (row.outcome, row.reason_code) == ("quarantined", "blocked_hash")
    assert row.message == "4 quarantined of 4 pages"


def test_outcome_no_pages_at_all() -> None:
    row = _outcome({})
    assert (row.outcome, row.reason_code) == ("failed", "extraction_failed")
    assert row.message == "4 of 4 pages produced no row"


def test_outcome_missing_pages_are_reported_not_papered_over() -> None:
    row = _outcome({"ok": 3})
    assert row.outcome == "partial"
    assert row.message == "1 of 4 pages produced no row"
    row = _outcome({"rendered": 3})
    assert row.outcome == "partial"


def test_a_page_waiting_on_a_hosted_batch_names_its_document_pending_whatever_the_other_reasons() -> None:
    """The resume processes a document again only by this reason (transforms/output/cache.py), so a pending page
    must win over more common reasons."""
    statuses = Counter({"failed": 3, "ok": 1})
    row = document_outcome(DocumentRecord("s3://b/d.pdf", 10, "d" * 64, "pdf", 4), statuses,
                           Counter({"schema_invalid": 2, "batch_pending": 1}))
    assert (row.outcome, row.reason_code) == ("partial", "batch_pending")
    plain = document_outcome(DocumentRecord("s3://b/d.pdf", 10, "d" * 64, "pdf", 4), statuses,
                             Counter({"schema_invalid": 2, "timeout": 1}))
    assert plain.reason_code == "schema_invalid"
