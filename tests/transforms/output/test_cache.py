"""The result cache's pure parts (which earlier rows are reusable, the `cached` copy of a row, a document
answered whole from the cache, resuming) and its Beam joins on small in-memory collections."""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamPipeline
from apache_beam.testing.util import assert_that, equal_to

from schemas.records import DocumentRecord, ListedObject, PageRow
from schemas.statuses import SUCCESS
from transforms.output.cache import (
    CACHE_COLUMNS,
    RESUMED,
    ReadEarlierPages,
    SkipCachedDocuments,
    SkipDoneDocuments,
    cached_row,
    document_from_cache,
    reusable,
)
from transforms.safety.gate import SafetyConfig

DOC = DocumentRecord("s3://b/new.pdf", 100, "d" * 64, "pdf", 2)


def earlier(page_index: int, created_at: str = "2026-01-01T00:00:00", **changes: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "tenant": "acme", "doc_sha256": DOC.doc_sha256, "page_index": page_index, "page_hash": f"h{page_index}",
        "cache_key": f"k{page_index}", "config_key": "cfg", "status": "ok", "schema_id": "invoice",
        "schema_hash": "sh", "model": "m", "model_revision": "r", "extraction": f'{{"page": {page_index}}}',
        "validation_errors": None, "flags": ["pii"], "hint_source": "ocr", "width": 600, "height": 800,
        "created_at": created_at}
    row.update(changes)
    return row


def test_reusable_needs_a_good_status_the_tenant_and_the_configuration() -> None:
    assert SUCCESS == {"ok", "cached", "duplicate"}
    for status in SUCCESS:
        assert reusable(earlier(0, status=status), "acme", "cfg")
    for status in ("invalid", "failed", "quarantined", "rendered", None):
        assert not reusable(earlier(0, status=status), "acme", "cfg"), status
    assert not reusable(earlier(0), "other-tenant", "cfg")  # tenants never share cache entries
    assert not reusable(earlier(0), "acme", "other-config")
    assert not reusable({}, "acme", "cfg")


def test_cached_row_copies_the_answer_and_costs_nothing() -> None:
    row = cached_row(earlier(1), "e" * 64, "s3://b/copy.pdf", 1)
    assert (row.doc_sha256, row.source_uri, row.page_index) == ("e" * 64, "s3://b/copy.pdf", 1)
    assert (row.status, row.route, row.message) == ("cached", "cache", "extraction reused from an earlier run")
    assert (row.page_hash, row.cache_key, row.config_key) == ("h1", "k1", "cfg")
    assert (row.width, row.height, row.schema_id, row.schema_hash) == (600, 800, "invoice", "sh")
    assert (row.model, row.model_revision, row.extraction) == ("m", "r", '{"page": 1}')
    assert row.validation_errors == () and row.flags == ("pii",) and row.hint_source == "ocr"
    assert (row.image_tokens, row.text_tokens, row.output_tokens, row.attempts) == (0, 0, 0, 0)
    assert (row.gpu_seconds, row.cost_usd, row.api_equivalent_usd) == (0.0, 0.0, 0.0)
    bare = cached_row({"validation_errors": ["$.total: required"], "flags": None, "hint_source": None}, "x", "u", 0)
    assert bare.validation_errors == ("$.total: required",) and bare.flags == () and bare.hint_source == "none"


def test_a_document_comes_from_the_cache_only_when_every_page_is_there() -> None:
    rows = document_from_cache(DOC, [earlier(1), earlier(0)])
    assert rows is not None and [r.page_index for r in rows] == [0, 1]
    assert all(r.source_uri == DOC.uri and r.doc_sha256 == DOC.doc_sha256 for r in rows)
    assert document_from_cache(DOC, [earlier(0)]) is None  # page 1 missing: render the document
    assert document_from_cache(DOC, [earlier(0), earlier(2)]) is None  # a page past the end is no help
    assert document_from_cache(DOC, []) is None
    empty = DocumentRecord("u", 1, "z" * 64, "pdf", 0)
    assert document_from_cache(empty, []) == []


def test_the_latest_earlier_row_of_a_page_wins() -> None:
    rows = [earlier(0, "2026-01-01", extraction="old"), earlier(0, "2026-03-01", extraction="new"),
            earlier(0, "2026-02-01", extraction="middle"), earlier(1)]
    got = document_from_cache(DOC, rows)
    assert got is not None and got[0].extraction == "new"
    same_time = [earlier(0, "2026-01-01", extraction="first"), earlier(0, "2026-01-01", extraction="second"),
                 earlier(1)]
    got = document_from_cache(DOC, same_time)
    assert got is not None and got[0].extraction == "first"  # a tie keeps the row met first


def _parquet(path: Path, rows: list[dict[str, Any]], columns: Iterable[str]) -> str:
    pq.write_table(pa.Table.from_pylist([{c: r.get(c) for c in columns} for r in rows]), path)
    return str(path)


def test_read_earlier_pages_keeps_only_reusable_rows(tmp_path: Path) -> None:
    rows = [earlier(0), earlier(1, status="invalid"), earlier(2, tenant="other"), earlier(3, config_key="old")]
    files = [_parquet(tmp_path / "a.parquet", rows, CACHE_COLUMNS)]
    with BeamPipeline() as p:
        got = p | ReadEarlierPages(files, "acme", "cfg") | beam.Map(lambda r: r["page_index"])
        assert_that(got, equal_to([0]))
    with BeamPipeline() as p:
        assert_that(p | ReadEarlierPages([], "acme", "cfg"), equal_to([]))


def test_skip_cached_documents_splits_rendering_from_reused_pages_checked_against_todays_lists(
        tmp_path: Path) -> None:
    partly = DocumentRecord("s3://b/partly.pdf", 10, "p" * 64, "pdf", 2)
    fresh = DocumentRecord("s3://b/fresh.pdf", 10, "f" * 64, "pdf", 1)
    listed = DocumentRecord("s3://b/listed.pdf", 10, "l" * 64, "pdf", 2)
    rows = [earlier(0), earlier(1), earlier(0, doc_sha256=partly.doc_sha256),
            earlier(0, doc_sha256=listed.doc_sha256, page_hash="0" * 64),
            earlier(1, doc_sha256=listed.doc_sha256, page_hash="1" * 64)]
    today = tmp_path / "today.txt"
    today.write_text(f"sha256:{'1' * 64}\n")  # listed after the earlier run: page 1 of listed.pdf
    safety = SafetyConfig(blocklists=(str(today),), nsfw_classifier="none")
    with BeamPipeline() as p:
        docs = p | "Docs" >> beam.Create([DOC, partly, fresh, listed])
        out = docs | SkipCachedDocuments(p | "Earlier" >> beam.Create(rows), safety)
        assert_that(out.render | "RenderUris" >> beam.Map(lambda d: d.uri),
                    equal_to([partly.uri, fresh.uri]), label="render")
        assert_that(out.cached | "CachedKeys" >> beam.Map(lambda r: (r.source_uri, r.page_index, r.status,
                                                                     r.reason_code)),
                    equal_to([(DOC.uri, 0, "cached", None), (DOC.uri, 1, "cached", None),
                              (listed.uri, 0, "cached", None), (listed.uri, 1, "quarantined", "blocked_hash")]),
                    label="cached")


def test_skip_done_documents_drops_what_this_run_already_wrote(tmp_path: Path) -> None:
    listed = [ListedObject("s3://b/a.pdf", 1), ListedObject("s3://b/b.pdf", 2), ListedObject("s3://b/c.pdf", 3)]
    done = [_parquet(tmp_path / "done.parquet", [{"source_uri": "s3://b/b.pdf", "reason_code": None}],
                     ["source_uri", "reason_code"])]
    with BeamPipeline() as p:
        got = p | beam.Create(listed) | SkipDoneDocuments(done) | beam.Map(lambda o: o.uri)
        assert_that(got, equal_to(["s3://b/a.pdf", "s3://b/c.pdf"]))
    # A document whose only row waits on a hosted batch is processed again; one answered since is done.
    pending = [*done, _parquet(tmp_path / "pending.parquet", [
        {"source_uri": "s3://b/a.pdf", "reason_code": "batch_pending"},
        {"source_uri": "s3://b/c.pdf", "reason_code": "batch_pending"},
        {"source_uri": "s3://b/c.pdf", "reason_code": "schema_invalid"}], ["source_uri", "reason_code"])]
    with BeamPipeline() as p:
        got = p | beam.Create(listed) | SkipDoneDocuments(pending) | beam.Map(lambda o: o.uri)
        assert_that(got, equal_to(["s3://b/a.pdf"]))
    with BeamPipeline() as p:
        got = p | beam.Create(listed) | SkipDoneDocuments([]) | beam.Map(lambda o: o.uri)
        assert_that(got, equal_to([o.uri for o in listed]))


@pytest.mark.parametrize("statuses", [("ok", "cached"), ("duplicate", "ok")])
def test_cached_rows_keep_no_cost_whatever_the_earlier_status(statuses: tuple[str, str]) -> None:
    rows = [earlier(i, status=s, cost_usd=1.0, gpu_seconds=3.0) for i, s in enumerate(statuses)]
    got = document_from_cache(DOC, rows)
    assert got is not None and all(isinstance(r, PageRow) and r.cost_usd == 0 and r.gpu_seconds == 0 for r in got)


def test_a_resumes_own_answered_pages_keep_their_status_and_are_tagged_resumed() -> None:
    """A resume (run r2 killed before DOC's documents row) finds DOC's pages answered by r2 itself: counted
    with their own status (the document is `extracted`, as in an uninterrupted run), never written again;
    the same rows seen by another run are `cached` copies."""
    rows = [earlier(0, run_id="r2", source_uri=DOC.uri),
            earlier(1, run_id="r2", source_uri=DOC.uri, status="duplicate")]
    own = document_from_cache(DOC, rows, run_id="r2")
    assert [(r.status, r.route) for r in own or []] == [("ok", RESUMED), ("duplicate", RESUMED)]
    other = document_from_cache(DOC, rows, run_id="r3")
    assert [(r.status, r.route) for r in other or []] == [("cached", "cache"), ("cached", "cache")]
    mixed = document_from_cache(DOC, [rows[0], earlier(1, run_id="r1", source_uri=DOC.uri)], run_id="r2")
    assert [(r.status, r.route) for r in mixed or []] == [("ok", RESUMED), ("cached", "cache")]
    twin = [{**r, "source_uri": "s3://b/twin.pdf"} for r in rows]  # this run answered them for another object
    assert [r.status for r in document_from_cache(DOC, twin, run_id="r2") or []] == ["cached", "cached"]
    safety = SafetyConfig(nsfw_classifier="none")
    with BeamPipeline() as p:
        docs = p | "Docs" >> beam.Create([DOC])
        out = docs | SkipCachedDocuments(p | "Earlier" >> beam.Create(rows), safety, "r2")
        assert_that(out[RESUMED] | "Resumed" >> beam.Map(lambda r: (r.page_index, r.status)),
                    equal_to([(0, "ok"), (1, "duplicate")]), label="resumed")
        assert_that(out.cached, equal_to([]), label="cached")
        assert_that(out.render, equal_to([]), label="render")
