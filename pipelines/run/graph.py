"""build_pipeline(p, settings, run): the run's graph (list, intake, safety, dedup, cache, render, hints, extract,
outcomes, write), stage by stage, and nothing else. The stages' settings come built from the options, once
(pipelines/run/settings.py)."""
from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import apache_beam as beam

from pipelines.run.settings import RunSettings
from schemas.records import PageImage, PageRow
from schemas.statuses import CACHED, REJECTED, RENDERED
from transforms.document_work.timed import TimedRenderPagesDoFn
from transforms.document_work.work import PageStages
from transforms.engines import make  # the engine's modules (vLLM, the HTTP client) are imported by workers only
from transforms.extract.stage import EngineFactory, ExtractPages
from transforms.hints.choose import Ocr
from transforms.hints.stage import HintsDoFn
from transforms.intake.accept import IntakeDoFn
from transforms.intake.dedup import DUPLICATES, DedupDocuments, SkipEarlierWaves
from transforms.intake.inspection import PageCounter, count_pages
from transforms.intake.listing import ListObjects
from transforms.intake.reading import ObjectReader
from transforms.intake.timed import TimedIntakeDoFn
from transforms.output.cache import RESUMED, ReadEarlierPages, SkipCachedDocuments, SkipDoneDocuments
from transforms.output.outcome import DocumentOutcomes
from transforms.pages.ranges import SplitPageRanges
from transforms.pages.render import FAILED_PAGES
from transforms.pages.stage import RenderPagesDoFn
from transforms.safety.gate import QUARANTINED
from transforms.safety.stage import DocumentGateDoFn, SafetyGateDoFn
from transforms.store.write import PART_PREFIX, WriteTables


def intake_dofn(s: RunSettings, count: PageCounter = count_pages) -> IntakeDoFn:
    """Intake; with --document-timeout-s, its page count (opening the document) runs in a child process
    killed at that limit (transforms/intake/timed.py); with it 0, in this process."""
    if s.limits.document_timeout_s > 0:
        return TimedIntakeDoFn(s.intake, s.limits.document_timeout_s, ObjectReader(s.read), count)
    return IntakeDoFn(s.intake, ObjectReader(s.read))


def render_dofn(s: RunSettings, ocr: Ocr | None = None) -> RenderPagesDoFn:
    """Rendering, the safety gate and the hints in a worker process under the time limits
    (transforms/document_work/work.py); with both limits off, rendering alone, in this process."""
    if s.limits.enabled:
        return TimedRenderPagesDoFn(s.render, s.limits, reader=ObjectReader(s.read),
                                    stages=PageStages(s.safety, s.hints, ocr))
    return RenderPagesDoFn(s.render, ObjectReader(s.read))


def rendered_only(page: PageImage) -> PageRow:
    """A page of a render-only run (`--extract false`): accounted for, no model, no cost; it left the CPU
    stages now (the extract stage stamps the pages it gets the same way)."""
    return PageRow.of_page(page, RENDERED, route="none", rendered_at=page.rendered_at or dt.datetime.now(dt.UTC))


def extract_pages(pages: beam.PCollection, s: RunSettings, earlier: beam.PCollection,
                  engine_factory: EngineFactory = make) -> beam.PCollection:
    """PageImage -> PageRow. The model stage plugs in here; `s.extract` is None in a render-only run. The engine
    is made from the run's one engine slot, by its kind (transforms.engines.make)."""
    if s.extract is None:
        return pages | "RenderedOnly" >> beam.Map(rendered_only)
    return pages | "Extract" >> ExtractPages(s.engine, s.extract, engine_factory, earlier=earlier)


def build_pipeline(p: beam.Pipeline, s: RunSettings, run: Mapping[str, Any],
                   earlier_files: Sequence[str] = (), done_files: Sequence[str] = (),
                   modified_since: float | None = None, modified_until: float | None = None, *,
                   engine_factory: EngineFactory = make, ocr: Ocr | None = None,
                   intake_count: PageCounter = count_pages, listing: beam.PTransform | None = None,
                   earlier_kept: Sequence[str] = (), prefix: str = PART_PREFIX) -> None:
    """`s`: the run's settings (pipelines/run/settings.py). `earlier_files`: `pages` files under the output root
    (the result cache; empty with --force); `done_files`: this run id's (this wave's) `documents` files when
    resuming. `engine_factory` and `ocr` replace the vLLM engine and Tesseract (tests put probes there);
    `intake_count` intake's page counter under the time limit (tests put a hanging one there). A wave
    (pipelines/run/waves.py) passes its `listing` (its part of the run's written listing), the `documents` files
    of the run's earlier waves (`earlier_kept`: their kept copies make this wave's copies duplicates) and
    its part files' `prefix`; without them the graph lists the inputs itself (one pipeline, `--wave-objects 0`).
    Progress is watched by the launcher (pipelines/run/progress.py), not by a step of the graph: a step
    fed by side inputs runs after the stages that make them, at the end."""
    listed = (
        p
        | "List" >> (listing or ListObjects(s.inputs, modified_since, modified_until))
        | "SkipDone" >> SkipDoneDocuments(list(done_files))
    )
    intake = (listed | "Intake" >> beam.ParDo(intake_dofn(s, intake_count))
              .with_outputs(REJECTED, main="accepted"))
    # Blocklisted documents stop here, before dedup (every copy is quarantined) and before rendering.
    gated = (
        intake.accepted
        | "DocumentGate" >> beam.ParDo(DocumentGateDoFn(s.safety)).with_outputs(QUARANTINED, main="clean")
    )
    dedup = gated.clean | "DedupDocuments" >> DedupDocuments()
    duplicates = (dedup[DUPLICATES],)
    if earlier_kept:
        across = dedup.kept | "EarlierWaves" >> SkipEarlierWaves(earlier_kept)
        dedup, duplicates = across, (*duplicates, across[DUPLICATES])
    to_render, cached, resumed = dedup.kept, None, None
    earlier = p | "NoEarlier" >> beam.Create([])
    if s.extract is not None and earlier_files:
        earlier = p | "EarlierPages" >> ReadEarlierPages(list(earlier_files), s.tenant, s.extract.config_key)
        # Reused rows are re-checked against today's blocklists here, before anything is rendered.
        split = dedup.kept | "DocumentCache" >> SkipCachedDocuments(earlier, s.safety, run["run_id"])
        to_render, cached, resumed = split.render, split[CACHED], split[RESUMED]
    render = render_dofn(s, ocr)
    rendered = (
        to_render
        | "PageRanges" >> SplitPageRanges(s.render_range_pages)
        | "RenderPages" >> beam.ParDo(render).with_outputs(FAILED_PAGES, main="pages")
    )
    parts: tuple[beam.PCollection, ...] = (rendered[FAILED_PAGES],)
    if s.limits.enabled:  # gated and hinted in the render worker, under the limits
        hinted = rendered.pages
    else:
        safe = (
            rendered.pages
            | "SafetyGate" >> beam.ParDo(SafetyGateDoFn(s.safety)).with_outputs(QUARANTINED, main="clean")
        )
        hinted = safe.clean | "Hints" >> beam.ParDo(HintsDoFn(s.hints, ocr))
        parts += (safe[QUARANTINED],)
    extracted = extract_pages(hinted, s, earlier, engine_factory)
    parts += (extracted,) + ((cached,) if cached is not None else ())
    pages = parts | "AllPages" >> beam.Flatten()
    # A resume's own answered pages count in their documents' outcomes; their rows are written already.
    counted = pages if resumed is None else (pages, resumed) | "WithResumed" >> beam.Flatten()
    kept = counted | "Outcomes" >> DocumentOutcomes(dedup.kept)
    documents = (intake[REJECTED], gated[QUARANTINED], *duplicates, kept) | "AllDocuments" >> beam.Flatten()
    _ = documents | "Write" >> WriteTables(s.output, run, pages, s.flush, prefix)
