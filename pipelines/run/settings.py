"""RunSettings: every stage's settings, checked and built in one pass from the options by `settings_from_options(o)`.

The one place that turns PagemillOptions into the stages' settings objects: the graph builder
(pipelines/run/graph.py), the run (pipelines/run/run.py) and the estimate take a RunSettings, never the options'
fields one by one. The pass loads what the options name once each (the schema or markdown format, the model's
image-token rule, the blocklists for their check) and reports a bad one as a problem line (exit 2), not an
exception. The cache configuration key is derived from these objects (transforms/model/cache_key.py), so a new
setting joins the key unless it is named in that module's EXCLUDE set.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pipelines.config.engine import engine_settings, max_in_flight, model_route, resolved_engine, vllm_settings
from pipelines.run.option_checks import check_options, epoch
from schemas.run_place import RunPlace
from transforms.document_work.timed import RenderLimits
from transforms.extract.config import ExtractConfig
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
    from schemas.extraction import ExtractionSchema
    from transforms.engines import EngineChoice
    from transforms.model.markdown import MarkdownFormat
    from transforms.model.token_math import ImageTokenRule


@dataclass(frozen=True)
class RunSettings:
    """A run's settings, stage by stage. Frozen: built once, read everywhere. `read` holds the run's S3
    keys (their fields are repr=False): a RunSettings is never printed or written to the manifest."""

    inputs: tuple[str, ...]  # --input patterns
    # --modified-since, --modified-until (epoch s); a run narrows it by --since-last-run (run.listing_window)
    window: tuple[float | None, float | None]
    place: RunPlace  # which run: output root, tenant, run id (made once, schemas/run_place.py)
    read: ReadConfig  # how intake and rendering read input objects (S3 retries, keys)
    intake: IntakeLimits
    limits: RenderLimits  # the document and page time limits (0: off); intake's page count uses the first
    render_range_pages: int  # large PDFs split into ranges of this many pages (0: never)
    render: RenderSettings
    safety: SafetyConfig
    hints: HintSettings
    # The one engine slot (pipelines/config/engine.py): vllm_local, vllm_machine, openai or simulated settings;
    # transforms.engines.make builds the engine by its kind.
    engine: EngineChoice
    extract: ExtractConfig | None  # None: a render-only run (--extract false)
    flush: FlushPolicy
    progress_every_s: float

    @property
    def output(self) -> str:
        return self.place.output

    @property
    def tenant(self) -> str:
        return self.place.tenant


@dataclass(frozen=True)
class Loaded:
    """What the options name in files, read once a build: the output (a JSON schema, or a markdown format and its
    front matter's schema) and --model's image-token rule."""

    schema: ExtractionSchema
    markdown: MarkdownFormat | None
    rule: ImageTokenRule


def settings_from_options(o: PagemillOptions, *, checks: bool = True, extract: bool | None = None,
                          place: RunPlace | None = None) -> RunSettings | list[str]:
    """Check, load and build in one pass: the run's settings, or the problems that stop it (one line each, the
    run exits 2 before anything is written). `place`: which run (made once by the run, its id new unless --run-id
    names one: the machine engine's folder is named after it; default the options', with --run-id or none).
    `checks=False`: only what the build itself loads is checked (the estimate, tests and benchmarks: no endpoint,
    paths, catalog or safety lists of a run). `extract`: build the extraction settings or not (default --extract;
    the estimate wants what a run that extracts would use even with --extract false)."""
    safety = safety_config(o)
    problems = check_options(o) if checks else []
    if checks:
        from transforms.safety.gate import check_config

        problems += check_config(safety)  # a bad blocklist fails here, not on a worker
    loaded = None
    if o.extract if extract is None else extract:
        loaded, load_problems = load_files(o)
        problems += load_problems + (output_problems(o, loaded) if checks else [])
    if problems:
        return problems
    place = place or RunPlace(o.output, o.tenant, o.run_id or "")
    render, hints, engine = render_settings(o), hint_settings(o), engine_settings(o, place.run_id)
    extract_settings = None
    if loaded is not None:
        extract_settings = extract_config(o, loaded, render_key(render, safety, hints, o))
    return RunSettings(
        inputs=tuple(o.input or ()), window=(epoch(o.modified_since), epoch(o.modified_until)), place=place,
        read=read_config(o),
        intake=IntakeLimits(max_bytes=o.max_bytes, max_pages=o.max_pages, max_image_pixels=o.max_image_pixels),
        limits=RenderLimits(document_timeout_s=o.document_timeout_s, page_timeout_s=o.page_timeout_s),
        render_range_pages=o.render_range_pages, render=render, safety=safety, hints=hints, engine=engine,
        extract=extract_settings, flush=flush_policy(o), progress_every_s=o.progress_every_s)


def run_settings(o: PagemillOptions, extract: bool | None = None) -> RunSettings:
    """The settings of options that need no run checks (tests, benchmarks, the estimate): raises ValueError when
    what they name cannot be loaded; `extract` as in settings_from_options."""
    built = settings_from_options(o, checks=False, extract=extract)
    if isinstance(built, list):
        raise ValueError("; ".join(built))
    return built


def with_resolved_engine(s: RunSettings, o: PagemillOptions) -> RunSettings:
    """The engine slot again once the run's local workers are resolved (`--workers 0`: a small run goes in
    process, pipelines/run/local_workers.py), which decides the `vllm` alias. Loads nothing; the key is the same
    (render_key keys the model's settings, never the kind). Unchanged when the kind is."""
    engine = resolved_engine(o, s.engine, s.place.run_id)
    return s if engine is s.engine else replace(s, engine=engine)


def load_files(o: PagemillOptions) -> tuple[Loaded | None, list[str]]:
    """The schema (or markdown format) and the image-token rule, each read once; a bad one is a problem line."""
    from schemas.extraction import SchemaError
    from transforms.model.markdown import load_output
    from transforms.model.token_math import rule_for

    problems = []
    try:
        schema, markdown = load_output(o.schema)
    except (SchemaError, OSError) as err:
        problems.append(f"--schema {o.schema}: {err}")
    try:
        rule = rule_for(o.model_family, o.model)
    except (ValueError, OSError) as err:
        problems.append(f"--model-family {o.model_family}: {err}")
    return (None, problems) if problems else (Loaded(schema, markdown, rule), [])


def output_problems(o: PagemillOptions, loaded: Loaded | None) -> list[str]:
    """The run's output choices against the loaded output: markdown files need markdown, an endpoint JSON."""
    from pipelines.config.engine import uses_endpoint

    if loaded is None:
        return []
    problems = []
    if o.write_markdown and loaded.markdown is None:
        problems.append(f"--write-markdown needs markdown output (--schema markdown or olmocr), not {o.schema}")
    if uses_endpoint(o) and loaded.markdown is not None:
        # The served engine sends a JSON schema as response_format; markdown prompts are the vLLM engines'.
        problems.append(f"--schema {o.schema}: markdown output needs --engine vllm "
                        "(served endpoints take JSON schemas)")
    if o.evidence_quotes:  # the model quotes the values of a JSON answer (transforms/model/quotes.py)
        from transforms.model import quotes

        why = ["markdown output has no fields to quote"] if loaded.markdown is not None else \
            quotes.problems(loaded.schema.schema)
        problems += [f"--evidence-quotes with --schema {o.schema}: {w}" for w in why]
    return problems


def render_key(render: RenderSettings, safety: SafetyConfig, hints: HintSettings, o: PagemillOptions) -> str:
    """The key of the render, gate, hints and model settings that change a page. The model's are the vLLM
    settings of the options whichever engine answers (their excluded fields aside: how it runs), so that a page
    extracted by the machine engine is reused by a run in process, and earlier runs' keys still match."""
    return settings_key(render, safety, hints, vllm_settings(o))


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


def flush_policy(o: PagemillOptions) -> FlushPolicy:
    return FlushPolicy(o.flush_rows, o.flush_seconds)


def extract_config(o: PagemillOptions, loaded: Loaded, key: str) -> ExtractConfig:
    """`key`: the key of the render, gate, hints and model settings that change a page (`render_key`)."""
    from transforms.model.budget import load_prices

    return ExtractConfig(schema=loaded.schema, markdown=loaded.markdown, tenant=o.tenant, model=o.model,
                         model_revision=o.model_revision, render_key=key, model_family=loaded.rule,
                         max_model_len=o.max_model_len, max_tokens=o.max_tokens, max_attempts=o.max_attempts,
                         max_in_flight=max_in_flight(o), prompt_layout=o.prompt_layout,
                         answer_timeout_s=o.answer_timeout_s, gpu_hourly_usd=o.gpu_hourly_usd, api_price=o.api_price,
                         evidence_quotes=o.evidence_quotes,
                         prices=load_prices(), route=model_route(o))
