"""The result cache across runs: a join against earlier runs' `pages` rows under the same output root.

Two levels, both before any model call:
- documents: a kept document whose every page already has a reusable row under the same cache
  configuration (model + revision, prompt, schema, decoding, tenant, render and gate settings) is never
  rendered; its pages are written as `cached` copies of those rows.
- pages: a rendered page whose cache key already has a reusable row is not extracted again.

Safety before reuse (the rule): the cache never vouches for a page that today's gate would stop.
- Blocklists are re-checked, never keyed: before a document's earlier rows are reused, each page's
  stored `page_hash` (sha256 entries), `pdq_hash` and, where the page has a low-detail rendition,
  `pdq_hash_low` (PDQ entries, `--pdq-threshold`) are matched against today's lists, without rendering,
  by the live gate's own function (`BlocklistCheck.check_page`: same renditions, same threshold). A
  hit becomes a `quarantined` page (`blocked_hash`, no extraction), so the document is `quarantined`
  or `partial`, never `cached`. A page whose row lacks a hash a list needs (older rows) is not trusted:
  its document is rendered and gated again (the page-level cache after the gate still spares the model).
  Lists change daily; re-checking by hash keeps the cache without trusting it.
- The classifier, its threshold and the extra `--safety-check`s cannot be re-checked from a row, so
  they are part of the cache configuration (`SafetyConfig.key_form`, transforms/safety/gate.py): changing any of
  them makes every page go through the gate (and the model) again.
- The page-level cache runs after the gate, so a page it reuses has passed today's gate.
The document lookup is a Beam join (CoGroupByKey), so it scales with the runner, not with driver
memory; the page lookup is a side input of earlier rows by cache key (transforms/extract/stage.py), so no
page image crosses a shuffle.
Resuming a run: documents that already have a `documents` row in this run are not processed again; a document
whose every page this run already answered (killed before its `documents` row) is not rendered, and its outcome
counts those pages with their own statuses (RESUMED): `extracted`, as in an uninterrupted run, not `cached`.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import apache_beam as beam
from apache_beam.io.parquetio import ReadAllFromParquet

from schemas import statuses
from schemas.reasons import BATCH_PENDING
from schemas.records import DocumentRecord, ListedObject, PageRow
from transforms.safety.gate import BlocklistCheck, SafetyConfig, quarantined_reuse
from transforms.safety.stage import LoadsChecks

CACHE_COLUMNS = ["tenant", "doc_sha256", "page_index", "page_hash", "cache_key", "config_key", "status",
                 "schema_id", "schema_hash", "model", "model_revision", "extraction", "validation_errors",
                 "flags", "hint_source", "width", "height", "created_at",
                 "pdq_hash",  # issue 16: reused pages are re-checked against today's PDQ lists
                 "pdq_hash_low",  # issue 22: and so is their low-detail rendition, as at the gate
                 # markdown output (older files lack them: read as absent)
                 "markdown", "primary_language", "is_rotation_valid", "rotation_correction", "is_table", "is_diagram",
                 "run_id", "source_uri"]  # a resume's own earlier rows are not another run's (RESUMED)
# The tag of a resume's own pages: a page this run already answered (an invocation killed before the
# document's `documents` row) is not written again (that row stays the page's row) and is counted in the
# document's outcome with its own status: a resumed document is `extracted`, as in an uninterrupted run,
# not `cached` ("reused from an earlier run").
RESUMED = "resumed"


def reusable(row: Mapping[str, Any], tenant: str, config: str) -> bool:
    return row.get("status") in statuses.SUCCESS and row.get("tenant") == tenant and row.get("config_key") == config


def cached_row(earlier: Mapping[str, Any], doc_sha256: str, source_uri: str, page_index: int,
               status: str = statuses.CACHED, route: str = "cache") -> PageRow:
    """A `cached` page: the earlier row's extraction, no model call, zero cost. A resumed page (route
    RESUMED) keeps its own status: it is counted in its document's outcome, never written."""
    return PageRow.of_index(
        doc_sha256, source_uri, page_index, status,
        page_hash=earlier.get("page_hash"), cache_key=earlier.get("cache_key"),
        config_key=earlier.get("config_key"), width=earlier.get("width"), height=earlier.get("height"),
        schema_id=earlier.get("schema_id"), schema_hash=earlier.get("schema_hash"),
        model=earlier.get("model"), model_revision=earlier.get("model_revision"),
        extraction=earlier.get("extraction"),
        validation_errors=tuple(earlier.get("validation_errors") or ()),
        flags=tuple(earlier.get("flags") or ()), hint_source=earlier.get("hint_source") or "none",
        pdq_hash=earlier.get("pdq_hash"), pdq_hash_low=earlier.get("pdq_hash_low"),  # the next run re-checks it
        markdown=earlier.get("markdown"), primary_language=earlier.get("primary_language"),
        is_rotation_valid=earlier.get("is_rotation_valid"),
        rotation_correction=earlier.get("rotation_correction"), is_table=earlier.get("is_table"),
        is_diagram=earlier.get("is_diagram"),
        route=route, message="extraction reused from an earlier run")


def _preferred(row: Mapping[str, Any]) -> tuple[bool, bool, Any]:
    # A row that carries its PDQ hashes can be re-checked; among those, the latest.
    return row.get("pdq_hash") is not None, row.get("pdq_hash_low") is not None, row["created_at"]


def stored_hashes(row: Mapping[str, Any], low_side: int) -> tuple[Any, ...]:
    """What BlocklistCheck.check_page takes, from a stored row: page hash, rendered size, low side, PDQs."""
    size = (row.get("width") or 0, row.get("height") or 0)
    return row.get("page_hash"), size, low_side, row.get("pdq_hash"), row.get("pdq_hash_low")


def unverifiable(row: Mapping[str, Any], lists: BlocklistCheck, low_side: int = 0) -> bool:
    """True when today's lists need a hash that the earlier row does not hold (fail closed)."""
    return lists.lacks_hashes(*stored_hashes(row, low_side))


def document_from_cache(doc: DocumentRecord, earlier: Iterable[Mapping[str, Any]],
                        lists: BlocklistCheck | None = None, low_side: int = 0,
                        run_id: str | None = None) -> list[PageRow] | None:
    """A row for every page of the document from earlier runs' rows, or None if the document must be
    rendered (a page is missing, or cannot be re-checked against `lists`). Each page is re-checked
    against today's `lists` by its stored hashes, as the gate checks a rendered page (`low_side`: the
    gate's low-detail side): a match is a `quarantined` row, else a `cached` copy; a row this run wrote
    for this very object (`run_id`, a resume) keeps its own status (RESUMED). A row this run wrote for a
    twin (another object of the same content) stays a `cached` copy (docs/runners.md, Resuming). Pure."""
    chosen: dict[int, Mapping[str, Any]] = {}
    for row in earlier:
        index = row["page_index"]
        if index not in chosen or _preferred(row) > _preferred(chosen[index]):
            chosen[index] = row
    if any(i not in chosen for i in range(doc.page_count)):
        return None
    out = []
    for i in range(doc.page_count):
        row = chosen[i]
        verdict = None
        if lists is not None:
            if unverifiable(row, lists, low_side):
                return None
            verdict = lists.check_page(*stored_hashes(row, low_side))
        if verdict is not None:
            out.append(quarantined_reuse(row, doc.doc_sha256, doc.uri, i, verdict))
        elif run_id is not None and (row.get("run_id"), row.get("source_uri")) == (run_id, doc.uri):
            out.append(cached_row(row, doc.doc_sha256, doc.uri, i, status=row["status"], route=RESUMED))
        else:
            out.append(cached_row(row, doc.doc_sha256, doc.uri, i))
    return out


class ReadEarlierPages(beam.PTransform):
    """Reusable `pages` rows of earlier runs (and of this run, when resuming) for one tenant and
    cache configuration. `files` is listed by the launcher; no files gives an empty collection."""

    def __init__(self, files: list[str], tenant: str, config: str) -> None:
        super().__init__()
        self.files, self.tenant, self.config = files, tenant, config

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        if not self.files:
            return pbegin | "NoEarlierRuns" >> beam.Create([])
        tenant, config = self.tenant, self.config
        return (
            pbegin
            | "EarlierFiles" >> beam.Create(self.files)
            | "ReadEarlier" >> ReadAllFromParquet(columns=CACHE_COLUMNS)
            | "Reusable" >> beam.Filter(reusable, tenant, config)
        )


class _SplitCachedDocuments(LoadsChecks):
    """Reused rows, re-checked against today's lists (loaded once per worker process); `run_id`: the run's own
    rows (a resume's) are tagged RESUMED."""

    def __init__(self, cfg: SafetyConfig, run_id: str | None = None) -> None:
        super().__init__(cfg)
        self.run_id = run_id

    def process(self, keyed: tuple[str, Mapping[str, list[Any]]]) -> Iterator[Any]:
        grouped = keyed[1]
        earlier = grouped["earlier"]
        for doc in grouped["docs"]:
            rows = document_from_cache(doc, earlier, self.checks.blocklist, self.cfg.low_detail_side, self.run_id) \
                if earlier else None
            if rows is None:
                yield doc
            else:
                for row in rows:
                    yield beam.pvalue.TaggedOutput(RESUMED if row.route == RESUMED else statuses.CACHED, row)


class SkipCachedDocuments(beam.PTransform):
    """Kept DocumentRecords -> those to render (main), and reused PageRows (tag `cached`): `cached`
    copies, or `quarantined` rows of pages that today's blocklists (`safety`) name; with `run_id`, this
    run's own answered pages (tag RESUMED: for the documents' outcomes only, their rows are written)."""

    def __init__(self, earlier: beam.PCollection, safety: SafetyConfig, run_id: str | None = None) -> None:
        super().__init__()
        self.earlier = earlier
        self.safety = safety.lists_only()
        self.run_id = run_id

    def expand(self, docs: beam.PCollection) -> beam.pvalue.DoOutputsTuple:
        earlier = self.earlier | "EarlierBySha" >> beam.Map(lambda r: (r["doc_sha256"], r))
        keyed = docs | "DocsBySha" >> beam.Map(lambda d: (d.doc_sha256, d))
        return (
            {"docs": keyed, "earlier": earlier}
            | "JoinEarlier" >> beam.CoGroupByKey()
            | "Split" >> beam.ParDo(_SplitCachedDocuments(self.safety, self.run_id))
            .with_outputs(statuses.CACHED, RESUMED, main="render")
        )


class SkipDoneDocuments(beam.PTransform):
    """Resuming a run: listed objects that already have a `documents` row in this run are dropped, unless every
    such row is `batch_pending` (a page waits in a hosted batch: pipelines/run/batches.py processes it again)."""

    def __init__(self, done_files: list[str]) -> None:
        super().__init__()
        self.done_files = done_files

    def expand(self, listed: beam.PCollection) -> beam.PCollection:
        if not self.done_files:
            return listed
        done = (
            listed.pipeline
            | "DoneFiles" >> beam.Create(self.done_files)
            | "ReadDone" >> ReadAllFromParquet(columns=["source_uri", "reason_code"])
            | "Finished" >> beam.Filter(lambda r: r["reason_code"] != BATCH_PENDING)
            | "DoneUri" >> beam.Map(lambda r: (r["source_uri"], True))
        )
        by_uri = listed | "ListedByUri" >> beam.Map(lambda o: (o.uri, o))
        return (
            {"listed": by_uri, "done": done}
            | "JoinDone" >> beam.CoGroupByKey()
            | "NotDone" >> beam.FlatMap(_not_done)
        )


def _not_done(keyed: tuple[str, Mapping[str, list[Any]]]) -> Iterator[ListedObject]:
    grouped = keyed[1]
    if not list(grouped["done"]):
        first = next(iter(grouped["listed"]), None)
        if first is not None:
            yield first
