"""Dedup documents by content: one copy per sha256 goes on, every other copy is a `duplicate` row.

The kept copy is the smallest URI, so two runs over the same objects always agree. Only metadata
crosses the shuffle; the bytes are read again by the page stage.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

import apache_beam as beam

from schemas.records import DocumentRecord, DocumentRow
from schemas.statuses import DUPLICATE

DUPLICATES = "duplicates"


def split_duplicates(copies: Iterable[DocumentRecord]) -> tuple[DocumentRecord, list[DocumentRow]]:
    """The copy to keep, and a `duplicate` row for each of the others. Pure."""
    ordered = sorted(copies, key=lambda d: d.uri)
    kept, others = ordered[0], ordered[1:]
    rows = [
        DocumentRow(source_uri=d.uri, bytes=d.size, outcome=DUPLICATE, doc_sha256=d.doc_sha256,
                    format=d.format, page_count=d.page_count, duplicate_of=kept.uri,
                    message=f"same bytes as {kept.uri}")
        for d in others
    ]
    return kept, rows


class _SplitDuplicates(beam.DoFn):
    def process(self, keyed: tuple[str, Iterable[DocumentRecord]]) -> Iterator[object]:
        kept, rows = split_duplicates(keyed[1])
        yield kept
        for row in rows:
            yield beam.pvalue.TaggedOutput(DUPLICATES, row)


class DedupDocuments(beam.PTransform):
    """DocumentRecord -> kept DocumentRecord (main) and DocumentRow duplicates (tag `duplicates`)."""

    def expand(self, docs: beam.PCollection) -> beam.pvalue.DoOutputsTuple:
        return (
            docs
            | "BySha" >> beam.Map(lambda d: (d.doc_sha256, d))
            | "Group" >> beam.GroupByKey()
            | "Split" >> beam.ParDo(_SplitDuplicates()).with_outputs(DUPLICATES, main="kept")
        )
