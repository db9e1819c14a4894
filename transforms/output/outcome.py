"""Outcome: the `documents` row of each kept document, from the statuses of its pages.

Pages are summarised per document by a combiner (a status and reason count), so a 5,000-page
document costs a few counters here, not a list of its rows.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator

import apache_beam as beam

from schemas.reasons import BATCH_PENDING, EXTRACTION_FAILED
from schemas.records import DocumentRecord, DocumentRow, PageRow
from schemas.statuses import (
    CACHED,
    EXTRACTED,
    FAILED,
    PARTIAL,
    QUARANTINED,
    RENDERED,
    SUCCESS,
    UNSUCCESSFUL,
)

Tally = tuple[Counter[str], Counter[str]]  # page statuses, page reason codes


def document_outcome(doc: DocumentRecord, statuses: Counter[str], reasons: Counter[str]) -> DocumentRow:
    """Pure: the outcome of a document given how many of its pages ended in each status."""
    seen = sum(statuses.values())
    good = sum(statuses[s] for s in SUCCESS)
    rendered = statuses[RENDERED]
    quarantined = statuses[QUARANTINED]
    top_reason = reasons.most_common(1)[0][0] if reasons else None
    if reasons[BATCH_PENDING]:  # unfinished: the resume processes it again (transforms/output/cache.py)
        top_reason = BATCH_PENDING
    message = None
    if seen < doc.page_count:
        # Counted, not assumed: a page that vanished is reported rather than papered over.
        message = f"{doc.page_count - seen} of {doc.page_count} pages produced no row"
    if seen == 0:
        outcome, reason = FAILED, EXTRACTION_FAILED
    elif statuses[CACHED] == seen == doc.page_count:
        outcome, reason = CACHED, None
    elif good == seen == doc.page_count:
        outcome, reason = EXTRACTED, None
    elif rendered == seen == doc.page_count:
        outcome, reason = RENDERED, None
    elif quarantined == seen:
        outcome, reason = QUARANTINED, top_reason
    elif good + rendered == 0 and quarantined == 0:
        outcome, reason = FAILED, top_reason or EXTRACTION_FAILED
    else:
        outcome, reason = PARTIAL, top_reason
    if message is None and outcome in UNSUCCESSFUL:
        bad = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()) if s not in SUCCESS | {RENDERED})
        message = f"{bad} of {doc.page_count} pages"
    return DocumentRow(source_uri=doc.uri, bytes=doc.size, outcome=outcome, doc_sha256=doc.doc_sha256,
                       format=doc.format, page_count=doc.page_count, reason_code=reason, message=message)


class PageTally(beam.CombineFn):
    """Per document: a count of page statuses and of page reason codes."""

    def create_accumulator(self) -> Tally:
        return Counter(), Counter()

    def add_input(self, acc: Tally, row: PageRow) -> Tally:
        acc[0][row.status] += 1
        if row.reason_code:
            acc[1][row.reason_code] += 1
        return acc

    def merge_accumulators(self, accs: Iterable[Tally]) -> Tally:
        statuses: Counter[str] = Counter()
        reasons: Counter[str] = Counter()
        for s, r in accs:
            statuses.update(s)
            reasons.update(r)
        return statuses, reasons

    def extract_output(self, acc: Tally) -> Tally:
        return acc


def _rows(keyed: tuple[str, dict[str, list]]) -> Iterator[DocumentRow]:
    _, grouped = keyed
    tallies = grouped["pages"]
    statuses, reasons = tallies[0] if tallies else (Counter(), Counter())
    for doc in grouped["docs"]:
        yield document_outcome(doc, statuses, reasons)


class DocumentOutcomes(beam.PTransform):
    """(kept DocumentRecords, PageRows) -> one DocumentRow per kept document."""

    def __init__(self, docs: beam.PCollection) -> None:
        super().__init__()
        self.docs = docs

    def expand(self, pages: beam.PCollection) -> beam.PCollection:
        tallies = (
            pages
            | "PageBySha" >> beam.Map(lambda r: (r.doc_sha256, r))
            | "Tally" >> beam.CombinePerKey(PageTally())
        )
        docs = self.docs | "DocBySha" >> beam.Map(lambda d: (d.doc_sha256, d))
        return {"docs": docs, "pages": tallies} | "Join" >> beam.CoGroupByKey() | "Outcome" >> beam.FlatMap(_rows)
