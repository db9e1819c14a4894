"""build_pipeline(p, opts, run): the graph of DESIGN.md, stage by stage, and nothing else."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import apache_beam as beam

from pipelines.options import PagemillOptions
from schemas.records import PageImage, PageRow
from transforms.cache import CACHED, ReadEarlierPages, SkipCachedDocuments, SkipDoneDocuments
from transforms.dedup import DUPLICATES, DedupDocuments
from transforms.engine import Engine, EngineSettings
from transforms.extract import EngineFactory, ExtractConfig, ExtractPages  # vLLM is imported by workers only
from transforms.hints import HintsDoFn, HintSettings, Ocr
from transforms.inspection import PageCounter, count_pages
from transforms.intake import REJECTED, IntakeDoFn, IntakeLimits, ListObjects
from transforms.intake_worker import TimedIntakeDoFn
from transforms.ocr import OcrSettings
from transforms.outcome import DocumentOutcomes
from transforms.page_ranges import SplitPageRanges
from transforms.page_work import PageStages
from transforms.pages import FAILED_PAGES, RenderPagesDoFn, RenderSettings
from transforms.reading import ObjectReader, read_config
from transforms.render_worker import RenderLimits, TimedRenderPagesDoFn
from transforms.safety import QUARANTINED, DocumentGateDoFn, SafetyConfig, SafetyGateDoFn
from transforms.write import FlushPolicy, ProgressDoFn, WriteTables

if TYPE_CHECKING:
    from transforms.engine_openai import EndpointSettings


def intake_limits(o: PagemillOptions) -> IntakeLimits:
    return IntakeLimits(max_bytes=o.max_bytes, max_pages=o.max_pages, max_image_pixels=o.max_image_pixels)


def intake_dofn(o: PagemillOptions, count: PageCounter = count_pages) -> IntakeDoFn:
    """Intake; with --document-timeout-s, its page count (opening the document) runs in a child process
    killed at that limit (transforms/intake_worker.py); with it 0, in this process."""
    if o.document_timeout_s > 0:
        return TimedIntakeDoFn(intake_limits(o), o.document_timeout_s, object_reader(o), count)
    return IntakeDoFn(intake_limits(o), object_reader(o))


def render_settings(o: PagemillOptions) -> RenderSettings:
    return RenderSettings(dpi=o.dpi, max_side=o.max_side, jpeg_quality=o.jpeg_quality,
                          max_text_chars=o.max_text_chars, max_page_points=o.max_page_points,
                          max_image_pixels=o.max_image_pixels, max_bytes=o.max_bytes)


def object_reader(o: PagemillOptions) -> ObjectReader:
    """How intake and rendering read input objects: explicit S3 retries (transforms/reading.py)."""
    return ObjectReader(read_config(o, o.s3_max_attempts))


def render_dofn(o: PagemillOptions, ocr: Ocr | None = None) -> RenderPagesDoFn:
    """Rendering, the safety gate and the hints in a worker process under the time limits
    (transforms/page_work.py); with both limits off, rendering alone, in this process."""
    limits = RenderLimits(document_timeout_s=o.document_timeout_s, page_timeout_s=o.page_timeout_s)
    if limits.enabled:
        return TimedRenderPagesDoFn(render_settings(o), limits, reader=object_reader(o),
                                    stages=PageStages(safety_config(o), hint_settings(o), ocr))
    return RenderPagesDoFn(render_settings(o), object_reader(o))


def rendered_only(page: PageImage) -> PageRow:
    """A page of a render-only run (`--extract false`): accounted for, no model, no cost."""
    return PageRow(doc_sha256=page.doc_sha256, source_uri=page.source_uri, page_index=page.page_index,
                   status="rendered", page_hash=page.page_hash, width=page.width, height=page.height,
                   hint_source=page.hint_source, route="none", hint=page.hint or None,
                   hint_coverage=page.hint_coverage, detail=page.detail, flags=page.flags,
                   flag_detail=page.flag_detail, pdq_hash=page.pdq_hash)


def extract_pages(pages: beam.PCollection, o: PagemillOptions, cfg: ExtractConfig | None,
                  earlier: beam.PCollection,
                  engine_factory: EngineFactory = Engine) -> beam.PCollection:
    """PageImage -> PageRow. The model stage plugs in here; `cfg` is None in a render-only run."""
    if cfg is None:
        return pages | "RenderedOnly" >> beam.Map(rendered_only)
    settings = engine_settings(o)
    if engine_factory is Engine and o.engine == "openai":
        from functools import partial

        from transforms.engine_openai import OpenAIEngine

        engine_factory = partial(OpenAIEngine, endpoint_settings(o))
    elif engine_factory is Engine and settings.service_dir:
        from transforms.engine_remote import RemoteEngine

        engine_factory = RemoteEngine
    return pages | "Extract" >> ExtractPages(settings, cfg, engine_factory, earlier=earlier)


def machine_engine(o: PagemillOptions) -> bool:
    """One engine per machine (a service process) rather than one per worker process."""
    if o.engine_service != "auto":
        return o.engine_service == "machine"
    from apache_beam.options.pipeline_options import DirectOptions

    direct = o.view_as(DirectOptions)
    return direct.direct_running_mode == "multi_processing" and direct.direct_num_workers != 1


def safety_config(o: PagemillOptions) -> SafetyConfig:
    return SafetyConfig(blocklists=tuple(o.blocklist or ()), pdq_threshold=o.pdq_threshold,
                        nsfw_classifier=o.nsfw_classifier, nsfw_threshold=o.nsfw_threshold,
                        checks=tuple(o.safety_check or ()),
                        low_detail_side=o.low_detail_side if o.extract and o.detail != "high" else 0)


def hint_settings(o: PagemillOptions) -> HintSettings:
    return HintSettings(mode=o.hints, ocr=OcrSettings(lang=o.ocr_lang, timeout_s=o.ocr_timeout_s),
                        min_text_coverage=o.min_text_coverage, detail=o.detail, low_detail_side=o.low_detail_side,
                        injection_policy=o.injection_policy, max_hint_chars=o.max_hint_chars,
                        allow_ocr=o.extract or o.hints == "ocr")


def engine_settings(o: PagemillOptions) -> EngineSettings:
    s = EngineSettings(model=o.model, model_revision=o.model_revision, max_model_len=o.max_model_len,
                       max_num_seqs=o.max_num_seqs, gpu_memory_utilization=o.gpu_memory_utilization,
                       tensor_parallel_size=o.tensor_parallel_size, limit_mm_per_prompt=o.limit_mm_per_prompt,
                       kv_cache_gib=o.kv_cache_gib, enforce_eager=o.enforce_eager, in_process=o.engine_in_process)
    if o.engine != "vllm" or not machine_engine(o):
        return s
    from dataclasses import replace

    from transforms.engine_remote import service_dir

    return replace(s, service_dir=o.engine_service_dir or service_dir(o.run_id or "", s))


def endpoint_settings(o: PagemillOptions) -> EndpointSettings:
    from transforms.engine_openai import EndpointSettings

    return EndpointSettings(endpoint=o.endpoint or "", model=o.model, api_key_env=o.api_key_env,
                            concurrency=max(1, o.concurrency), request_timeout_s=o.request_timeout_s,
                            model_family=o.model_family)


def model_route(o: PagemillOptions) -> str:
    """The ledger route of a page sent to the model: how its cost is counted (schemas/records.py ROUTES)."""
    if o.engine != "openai":
        return "model"
    return "served" if o.endpoint_kind == "served" else f"api:{o.api_price}"


def extract_config(o: PagemillOptions) -> ExtractConfig:
    from transforms.budget import load_prices
    from transforms.outputs import load_output
    from transforms.token_math import rule_for

    # A served endpoint: its requests in flight, and as many queued behind them in the stage.
    in_flight = o.max_in_flight or (2 * max(1, o.concurrency) if o.engine == "openai" else 0)
    schema, markdown = load_output(o.schema)
    return ExtractConfig(schema=schema, markdown=markdown, tenant=o.tenant, model=o.model,
                         model_revision=o.model_revision, render_key=render_key(o),
                         model_family=rule_for(o.model_family, o.model),
                         max_model_len=o.max_model_len, max_tokens=o.max_tokens, max_attempts=o.max_attempts,
                         max_hint_chars=o.max_hint_chars, max_in_flight=in_flight,
                         gpu_hourly_usd=o.gpu_hourly_usd, api_price=o.api_price, prices=load_prices(),
                         route=model_route(o))


def render_key(o: PagemillOptions) -> str:
    """The settings that change a page's pixels (so its page hash) are part of the cache configuration,
    and so are those that choose its hint and the detail it is sent at, and the safety gate's settings
    that a stored row cannot be re-checked against (transforms/cache.py states the rule)."""
    return f"dpi={o.dpi};max_side={o.max_side};jpeg={o.jpeg_quality};{hints_key(o)};{safety_key(o)}"


def safety_key(o: PagemillOptions) -> str:
    return safety_config(o).cache_key()


def hints_key(o: PagemillOptions) -> str:
    return (f"hints={o.hints};ocr={o.ocr_lang};coverage={o.min_text_coverage};detail={o.detail}:{o.low_detail_side};"
            f"injection={o.injection_policy}")


def build_pipeline(p: beam.Pipeline, o: PagemillOptions, run: Mapping[str, Any],
                   earlier_files: Sequence[str] = (), done_files: Sequence[str] = (),
                   modified_since: float | None = None, modified_until: float | None = None, *,
                   engine_factory: EngineFactory = Engine, ocr: Ocr | None = None,
                   intake_count: PageCounter = count_pages) -> None:
    """`earlier_files`: `pages` files under the output root (the result cache; empty with --force);
    `done_files`: this run id's `documents` files when resuming. `engine_factory` and `ocr` replace
    the vLLM engine and Tesseract (tests put probes there); `intake_count` intake's page counter under the
    time limit (tests put a hanging one there)."""
    listed = (
        p
        | "List" >> ListObjects(o.input, modified_since, modified_until)
        | "SkipDone" >> SkipDoneDocuments(list(done_files))
    )
    intake = (listed | "Intake" >> beam.ParDo(intake_dofn(o, intake_count))
              .with_outputs(REJECTED, main="accepted"))
    # Blocklisted documents stop here, before dedup (every copy is quarantined) and before rendering.
    gated = (
        intake.accepted
        | "DocumentGate" >> beam.ParDo(DocumentGateDoFn(safety_config(o))).with_outputs(QUARANTINED, main="clean")
    )
    dedup = gated.clean | "DedupDocuments" >> DedupDocuments()
    to_render, cached = dedup.kept, None
    earlier = p | "NoEarlier" >> beam.Create([])
    cfg = extract_config(o) if o.extract else None  # built once: it loads the schema and the prices
    if cfg is not None and earlier_files:
        earlier = p | "EarlierPages" >> ReadEarlierPages(list(earlier_files), o.tenant, cfg.config_key)
        # Reused rows are re-checked against today's blocklists here, before anything is rendered.
        split = dedup.kept | "DocumentCache" >> SkipCachedDocuments(earlier, safety_config(o))
        to_render, cached = split.render, split[CACHED]
    render = render_dofn(o, ocr)
    rendered = (
        to_render
        | "PageRanges" >> SplitPageRanges(o.render_range_pages)
        | "RenderPages" >> beam.ParDo(render).with_outputs(FAILED_PAGES, main="pages")
    )
    parts: tuple[beam.PCollection, ...] = (rendered[FAILED_PAGES],)
    if isinstance(render, TimedRenderPagesDoFn):  # gated and hinted in the render worker, under the limits
        hinted = rendered.pages
    else:
        safe = (
            rendered.pages
            | "SafetyGate" >> beam.ParDo(SafetyGateDoFn(safety_config(o))).with_outputs(QUARANTINED, main="clean")
        )
        hinted = safe.clean | "Hints" >> beam.ParDo(HintsDoFn(hint_settings(o), ocr))
        parts += (safe[QUARANTINED],)
    extracted = extract_pages(hinted, o, cfg, earlier, engine_factory)
    parts += (extracted,) + ((cached,) if cached is not None else ())
    pages = parts | "AllPages" >> beam.Flatten()
    kept = pages | "Outcomes" >> DocumentOutcomes(dedup.kept)
    documents = (intake[REJECTED], gated[QUARANTINED], dedup[DUPLICATES], kept) | "AllDocuments" >> beam.Flatten()
    _ = documents | "Write" >> WriteTables(o.output, run, pages, FlushPolicy(o.flush_rows, o.flush_seconds))
    listed_count = listed | "CountListed" >> beam.combiners.Count.Globally()
    pages_total = (dedup.kept | "PageCounts" >> beam.Map(lambda d: d.page_count)
                   | "SumPages" >> beam.CombineGlobally(sum))
    _ = (
        (documents, pages)
        | "Progress" >> beam.Flatten()
        | "Report" >> beam.ParDo(ProgressDoFn(o.progress_every_s), listed=beam.pvalue.AsSingleton(listed_count),
                                 pages_total=beam.pvalue.AsSingleton(pages_total))
    )
