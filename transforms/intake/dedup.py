"""Dedup documents by content: one copy per sha256 goes on, every other copy is a `duplicate` row.

The kept copy is the smallest URI, so two runs over the same objects always agree. Only metadata
crosses the shuffle; the bytes are read again by the page stage.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import apache_beam as beam

from schemas.records import DocumentRecord, DocumentRow
from schemas.statuses import DUPLICATE, REJECTED

DUPLICATES = "duplicates"


def split_duplicates(copies: Iterable[DocumentRecord]) -> tuple[DocumentRecord, list[DocumentRow]]:
    """The copy to keep, and a `duplicate` row for each of the others. Pure."""
    ordered = sorted(copies, key=lambda d: d.uri)
    kept, others = ordered[0], ordered[1:]
    return kept, [duplicate_row(d, kept.uri) for d in others]


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


# Outcomes of documents that were never a dedup's kept copy (a copy of them is rejected or is a duplicate too).
NOT_KEPT = frozenset({DUPLICATE, REJECTED})


def kept_by_sha(rows: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Pure: doc_sha256 -> the URI of the copy that an earlier wave kept (the smallest URI: waves are in
    URI order), from that wave's `documents` rows."""
    kept: dict[str, str] = {}
    for row in rows:
        sha = row.get("doc_sha256")
        if sha and row.get("outcome") not in NOT_KEPT and (sha not in kept or row["source_uri"] < kept[sha]):
            kept[sha] = row["source_uri"]
    return kept


def read_kept(files: Sequence[str]) -> dict[str, str]:
    """The earlier waves' kept copies, read from their `documents` files (three columns only)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from apache_beam.io.filesystems import FileSystems

    def rows(path: str) -> list[dict[str, Any]]:
        with FileSystems.open(path) as handle:
            table = pq.read_table(pa.BufferReader(handle.read()), columns=["doc_sha256", "source_uri", "outcome"])
        return table.to_pylist()

    return kept_by_sha(row for path in files for row in rows(path))


def duplicate_row(doc: DocumentRecord, kept_uri: str) -> DocumentRow:
    return DocumentRow(source_uri=doc.uri, bytes=doc.size, outcome=DUPLICATE, doc_sha256=doc.doc_sha256,
                       format=doc.format, page_count=doc.page_count, duplicate_of=kept_uri,
                       message=f"same bytes as {kept_uri}")


class _SkipEarlierKept(beam.DoFn):
    def __init__(self, files: Sequence[str]) -> None:
        self.files = list(files)

    def setup(self) -> None:
        # Once per worker process: a sha and a URI per document kept so far in the run (~0.2 KB each).
        self.kept = read_kept(self.files)

    def process(self, doc: DocumentRecord) -> Iterator[object]:
        earlier = self.kept.get(doc.doc_sha256)
        if earlier is None or earlier == doc.uri:
            yield doc
        else:
            yield beam.pvalue.TaggedOutput(DUPLICATES, duplicate_row(doc, earlier))


class SkipEarlierWaves(beam.PTransform):
    """A wave's kept DocumentRecords -> those no earlier wave of the run kept (main), and a `duplicate` row
    (tag `duplicates`) for each copy of a document that an earlier wave kept: dedup stays global across
    waves. `files`: the earlier waves' `documents` files."""

    def __init__(self, files: Sequence[str]) -> None:
        super().__init__()
        self.files = list(files)

    def expand(self, docs: beam.PCollection) -> beam.pvalue.DoOutputsTuple:
        return docs | "EarlierKept" >> beam.ParDo(_SkipEarlierKept(self.files)).with_outputs(DUPLICATES, main="kept")
