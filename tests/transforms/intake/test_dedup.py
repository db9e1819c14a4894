"""split_duplicates, the pure rule, and DedupDocuments on a small in-memory collection:
one kept copy per sha256, every other copy a `duplicate` row naming it."""
from __future__ import annotations

import itertools

import apache_beam as beam
from apache_beam.testing.test_pipeline import TestPipeline as BeamPipeline
from apache_beam.testing.util import assert_that, equal_to

from schemas.records import DocumentRecord
from transforms.intake.dedup import DUPLICATES, DedupDocuments, split_duplicates


def doc(uri: str, sha: str, size: int = 10, pages: int = 1) -> DocumentRecord:
    return DocumentRecord(uri=uri, size=size, doc_sha256=sha * 64, format="pdf", page_count=pages)


def test_dedup_documents_keeps_one_copy_per_sha() -> None:
    docs = [doc("s3://b/z.pdf", "a"), doc("s3://b/a.pdf", "a"), doc("s3://b/m.pdf", "a"), doc("s3://b/solo.pdf", "b"),
            doc("s3://b/x.pdf", "c", 7, 3), doc("s3://b/w.pdf", "c", 7, 3)]
    with BeamPipeline() as p:
        out = p | beam.Create(docs) | DedupDocuments()
        assert_that(out.kept | "KeptUris" >> beam.Map(lambda d: d.uri),
                    equal_to(["s3://b/a.pdf", "s3://b/solo.pdf", "s3://b/w.pdf"]), label="kept")
        rows = out[DUPLICATES] | "Rows" >> beam.Map(lambda r: (r.source_uri, r.outcome, r.duplicate_of, r.bytes,
                                                                r.page_count, r.format, r.message))
        assert_that(rows, equal_to([
            ("s3://b/m.pdf", "duplicate", "s3://b/a.pdf", 10, 1, "pdf", "same bytes as s3://b/a.pdf"),
            ("s3://b/z.pdf", "duplicate", "s3://b/a.pdf", 10, 1, "pdf", "same bytes as s3://b/a.pdf"),
            ("s3://b/x.pdf", "duplicate", "s3://b/w.pdf", 7, 3, "pdf", "same bytes as s3://b/w.pdf")]),
            label="duplicates")


def test_split_duplicates_rows_carry_the_copy_and_the_kept_uri() -> None:
    kept, (row,) = split_duplicates([doc("b", "e", 5, 2), doc("a", "e", 5, 2)])
    assert kept == doc("a", "e", 5, 2)
    assert (row.source_uri, row.bytes, row.outcome, row.doc_sha256, row.format, row.page_count, row.duplicate_of,
            row.message, row.reason_code) == ("b", 5, "duplicate", "e" * 64, "pdf", 2, "a", "same bytes as a", None)


# --- split_duplicates ----------------------------------------------------------------------------

def _copies(*uris: str) -> list[DocumentRecord]:
    return [DocumentRecord(uri=u, size=10, doc_sha256="cd" * 32, format="png", page_count=1) for u in uris]


def test_split_single_copy() -> None:
    kept, rows = split_duplicates(_copies("/a/only.png"))
    assert kept.uri == "/a/only.png"
    assert rows == []


def test_split_keeps_the_smallest_uri_whatever_the_order() -> None:
    uris = ("s3://b/z/last.png", "s3://b/a/first.png", "s3://b/m/middle.png", "s3://b/a/first2.png")
    smallest = min(uris)
    results = set()
    for order in itertools.permutations(uris):
        kept, rows = split_duplicates(iter(_copies(*order)))  # any iterable, as GroupByKey gives
        assert kept.uri == smallest
        assert sorted(r.source_uri for r in rows) == sorted(u for u in uris if u != smallest)
        for r in rows:
            assert (r.outcome, r.duplicate_of, r.doc_sha256, r.page_count, r.bytes) == (
                "duplicate", smallest, "cd" * 32, 1, 10)
            assert smallest in (r.message or "")
        results.add((kept, tuple(sorted(rows, key=lambda r: r.source_uri))))
    assert len(results) == 1  # every order gives the same answer
