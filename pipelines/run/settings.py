"""RunSettings: every stage's settings, built once from the options by `run_settings(o)`.

The one place that turns PagemillOptions into the stages' settings objects: the graph builder
(pipelines/run/graph.py), the run (pipelines/run/run.py) and the estimate take a RunSettings, never the options'
fields one by one. The cache configuration key is derived from these objects (transforms/model/cache_key.py),
so a new setting joins the key unless it is named in that module's EXCLUDE set.

`option_checks` validates the options before a RunSettings can be built (a bad schema or model folder
is a message there, not an exception here); it reuses `safety_config` below for the blocklist check.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from schemas.records import API_ROUTE_PREFIX
from transforms.document_work.timed import RenderLimits
from transforms.engines.local import EngineSettings
from transforms.extract.stage import ExtractConfig
from transforms.hints.choose import HintSettings
from transforms.hints.ocr import OcrSettings
from transforms.intake.bounds import input_roots
from transforms.intake.inspection import IntakeLimits
from transforms.intake.listing import local_roots
from transforms.intake.reading import ReadConfig
from transforms.model.cache_key import settings_key
from transforms.pages.render import RenderSettings
from transforms.safety.gate import SafetyConfig
from transforms.store.write import FlushPolicy

if TYPE_CHECKING:
    from pipelines.config.options import PagemillOptions
    from transforms.engines.served import EndpointSettings


@dataclass(frozen=True)
class RunSettings:
    """A run's settings, stage by stage. Frozen: built once, read everywhere. `read` holds the run's S3
    keys (their fields are repr=False): a RunSettings is never printed or written to the manifest."""

    inputs: tuple[str, ...]  # --input patterns
    output: str
    tenant: str
    read: ReadConfig  # how intake and rendering read input objects (S3 retries, keys)
    intake: IntakeLimits
    limits: RenderLimits  # the document and page time limits (0: off); intake's page count uses the first
    render_range_pages: int  # large PDFs split into ranges of this many pages (0: never)
    render: RenderSettings
    safety: SafetyConfig
    hints: HintSettings
    engine: EngineSettings
    endpoint: EndpointSettings | None  # --engine openai; None: the vLLM engine
    extract: ExtractConfig | None  # None: a render-only run (--extract false)
    flush: FlushPolicy
    progress_every_s: float


def run_settings(o: PagemillOptions) -> RunSettings:
    """The run's settings from its options; call it once the options are checked (pipelines/run/option_checks.py)
    and the run id is set (the machine engine's folder is named after it). Loads the schema and the prices."""
    render, safety, hints, engine = render_settings(o), safety_config(o), hint_settings(o), engine_settings(o)
    return RunSettings(
        inputs=tuple(o.input or ()), output=o.output, tenant=o.tenant, read=read_config(o),
        intake=IntakeLimits(max_bytes=o.max_bytes, max_pages=o.max_pages, max_image_pixels=o.max_image_pixels),
        limits=RenderLimits(document_timeout_s=o.document_timeout_s, page_timeout_s=o.page_timeout_s),
        render_range_pages=o.render_range_pages, render=render, safety=safety, hints=hints,
        engine=engine, endpoint=endpoint_settings(o) if o.engine == "openai" else None,
        extract=extract_config(o, settings_key(render, safety, hints, engine)) if o.extract else None,
        flush=FlushPolicy(o.flush_rows, o.flush_seconds), progress_every_s=o.progress_every_s)


def read_config(o: Any) -> ReadConfig:
    """From a run's pipeline options (Beam's S3Options hold the storage settings, pipelines/config/storage.py)."""
    from apache_beam.options.pipeline_options import S3Options

    s3 = o.view_as(S3Options)
    return ReadConfig(max_attempts=o.s3_max_attempts, s3_endpoint_url=s3.s3_endpoint_url,
                      s3_region=s3.s3_region_name, s3_access_key_id=s3.s3_access_key_id,
                      s3_secret_access_key=s3.s3_secret_access_key, s3_session_token=s3.s3_session_token,
                      local_roots=local_roots(o.input or ()),  # a file swapped for a link after listing
                      inputs=input_roots(o.input or ()))  # a listed URI outside --input is never read


def render_settings(o: PagemillOptions) -> RenderSettings:
    return RenderSettings(dpi=o.dpi, max_side=o.max_side, jpeg_quality=o.jpeg_quality,
                          max_text_chars=o.max_text_chars, max_page_points=o.max_page_points,
                          max_image_pixels=o.max_image_pixels, max_bytes=o.max_bytes)


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


def machine_engine(o: PagemillOptions) -> bool:
    """One engine per machine (a service process) rather than one per worker process."""
    if o.engine_service != "auto":
        return o.engine_service == "machine"
    from apache_beam.options.pipeline_options import DirectOptions

    direct = o.view_as(DirectOptions)
    return direct.direct_running_mode == "multi_processing" and direct.direct_num_workers != 1


def engine_settings(o: PagemillOptions) -> EngineSettings:
    s = EngineSettings(model=o.model, model_revision=o.model_revision, max_model_len=o.max_model_len,
                       max_num_seqs=o.max_num_seqs, gpu_memory_utilization=o.gpu_memory_utilization,
                       tensor_parallel_size=o.tensor_parallel_size, limit_mm_per_prompt=o.limit_mm_per_prompt,
                       kv_cache_gib=o.kv_cache_gib, enforce_eager=o.enforce_eager, in_process=o.engine_in_process)
    if o.engine != "vllm" or not machine_engine(o):
        return s
    from transforms.engines.machine import service_dir

    return replace(s, service_dir=o.engine_service_dir or service_dir(o.run_id or "", s))


def endpoint_settings(o: PagemillOptions) -> EndpointSettings:
    from transforms.engines.served import EndpointSettings

    return EndpointSettings(endpoint=o.endpoint or "", model=o.model, api_key_env=o.api_key_env,
                            concurrency=max(1, o.concurrency), request_timeout_s=o.request_timeout_s)


def model_route(o: PagemillOptions) -> str:
    """The ledger route of a page sent to the model: how its cost is counted (schemas/records.py ROUTES)."""
    if o.engine != "openai":
        return "model"
    return "served" if o.endpoint_kind == "served" else f"{API_ROUTE_PREFIX}{o.api_price}"


def extract_config(o: PagemillOptions, render_key: str) -> ExtractConfig:
    """`render_key`: the key of the render, gate, hints and engine settings that change a page."""
    from transforms.model.budget import load_prices
    from transforms.model.markdown import load_output
    from transforms.model.token_math import rule_for

    # A served endpoint: its requests in flight, and as many queued behind them in the stage.
    in_flight = o.max_in_flight or (2 * max(1, o.concurrency) if o.engine == "openai" else 0)
    schema, markdown = load_output(o.schema)
    return ExtractConfig(schema=schema, markdown=markdown, tenant=o.tenant, model=o.model,
                         model_revision=o.model_revision, render_key=render_key,
                         model_family=rule_for(o.model_family, o.model),
                         max_model_len=o.max_model_len, max_tokens=o.max_tokens, max_attempts=o.max_attempts,
                         max_in_flight=in_flight, prompt_layout=o.prompt_layout, answer_timeout_s=o.answer_timeout_s,
                         gpu_hourly_usd=o.gpu_hourly_usd, api_price=o.api_price, prices=load_prices(),
                         route=model_route(o))
