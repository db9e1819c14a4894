"""Extract: pages stream into one engine per process, JSON-schema-constrained decoding.

No barrier before the model: each page is looked up as it arrives, then submitted at once.
- an earlier run's reusable row for the page's cache key (a side input of key -> row, read from
  earlier `pages` files: no page image crosses a shuffle) gives a `cached` row at zero cost;
- a key already done or in flight in this worker process gives a `duplicate` row once the first
  page's result is back (the copy waits, it is not sent; zero cost);
- any other page is prepared and submitted to the process's engine feed (transforms/extract/feed.py),
  which keeps a bounded number of pages in flight; rows are emitted as results come back, and a
  bundle's last pages are drained in finish_bundle.
Copies of one page handled by different worker processes of a run may both reach the model: both
rows then say `route = model`, and the ledger counts both. Every page ends as a row: ok, invalid,
failed or duplicate, never an exception across the pipeline.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows
from apache_beam.utils import shared

from schemas.records import API_ROUTE_PREFIX, ExtractionResult, PageImage, PageRow, PageTask
from schemas.statuses import DUPLICATE, OK
from transforms.engines import EngineChoice, make
from transforms.engines.base import PageEngine
from transforms.extract.config import ExtractConfig as ExtractConfig  # the stage's configuration, re-exported
from transforms.extract.feed import PageFeed
from transforms.model import budget, token_math
from transforms.model.evidence import with_evidence
from transforms.model.markdown import front_matter_columns
from transforms.model.postfilter import OutputFlags, markdown_flags, output_flags
from transforms.model.prompt import SYSTEM_PROMPT, cache_key
from transforms.output.cache import cached_row

# Makes the engine from the run's engine settings: transforms.engines.make, or a test's or benchmark's engine.
EngineFactory = Callable[[Any], PageEngine]


def in_flight_limit(cfg: ExtractConfig, sequences: int) -> int:
    """Pages in flight per engine: about twice the `sequences` it runs at once (the engine says), so that
    continuous batching always has the next pages queued. Pure."""
    if cfg.max_in_flight > 0:
        return cfg.max_in_flight
    return 2 * max(1, sequences)


def make_task(page: PageImage, cfg: ExtractConfig) -> tuple[str, PageTask]:
    """Key a page by everything that can change its extraction. Pure. The hint is the hints stage's
    (already capped, fenced-marker free and scanned); a page sent at low detail is a different image."""
    hint = page.hint
    image_key = page.page_hash if not page.detail_side else f"{page.page_hash}@{page.detail_side}"
    key = cache_key(image_key, cfg.config_key, hint)
    return key, PageTask(page=page, cache_key=key, hint=hint)


def to_rows(result: Any, cfg: ExtractConfig) -> Iterator[PageRow]:
    """`result` is (task, ExtractionResult) (a PredictionResult or a tuple): the extracted page's row. A page
    that shared its key gets `copy_row`."""
    task, r = (result.example, result.inference) if hasattr(result, "inference") else result
    page = task.page
    # A page the model never saw would cost nothing at a hosted API either; one the model saw costs its image
    # under --api-price's own image rule (budget.hosted_cost, as `pagemill estimate` prices it).
    api_usd = budget.hosted_cost(cfg.api_price, r.sent_width or page.width, r.sent_height or page.height,
                                 r.text_tokens, r.output_tokens, cfg.prices) if r.attempts else 0.0
    out = result_flags(r, cfg)
    saved = 0
    if page.detail_side and r.image_tokens:  # sent at low detail: what full detail would have cost more
        saved = max(0, token_math.estimate_image_tokens(cfg.model_family, page.width, page.height) - r.image_tokens)
    row = PageRow.of_page(page, r.status, route=cfg.route if r.attempts else "failed",
                          image_tokens=r.image_tokens, text_tokens=r.text_tokens, output_tokens=r.output_tokens,
                          attempts=r.attempts, gpu_seconds=r.gpu_seconds, cost_usd=page_cost_usd(r, cfg),
                          api_equivalent_usd=api_usd,
                          flags=tuple(dict.fromkeys(page.flags + r.flags + out.flags)),
                          flag_detail=page.flag_detail + out.notes, image_tokens_saved=saved,
                          cached_prompt_tokens=r.cached_prompt_tokens, stop_reason=r.stop_reason,
                          extracted_at=r.finished_at, **_common(task, r, cfg))
    yield evidence_of(cfg, page, row, r.quotes)


def page_cost_usd(r: ExtractionResult, cfg: ExtractConfig) -> float:
    """What a page sent to the model cost: its share of the engine's (or the served endpoint's) busy time at
    --gpu-hourly-usd, or a hosted API's list price for the tokens its `usage` reported. Pure."""
    if cfg.route.startswith(API_ROUTE_PREFIX):
        provider = cfg.route.removeprefix(API_ROUTE_PREFIX)
        return budget.api_cost_usd(provider, r.image_tokens + r.text_tokens, r.output_tokens, cfg.prices)
    return r.gpu_seconds * cfg.gpu_hourly_usd / 3600.0


def copy_row(copy: PageImage, task: PageTask, r: ExtractionResult, cfg: ExtractConfig) -> PageRow:
    """A page that shares `task`'s key: its result, at zero cost. Pure."""
    out = result_flags(r, cfg)
    status = DUPLICATE if r.status == OK else r.status
    done = max((t for t in (r.finished_at, copy.rendered_at) if t is not None), default=None)
    row = PageRow.of_page(copy, status, route="duplicate",
                          flags=tuple(dict.fromkeys(copy.flags + r.flags + out.flags)),
                          flag_detail=copy.flag_detail + out.notes, extracted_at=done,
                          **_common(task, r, cfg))
    return evidence_of(cfg, copy, row, r.quotes)


def evidence_of(cfg: ExtractConfig, page: PageImage, row: PageRow,
                quotes: tuple[tuple[str, str], ...] = ()) -> PageRow:
    """The row with the evidence of its JSON answer on `page` (transforms/model/evidence.py), and of the model's
    `quotes` (--evidence-quotes; a reused row has none: its values are looked for); markdown is no answer of
    fields."""
    return row if cfg.markdown is not None else with_evidence(row, page.words, quotes)


def result_flags(r: ExtractionResult, cfg: ExtractConfig) -> OutputFlags:
    """The post-filter's flags: on the JSON extraction, or on a markdown page's front matter and text."""
    if cfg.markdown is None:
        return output_flags(r.extraction, cfg.schema.schema, SYSTEM_PROMPT)
    fm = output_flags(r.extraction, cfg.schema.schema, cfg.markdown.system_prompt)
    md = markdown_flags(r.markdown, cfg.markdown.system_prompt)
    return OutputFlags(tuple(dict.fromkeys(fm.flags + md.flags)), tuple(dict.fromkeys(fm.notes + md.notes)))


def _common(task: PageTask, r: ExtractionResult, cfg: ExtractConfig) -> dict[str, Any]:
    markdown = {}
    if cfg.markdown is not None:
        markdown = {"markdown": r.markdown, **(front_matter_columns(r.extraction) if cfg.markdown.front_matter
                                               and r.status == OK else {})}
    return {**markdown, "cache_key": task.cache_key, "config_key": cfg.config_key, "schema_id": cfg.schema.schema_id,
            "schema_hash": cfg.schema.schema_hash, "model": cfg.model, "model_revision": cfg.model_revision,
            "extraction": r.extraction, "validation_errors": r.validation_errors, "reason_code": r.reason_code,
            "message": r.message}


@dataclass
class _Pending:
    task: PageTask  # the page without its image bytes
    result: Future[ExtractionResult]
    first: bool  # this page went to the model; else it is a copy of one that did


class StreamExtractDoFn(beam.DoFn):
    """PageImage -> PageRow as results come back; one engine feed per worker process."""

    def __init__(self, engine: EngineChoice, cfg: ExtractConfig, engine_factory: EngineFactory) -> None:
        self.engine = engine
        self.cfg = cfg
        self.engine_factory = engine_factory
        self._shared = shared.Shared()  # one feed (and engine) per process, whatever the thread count

    def setup(self) -> None:
        def build() -> PageFeed:
            engine = self.engine_factory(self.engine)
            return PageFeed(engine, self.cfg, in_flight_limit(self.cfg, engine.sequences()))

        self._feed = self._shared.acquire(build)
        self._feed.attach()

    def teardown(self) -> None:
        # The last DoFn instance of the process stops the engine, so a finished pipeline frees its memory.
        feed = getattr(self, "_feed", None)
        if feed is not None:
            feed.detach()

    def start_bundle(self) -> None:
        self._pending: list[_Pending] = []

    def process(self, page: PageImage, earlier: Mapping[str, Mapping[str, Any]]) -> Iterator[PageRow]:
        now = dt.datetime.now(dt.UTC)
        page = replace(page, rendered_at=page.rendered_at or now)
        key, task = make_task(page, self.cfg)
        row = earlier.get(key)
        if row is not None:
            cached = cached_row(row, page.doc_sha256, page.source_uri, page.page_index)
            # The hashes the gate just computed, so the next run's reuse can re-check this copy (cache.py).
            yield evidence_of(self.cfg, page, replace(cached, rendered_at=page.rendered_at, extracted_at=now,
                                                      pdq_hash=page.pdq_hash, pdq_hash_low=page.pdq_hash_low))
            return
        result, first = self._feed.claim(key)
        if first:
            # The window is full: emit what is done while waiting for a slot.
            while not self._feed.slots.acquire(timeout=0.05):
                yield from self._ready()
            self._feed.start(task, result)
        self._pending.append(_Pending(replace(task, page=replace(task.page, image=b"")), result, first))
        yield from self._ready()

    def _ready(self) -> Iterator[PageRow]:
        if not any(p.result.done() for p in self._pending):
            return
        waiting = []
        for p in self._pending:
            if p.result.done():
                yield from self._rows(p)
            else:
                waiting.append(p)
        self._pending = waiting

    def _rows(self, p: _Pending) -> Iterator[PageRow]:
        r = p.result.result()
        if p.first:
            yield from to_rows((p.task, r), self.cfg)
        else:
            yield copy_row(p.task.page, p.task, r, self.cfg)

    def finish_bundle(self) -> Iterator[Any]:
        pending, self._pending = self._pending, []
        for p in pending:
            p.result.result()  # every claimed page ends with a result (transforms.extract.feed's promise)
            for row in self._rows(p):
                yield GlobalWindows.windowed_value(row)


def _latest(rows: list[Mapping[str, Any]]) -> Mapping[str, Any]:
    return max(rows, key=lambda r: r["created_at"])


class ExtractPages(beam.PTransform):
    """PageImage -> PageRow: reused from earlier runs by cache key, else through the engine once per
    key and process. `earlier` holds earlier runs' reusable `pages` rows (cache.ReadEarlierPages). The engine
    is `engine_factory(engine)`: the run's one engine slot says which (transforms.engines.make, by its kind)."""

    def __init__(self, engine: EngineChoice, cfg: ExtractConfig, engine_factory: EngineFactory = make,
                 earlier: beam.PCollection | None = None) -> None:
        super().__init__()
        self.engine = engine
        self.cfg = cfg
        self.engine_factory = engine_factory
        self.earlier = earlier

    def expand(self, pages: beam.PCollection) -> beam.PCollection:
        earlier = self.earlier if self.earlier is not None else pages.pipeline | "NoEarlier" >> beam.Create([])
        # Only earlier rows are grouped (small, text only); the side input is one map per worker.
        by_key = (
            earlier
            | "EarlierByKey" >> beam.Map(lambda r: (r["cache_key"], r))
            | "LatestPerKey" >> beam.CombinePerKey(_latest)
        )
        dofn = StreamExtractDoFn(self.engine, self.cfg, self.engine_factory)
        return pages | "Stream" >> beam.ParDo(dofn, earlier=beam.pvalue.AsDict(by_key))
