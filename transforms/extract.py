"""Extract: the vLLM offline engine inside a Beam ModelHandler, JSON-schema-constrained decoding.

Pages are keyed by cache key and extracted once per key; batches are cut by estimated prompt
tokens (Beam's BatchElements with an element size function), large enough that the engine's own
continuous batching always has work. Every page ends as a result: ok, invalid or failed, never
an exception across the pipeline.
"""
from __future__ import annotations

import io
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import apache_beam as beam
from apache_beam.ml.inference.base import ModelHandler, PredictionResult, RunInference
from PIL import Image

from schemas.extraction import ExtractionSchema
from schemas.records import ExtractionResult, PageImage, PageRef, PageRow, PageTask
from transforms import budget
from transforms.cache import CACHED, cached_row
from transforms.detail import low_detail_size, resize_for_detail
from transforms.engine import Engine, EngineSettings
from transforms.postfilter import SchemaValidator, output_flags
from transforms.prompt import SYSTEM_PROMPT, DecodingParams, cache_key, chat_messages, config_key

log = logging.getLogger(__name__)
INVALID_REASONS = ("invalid_json", "schema_invalid", "truncated")


@dataclass(frozen=True)
class ExtractConfig:
    schema: ExtractionSchema
    tenant: str
    model: str
    model_revision: str | None
    render_key: str
    model_family: str
    max_model_len: int
    max_tokens: int
    max_attempts: int
    max_hint_chars: int
    batch_tokens: int
    gpu_hourly_usd: float
    api_price: str
    prices: dict[str, Any]

    @property
    def decoding(self) -> DecodingParams:
        return DecodingParams(max_tokens=self.max_tokens)

    @property
    def config_key(self) -> str:
        return config_key(self.model, self.model_revision, self.schema.schema_id, self.schema.schema_hash,
                          self.decoding, self.tenant, self.render_key)


@dataclass
class _Request:
    """One task's prepared prompt (mutable while the batch's attempts run)."""

    index: int
    prompt: dict[str, Any] | None
    text_tokens: int
    width: int
    height: int
    result: ExtractionResult | None = None
    attempts: int = 0
    gpu_seconds: float = 0.0
    last: ExtractionResult | None = None


def make_task(page: PageImage, engine: EngineSettings, cfg: ExtractConfig) -> tuple[str, PageTask]:
    """Key a page by everything that can change its extraction. Pure. The hint is the hints stage's
    (already capped, fenced-marker free and scanned); a page sent at low detail is a different image."""
    hint = page.hint
    image_key = page.page_hash if not page.detail_side else f"{page.page_hash}@{page.detail_side}"
    key = cache_key(image_key, cfg.config_key, hint)
    tokens = budget.estimate_image_tokens(cfg.model_family, *low_detail_size(page.width, page.height, page.detail_side))
    tokens += budget.text_tokens_estimate(hint) + cfg.max_tokens
    return key, PageTask(page=page, cache_key=key, hint=hint, estimated_tokens=tokens)


def merge_copies(keyed: tuple[str, Iterable[PageTask]]) -> PageTask:
    """Pages that share a key: the first by (uri, page) is extracted, the rest ride along. Pure."""
    tasks = sorted(keyed[1], key=lambda t: (t.page.source_uri, t.page.page_index))
    first = tasks[0]
    copies = tuple(PageRef(t.page.doc_sha256, t.page.source_uri, t.page.page_index, t.page.page_hash,
                           t.page.width, t.page.height, t.page.hint_source, flags=t.page.flags,
                           flag_detail=t.page.flag_detail, hint_coverage=t.page.hint_coverage,
                           pdq_hash=t.page.pdq_hash) for t in tasks[1:])
    return replace(first, copies=copies)


def sampling_params(schema: ExtractionSchema, max_tokens: int, attempt: int) -> Any:
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    # Greedy first. A retry of a greedy decode would repeat itself, so later attempts sample
    # (unseeded: seeded sampling with chunked prefill crashes vLLM 0.32's CPU engine).
    temperature, top_p = (0.0, 1.0) if attempt == 1 else (0.7, 0.95)
    return SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                          structured_outputs=StructuredOutputsParams(json=dict(schema.schema)))


def prepare(task: PageTask, index: int, tokenizer: Any, cfg: ExtractConfig) -> _Request:
    """Build the prompt with the model's own chat template and check it against max_model_len,
    shrinking the page image when that is enough to make it fit."""
    text = tokenizer.apply_chat_template(chat_messages(cfg.schema.schema, task.hint), tokenize=False,
                                         add_generation_prompt=True)
    # The template holds one image placeholder token, which the engine expands to image_tokens.
    text_tokens = len(tokenizer.encode(text, add_special_tokens=False)) - 1
    img = resize_for_detail(Image.open(io.BytesIO(task.page.image)).convert("RGB"), task.page.detail_side)
    room = cfg.max_model_len - cfg.max_tokens - text_tokens
    if budget.estimate_image_tokens(cfg.model_family, img.width, img.height) > room:
        size = budget.fit_to_token_budget(img.width, img.height, room, cfg.model_family) if room > 0 else None
        if size is None:
            req = _Request(index, None, text_tokens, img.width, img.height)
            req.result = ExtractionResult(
                status="failed", reason_code="over_token_budget", text_tokens=text_tokens,
                message=f"prompt needs {text_tokens} text tokens + {cfg.max_tokens} output tokens; "
                        f"max_model_len is {cfg.max_model_len}")
            return req
        img = img.resize(size, Image.Resampling.LANCZOS)
    return _Request(index, {"prompt": text, "multi_modal_data": {"image": img}}, text_tokens, img.width, img.height)


def _prepare_or_fail(task: PageTask, index: int, tokenizer: Any, cfg: ExtractConfig) -> _Request:
    """One page whose prompt cannot be built fails alone, as a row."""
    try:
        return prepare(task, index, tokenizer, cfg)
    except Exception as err:  # noqa: BLE001
        req = _Request(index, None, 0, task.page.width, task.page.height)
        req.result = ExtractionResult(status="failed", reason_code="engine_error",
                                      message=f"prompt could not be built: {type(err).__name__}: {err}"[:500])
        return req


def _restart(engine: Engine) -> None:
    """Re-create a dead engine. If that fails too, the engine remembers the error and every later
    request fails fast with it, as rows: never an exception across the pipeline."""
    try:
        engine.restart()
    except Exception as err:  # noqa: BLE001
        log.error("vLLM engine could not restart: %s: %s", type(err).__name__, err)


def run_requests(engine: Engine, prompts: Sequence[dict[str, Any]], params: Any) -> tuple[list[Any], float]:
    """Outputs (or the exception of that request) in order, and the engine's wall time. One bad
    request never fails its batch: on an error the batch is re-run a request at a time."""
    try:
        return engine.generate(prompts, [params] * len(prompts))
    except Exception as err:  # noqa: BLE001 - classified below, never raised across the pipeline
        log.warning("engine failed on a batch of %d (%s: %s); retrying one at a time",
                    len(prompts), type(err).__name__, err)
        if not isinstance(err, ValueError):  # not a request-validation error: the engine may be dead
            _restart(engine)
    outputs: list[Any] = []
    wall = 0.0
    for prompt in prompts:
        try:
            out, seconds = engine.generate([prompt], [params])
            outputs.append(out[0])
            wall += seconds
        except Exception as err:  # noqa: BLE001
            outputs.append(err)
            if not isinstance(err, ValueError):
                _restart(engine)
    return outputs, wall


def extract_batch(engine: Engine, tasks: Sequence[PageTask], cfg: ExtractConfig,
                  validator: SchemaValidator) -> list[ExtractionResult]:
    try:
        tokenizer = engine.tokenizer()
        image_id = engine.image_token_id()
    except Exception as err:  # noqa: BLE001 - an engine that cannot start fails its pages, not the run
        log.error("vLLM engine could not start: %s: %s", type(err).__name__, err)
        message = f"engine could not start: {type(err).__name__}: {err}"[:500]
        return [ExtractionResult(status="failed", reason_code="engine_error", message=message) for _ in tasks]
    requests = [_prepare_or_fail(t, i, tokenizer, cfg) for i, t in enumerate(tasks)]
    for attempt in range(1, cfg.max_attempts + 1):
        todo = [r for r in requests if r.result is None]
        if not todo:
            break
        params = sampling_params(cfg.schema, cfg.max_tokens, attempt)
        outputs, wall = run_requests(engine, [r.prompt for r in todo], params)  # type: ignore[misc]
        usage = [_usage(o, image_id) for o in outputs]
        total_tokens = sum(u[0] + u[1] + u[2] for u in usage) or 1
        for req, out, (img_t, txt_t, out_t) in zip(todo, outputs, usage, strict=True):
            req.attempts += 1
            req.gpu_seconds += wall * (img_t + txt_t + out_t) / total_tokens
            if isinstance(out, Exception):
                req.last = ExtractionResult(status="failed", reason_code="engine_error",
                                            message=f"{type(out).__name__}: {out}"[:500])
                continue
            completion = out.outputs[0]
            checked = validator.parse_and_validate(completion.text, completion.finish_reason)
            result = ExtractionResult(
                status="ok" if checked.ok else "invalid", reason_code=checked.reason_code,
                extraction=completion.text if checked.ok else None, validation_errors=tuple(checked.errors),
                image_tokens=img_t, text_tokens=txt_t, output_tokens=out_t,
                message=None if checked.ok else f"attempt {req.attempts}: {'; '.join(checked.errors)[:400]}")
            if checked.ok:
                req.result = result
            else:
                req.last = result
    return [_final(r) for r in requests]


def _final(req: _Request) -> ExtractionResult:
    result = req.result or req.last or ExtractionResult(status="failed", reason_code="engine_error")
    return replace(result, attempts=req.attempts, gpu_seconds=req.gpu_seconds, sent_width=req.width,
                   sent_height=req.height)


def _usage(output: Any, image_id: int | None) -> tuple[int, int, int]:
    """(image, text, output) tokens from the engine's own token ids."""
    if isinstance(output, Exception):
        return 0, 0, 0
    prompt_ids = list(output.prompt_token_ids or [])
    image = sum(1 for t in prompt_ids if t == image_id) if image_id is not None else 0
    return image, len(prompt_ids) - image, len(output.outputs[0].token_ids)


class VllmPageHandler(ModelHandler[PageTask, PredictionResult, Engine]):
    """RunInference's model handler: one engine per worker process, shared by its threads."""

    def __init__(self, engine: EngineSettings, cfg: ExtractConfig,
                 engine_factory: Callable[[EngineSettings], Engine] = Engine) -> None:
        super().__init__()
        self.engine_settings = engine
        self.cfg = cfg
        self.engine_factory = engine_factory
        self._validator: SchemaValidator | None = None

    def load_model(self) -> Engine:
        return self.engine_factory(self.engine_settings)

    def run_inference(self, batch: Sequence[PageTask], model: Engine,
                      inference_args: dict[str, Any] | None = None) -> Iterable[PredictionResult]:
        if self._validator is None:
            self._validator = SchemaValidator(self.cfg.schema)
        results = extract_batch(model, batch, self.cfg, self._validator)
        return [PredictionResult(example=t, inference=r) for t, r in zip(batch, results, strict=True)]

    def batch_elements_kwargs(self) -> dict[str, Any]:
        # Batch size is counted in estimated prompt tokens: min = max makes every batch full
        # except the last of a bundle.
        return {"min_batch_size": self.cfg.batch_tokens, "max_batch_size": self.cfg.batch_tokens,
                "element_size_fn": lambda task: min(task.estimated_tokens, self.cfg.batch_tokens)}

    def get_num_bytes(self, batch: Sequence[PageTask]) -> int:
        return sum(len(t.page.image) for t in batch)

    def get_metrics_namespace(self) -> str:
        return "pagemill"


def to_rows(result: PredictionResult, engine: EngineSettings, cfg: ExtractConfig) -> Iterator[PageRow]:
    """The extracted page's row, then one row per page that shared its key (zero cost)."""
    task: PageTask = result.example
    r: ExtractionResult = result.inference
    page = task.page
    gpt_tokens = budget.estimate_image_tokens("gpt-4o", r.sent_width or page.width, r.sent_height or page.height)
    # A page the model never saw would cost nothing at a hosted API either.
    api_usd = budget.api_cost_usd(cfg.api_price, gpt_tokens + r.text_tokens, r.output_tokens, cfg.prices) \
        if r.attempts else 0.0
    common = {"cache_key": task.cache_key, "config_key": cfg.config_key, "schema_id": cfg.schema.schema_id,
              "schema_hash": cfg.schema.schema_hash,
              "model": engine.model, "model_revision": engine.model_revision, "extraction": r.extraction,
              "validation_errors": r.validation_errors, "reason_code": r.reason_code, "message": r.message,
              "hint": task.hint or None, "detail": page.detail}
    out = output_flags(r.extraction, cfg.schema.schema, SYSTEM_PROMPT)
    saved = 0
    if page.detail_side and r.image_tokens:  # sent at low detail: what full detail would have cost more
        saved = max(0, budget.estimate_image_tokens(cfg.model_family, page.width, page.height) - r.image_tokens)
    yield PageRow(doc_sha256=page.doc_sha256, source_uri=page.source_uri, page_index=page.page_index,
                  status=r.status, page_hash=page.page_hash, width=page.width, height=page.height,
                  hint_source=page.hint_source, route="model" if r.attempts else "failed",
                  image_tokens=r.image_tokens, text_tokens=r.text_tokens, output_tokens=r.output_tokens,
                  attempts=r.attempts, gpu_seconds=r.gpu_seconds,
                  cost_usd=r.gpu_seconds * cfg.gpu_hourly_usd / 3600.0, api_equivalent_usd=api_usd,
                  flags=tuple(dict.fromkeys(page.flags + out.flags)), flag_detail=page.flag_detail + out.notes,
                  hint_coverage=page.hint_coverage, pdq_hash=page.pdq_hash, image_tokens_saved=saved, **common)
    for ref in task.copies:
        status = "duplicate" if r.status == "ok" else r.status
        yield PageRow(doc_sha256=ref.doc_sha256, source_uri=ref.source_uri, page_index=ref.page_index,
                      status=status, page_hash=ref.page_hash, width=ref.width, height=ref.height,
                      hint_source=ref.hint_source, route="duplicate",
                      flags=tuple(dict.fromkeys(ref.flags + out.flags)), flag_detail=ref.flag_detail + out.notes,
                      hint_coverage=ref.hint_coverage, pdq_hash=ref.pdq_hash, **common)


class _CacheOrModel(beam.DoFn):
    """Pages that share a cache key: reused from an earlier run if it has the key, else one task."""

    def process(self, keyed: tuple[str, dict[str, Iterable[Any]]]) -> Iterator[Any]:
        key, grouped = keyed
        tasks = list(grouped["tasks"])
        if not tasks:
            return
        earlier = max(grouped["earlier"], key=lambda r: r["created_at"], default=None)
        if earlier is None:
            yield merge_copies((key, tasks))
            return
        for t in tasks:
            yield beam.pvalue.TaggedOutput(CACHED, cached_row(earlier, t.page.doc_sha256, t.page.source_uri,
                                                              t.page.page_index))


class ExtractPages(beam.PTransform):
    """PageImage -> PageRow: reused from earlier runs by cache key, else through the engine once per key."""

    def __init__(self, engine: EngineSettings, cfg: ExtractConfig,
                 engine_factory: Callable[[EngineSettings], Engine] = Engine,
                 earlier: beam.PCollection | None = None) -> None:
        super().__init__()
        self.engine = engine
        self.cfg = cfg
        self.engine_factory = engine_factory
        self.earlier = earlier

    def expand(self, pages: beam.PCollection) -> beam.PCollection:
        engine, cfg = self.engine, self.cfg
        earlier = self.earlier if self.earlier is not None else pages.pipeline | "NoEarlier" >> beam.Create([])
        split = (
            {"tasks": pages | "CacheKey" >> beam.Map(make_task, engine, cfg),
             "earlier": earlier | "EarlierByKey" >> beam.Map(lambda r: (r["cache_key"], r))}
            | "ByCacheKey" >> beam.CoGroupByKey()
            | "CacheOrModel" >> beam.ParDo(_CacheOrModel()).with_outputs(CACHED, main="model")
        )
        extracted = (
            split.model
            | "Engine" >> RunInference(VllmPageHandler(engine, cfg, self.engine_factory))
            | "Rows" >> beam.FlatMap(to_rows, engine, cfg)
        )
        return (extracted, split[CACHED]) | "WithCached" >> beam.Flatten()
