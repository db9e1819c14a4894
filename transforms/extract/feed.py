"""Feeding pages to the engine: one request per page, a bounded number in flight, attempts.

One `PageFeed` per worker process (shared by the stage's threads) sits in front of the engine:
- a page whose cache key is already done or in flight in this process is not sent again: its
  caller gets the first page's result (`claim`);
- at most `max_in_flight` pages are in flight (about twice the engine's max_num_seqs: the
  engine always has the next pages queued, and decoded images exist only for these pages);
- a background thread handles each finished request: validation, another attempt (greedy first,
  then sampled), a restart when the engine died, and the page's final result.
Every claimed page ends with a result (ok, invalid or failed, with a reason code), never an
exception and never a future left unresolved.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import queue
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from PIL import Image

from schemas.records import ExtractionResult, PageTask
from schemas.statuses import FAILED, INVALID, OK
from transforms.engines.local import Completion, PageEngine
from transforms.engines.repetition import MAX_PERIOD, REPETITION, SPAN, retry_cap
from transforms.extract.deadline import Deadlines
from transforms.model import budget
from transforms.model.markdown import TRUNCATED_FLAG, MarkdownFormat
from transforms.model.postfilter import SchemaValidator
from transforms.model.prompt import chat_messages, control_tokens, decoding
from transforms.pages.render import decode_rgb
from transforms.pages.sizes import resize_for_detail

if TYPE_CHECKING:
    from transforms.extract.stage import ExtractConfig

log = logging.getLogger(__name__)
MAX_KEYS = 100_000  # done keys remembered per process for dedup (a few KB each); in-flight keys always


def sampling_fields(schema: Any, max_tokens: int, attempt: int,
                    markdown: MarkdownFormat | None = None) -> dict[str, Any]:
    """Pure: the decoding settings pagemill sets, as JSON fields (the engine service receives them so:
    transforms/engines/machine_wire.py); `vllm_sampling` makes vLLM's SamplingParams of them."""
    temperature, top_p = decoding(attempt)
    fields: dict[str, Any] = {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens}
    if markdown is None:
        fields["json"] = dict(schema.schema)
    elif markdown.regex:  # markdown: the front matter constrained (when the format has one), the text capped
        fields["regex"] = markdown.regex
    return fields


def vllm_sampling(fields: Mapping[str, Any]) -> Any:
    """vLLM's SamplingParams of `sampling_fields` (in the worker, and in the engine service from the wire)."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    constraint = None
    if "json" in fields:
        constraint = StructuredOutputsParams(json=fields["json"])
    elif "regex" in fields:
        constraint = StructuredOutputsParams(regex=fields["regex"])
    return SamplingParams(temperature=fields["temperature"], top_p=fields["top_p"], max_tokens=fields["max_tokens"],
                          structured_outputs=constraint)


def sampling_params(schema: Any, max_tokens: int, attempt: int, markdown: MarkdownFormat | None = None) -> Any:
    return vllm_sampling(sampling_fields(schema, max_tokens, attempt, markdown))


@dataclass(frozen=True)
class PageSource:
    """A request's page as encoded bytes (its "page" entry beside vLLM's prompt and image): what the engine
    service is sent instead of pixels; `page_pixels(data, detail_side, size)` is the request's image."""

    data: bytes
    detail_side: int
    size: tuple[int, int]


def page_pixels(data: bytes, detail_side: int, size: tuple[int, int] | None = None) -> Image.Image:
    """The page as the engine sees it: decoded, capped for its detail, and resized to `size` when the token
    budget shrank it. One function for both paths: `prepare` here and the engine service."""
    img = resize_for_detail(decode_rgb(data), detail_side)
    return img if size is None or size == img.size else img.resize(size, Image.Resampling.LANCZOS)


@dataclass
class Request:
    """One page's prompt, while it is in flight (mutable: its attempts run here)."""

    prompt: dict[str, Any] | None
    text_tokens: int
    width: int
    height: int
    result: ExtractionResult | None = None  # decided without the engine (over budget, bad image)
    attempts: int = 0
    gpu_seconds: float = 0.0
    last: ExtractionResult | None = None
    resubmitted: bool = False
    seen_starts: int = 0
    cap: int = 0  # max_tokens of the next attempt: the run's, or smaller after a loop (repetition.retry_cap)
    looped: bool = False  # an attempt was stopped by the repetition guard (retried once)
    pending: Future[Completion] | None = None  # the engine's future of the attempt in flight


def prepare(task: PageTask, tokenizer: Any, cfg: ExtractConfig, controls: Sequence[str] | None = None) -> Request:
    """Decode the page, build the prompt with the model's own chat template (the hint stripped of the
    tokenizer's control tokens: `controls`, computed once per engine, or from the tokenizer) and check it
    against max_model_len, shrinking the page image when that is enough to make it fit."""
    controls = control_tokens(tokenizer) if controls is None else controls
    if cfg.markdown is not None:
        messages = cfg.markdown.messages(task.hint, controls, cfg.prompt_layout)
    else:
        messages = chat_messages(cfg.schema.schema, task.hint, tokenizer, controls, cfg.prompt_layout)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    # The template holds one image placeholder token, which the engine expands to image_tokens.
    text_tokens = len(tokenizer.encode(text, add_special_tokens=False)) - 1
    img = page_pixels(task.page.image, task.page.detail_side)
    size = budget.fit_image(img.width, img.height, text_tokens, cfg.max_tokens, cfg.max_model_len, cfg.model_family)
    if size is None:
        return Request(None, text_tokens, img.width, img.height, result=ExtractionResult(
            status=FAILED, reason_code="over_token_budget", text_tokens=text_tokens,
            message=f"prompt needs {text_tokens} text tokens + {cfg.max_tokens} output tokens; "
                    f"max_model_len is {cfg.max_model_len}"))
    if size != img.size:
        img = img.resize(size, Image.Resampling.LANCZOS)  # as page_pixels does with a size (no second decode)
    source = PageSource(task.page.image, task.page.detail_side, size)
    return Request({"prompt": text, "multi_modal_data": {"image": img}, "page": source}, text_tokens, img.width,
                   img.height)


def stop_reason(finish_reason: str | None) -> str | None:
    """schemas.records.STOP_REASONS of an engine's finish reason (vLLM's and the OpenAI API's spell them
    alike); None for one that is not an end of an answer (an abort)."""
    return finish_reason if finish_reason in ("stop", "length", REPETITION) else None


def usage(output: Any, image_id: int | None) -> tuple[int, int, int]:
    """(image, text, output) tokens from the engine's own token ids, or as a served endpoint reported them."""
    counts = getattr(output, "token_counts", None)
    if counts is not None:
        return counts
    prompt_ids = list(output.prompt_token_ids or [])
    image = sum(1 for t in prompt_ids if t == image_id) if image_id is not None else 0
    return image, len(prompt_ids) - image, len(output.outputs[0].token_ids)


def judge(output: Any, image_id: int | None, validator: SchemaValidator, attempt: int,
          markdown: MarkdownFormat | None = None) -> ExtractionResult:
    """One finished request as a result: ok, or invalid with the validator's (or the markdown parser's)
    reason. Pure. Markdown: `extraction` is the front matter as JSON, `markdown` the page text."""
    img_t, txt_t, out_t = usage(output, image_id)
    completion = output.outputs[0]
    ended = stop_reason(completion.finish_reason)
    counts = {"image_tokens": img_t, "text_tokens": txt_t, "output_tokens": out_t, "stop_reason": ended,
              "cached_prompt_tokens": getattr(output, "num_cached_tokens", None) or 0}
    if markdown is not None:
        parsed = markdown.parse(completion.text, completion.finish_reason)
        cut = (TRUNCATED_FLAG,) if parsed.truncated else (REPETITION,) if ended == REPETITION else ()
        return ExtractionResult(
            status=OK if parsed.ok else INVALID, reason_code=parsed.reason_code,
            extraction=json.dumps(parsed.front_matter, sort_keys=True) if parsed.ok else None,
            markdown=parsed.markdown, validation_errors=parsed.errors, flags=cut if parsed.ok else (),
            message=None if parsed.ok else f"attempt {attempt}: {'; '.join(parsed.errors)[:400]}", **counts)
    if ended == REPETITION:  # stopped inside a loop: whatever JSON there is, it is cut off
        loop = f"the answer repeated a pattern of at most {MAX_PERIOD} tokens for {SPAN} tokens: stopped"
        return ExtractionResult(status=INVALID, reason_code=REPETITION, validation_errors=(loop,),
                                message=f"attempt {attempt}: {loop}", **counts)
    checked = validator.parse_and_validate(completion.text, completion.finish_reason)
    return ExtractionResult(
        status=OK if checked.ok else INVALID, reason_code=checked.reason_code,
        extraction=completion.text if checked.ok else None, validation_errors=tuple(checked.errors),
        message=None if checked.ok else f"attempt {attempt}: {'; '.join(checked.errors)[:400]}", **counts)


def failed(reason: str, message: str) -> ExtractionResult:
    return ExtractionResult(status=FAILED, reason_code=reason, message=message[:500])


class PageFeed:
    """Pages in, final ExtractionResults out (as futures), over one engine."""

    def __init__(self, engine: PageEngine, cfg: ExtractConfig, max_in_flight: int) -> None:
        self.engine = engine
        self.cfg = cfg
        self.validator = SchemaValidator(cfg.schema)
        self.max_in_flight = max(1, max_in_flight)
        self.slots = threading.BoundedSemaphore(self.max_in_flight)
        self._keys: OrderedDict[str, Future[ExtractionResult]] = OrderedDict()
        self._lock = threading.Lock()
        self._done: queue.SimpleQueue[tuple[Request, Future[ExtractionResult], Future[Completion]]] = \
            queue.SimpleQueue()
        self._params: dict[tuple[int, int], Any] = {}
        self._finishing = threading.Lock()  # the driver and the deadline thread may both end a page
        self._deadlines = Deadlines(self._expire)
        self._image_id: int | None = None
        self._controls: tuple[Any, tuple[str, ...]] | None = None  # (tokenizer, its control tokens)
        self._users = 0
        self._driver = threading.Thread(target=self._drive, name="pagemill-feed", daemon=True)
        self._driver.start()

    def attach(self) -> None:
        with self._lock:
            self._users += 1

    def detach(self) -> None:
        """The last user gone: stop the engine (it starts again if the feed is used again)."""
        with self._lock:
            self._users -= 1
            last = self._users == 0
        stop = getattr(self.engine, "shutdown", None) or self.engine.close
        if last:
            try:
                stop()
            except Exception as err:  # noqa: BLE001 - best effort at the end of a run
                log.warning("engine shutdown: %s: %s", type(err).__name__, err)

    def claim(self, key: str) -> tuple[Future[ExtractionResult], bool]:
        """The future of this key's result, and whether the caller is the first (and must `start` it)."""
        with self._lock:
            found = self._keys.get(key)
            if found is not None:
                return found, False
            future: Future[ExtractionResult] = Future()
            self._keys[key] = future
            # Bounded memory on long runs: forget the oldest finished keys (a later repeat of one is
            # extracted again, and counted as a model call).
            while len(self._keys) > MAX_KEYS and next(iter(self._keys.values())).done():
                self._keys.popitem(last=False)
            return future, True

    def start(self, task: PageTask, result: Future[ExtractionResult]) -> None:
        """Decode and submit a claimed page; the caller holds one of `slots`, released with the
        final result. Runs in the caller's thread, so decoding uses the stage's threads."""
        build = getattr(self.engine, "build_request", None)
        if build is not None:  # a served engine (transforms/engines/served.py): its server holds the tokenizer
            try:
                req = build(task, self.cfg)
            except Exception as err:  # noqa: BLE001 - one page whose request cannot be built fails alone
                req = Request(None, 0, task.page.width, task.page.height)
                return self._finish(req, result, failed("engine_error", f"request could not be built: "
                                                                        f"{type(err).__name__}: {err}"))
            return self._submit(req, result)
        try:
            tokenizer = self.engine.tokenizer()
            if self._controls is None or self._controls[0] is not tokenizer:  # once per (re)started engine
                self._controls = (tokenizer, control_tokens(tokenizer))
                self._image_id = self.engine.image_token_id()
        except Exception as err:  # noqa: BLE001 - an engine that cannot start fails its pages, not the run
            log.error("vLLM engine could not start: %s: %s", type(err).__name__, err)
            req = Request(None, 0, task.page.width, task.page.height)
            return self._finish(req, result, failed("engine_error", f"engine could not start: "
                                                                    f"{type(err).__name__}: {err}"))
        try:
            req = prepare(task, tokenizer, self.cfg, self._controls[1])
        except Exception as err:  # noqa: BLE001 - one page whose prompt cannot be built fails alone
            req = Request(None, 0, task.page.width, task.page.height)
            return self._finish(req, result, failed("engine_error", f"prompt could not be built: "
                                                                    f"{type(err).__name__}: {err}"))
        if req.result is not None:
            return self._finish(req, result, req.result)
        self._submit(req, result)

    def _sampling(self, attempt: int, cap: int) -> Any:
        if (attempt, cap) not in self._params:
            make = getattr(self.engine, "sampling_params", None)  # a served engine's own fields
            self._params[attempt, cap] = (make(self.cfg.schema, cap, attempt) if make is not None else
                                          sampling_params(self.cfg.schema, cap, attempt, self.cfg.markdown))
        return self._params[attempt, cap]

    def _submit(self, req: Request, result: Future[ExtractionResult]) -> None:
        req.seen_starts = self.engine.starts
        try:
            done = self.engine.submit(req.prompt or {}, self._sampling(min(req.attempts + 1, 2),
                                                                       req.cap or self.cfg.max_tokens))
        except Exception as err:  # noqa: BLE001 - handled with the engine's other failures
            done = Future()
            done.set_exception(err)
        req.pending = done
        if self.cfg.answer_timeout_s > 0:
            self._deadlines.add(self.cfg.answer_timeout_s, (req, result, done))
        done.add_done_callback(lambda f: self._done.put((req, result, f)))

    def _expire(self, item: tuple[Request, Future[ExtractionResult], Future[Completion]]) -> None:
        """--answer-timeout-s passed since this attempt was submitted: if it is still the page's attempt in
        flight, the engine aborts it (its sequence freed) and the page ends `engine_timeout`, its slot freed."""
        req, result, done = item
        if result.done() or done.done() or req.pending is not done:
            return  # answered in time (or already handled by the driver)
        req.attempts += 1
        late = failed("engine_timeout", f"attempt {req.attempts}: no answer within --answer-timeout-s "
                                        f"{self.cfg.answer_timeout_s:g} s")
        # The page ends first: the aborted future's callback then finds it ended, not an engine that died.
        self._finish(req, result, replace(late, stop_reason="deadline"))
        try:
            self.engine.abort(done)
        except Exception as err:  # noqa: BLE001 - an engine that cannot abort finishes the request unread
            log.warning("engine abort: %s: %s", type(err).__name__, err)

    def _drive(self) -> None:
        while True:
            req, result, done = self._done.get()
            try:
                self._on_done(req, result, done)
            except Exception as err:
                log.exception("extraction bookkeeping failed")
                self._finish(req, result, failed("engine_error", f"{type(err).__name__}: {err}"))

    def _on_done(self, req: Request, result: Future[ExtractionResult], done: Future[Completion]) -> None:
        if result.done():
            return  # the page already ended (its deadline passed): a late answer or abort is not read
        err = done.exception()
        reason = getattr(err, "reason_code", None)
        if reason is not None:  # a served request that failed after its own retries: final, with its reason
            req.attempts += 1
            return self._finish(req, result, failed(reason, str(err)))
        if err is not None:
            if not isinstance(err, ValueError):  # not a rejected request: the engine may be dead
                self._restart(req.seen_starts)
                if not req.resubmitted:  # a request lost with the engine is not the page's fault
                    req.resubmitted = True
                    return self._submit(req, result)
            req.attempts += 1
            req.last = failed("engine_error", f"{type(err).__name__}: {err}")
        else:
            completion = done.result()
            req.attempts += 1
            req.gpu_seconds += completion.gpu_seconds
            judged = judge(completion.output, self._image_id, self.validator, req.attempts, self.cfg.markdown)
            looped = judged.stop_reason == REPETITION
            if judged.status == OK and not looped:
                return self._finish(req, result, judged)
            req.last = judged
            if looped:  # one more try, with the next decoding setting and a smaller cap; then it stands
                if req.looped:
                    return self._finish(req, result, judged)
                req.looped, req.cap = True, retry_cap(req.cap or self.cfg.max_tokens)
        if req.attempts < self.cfg.max_attempts:
            return self._submit(req, result)
        self._finish(req, result, req.last)

    def _restart(self, seen: int) -> None:
        """Re-create a dead engine. If that fails too, the engine remembers the error and every later
        request fails fast with it, as rows: never an exception across the pipeline."""
        try:
            self.engine.restart(seen)
        except Exception as err:  # noqa: BLE001
            log.error("engine could not restart: %s: %s", type(err).__name__, err)

    def _finish(self, req: Request, result: Future[ExtractionResult], final: ExtractionResult) -> None:
        with self._finishing:
            if result.done():
                return
            req.prompt = None  # the decoded image goes now, not when the row is written
            self.slots.release()
            result.set_result(replace(final, attempts=req.attempts, gpu_seconds=req.gpu_seconds, sent_width=req.width,
                                      sent_height=req.height, finished_at=dt.datetime.now(dt.UTC)))


def extract_all(engine: PageEngine, tasks: list[PageTask], cfg: ExtractConfig,
                max_in_flight: int = 8) -> list[ExtractionResult]:
    """Every task's final result, in order (tests and benchmarks; the pipeline uses the DoFn)."""
    feed = PageFeed(engine, cfg, max_in_flight)
    futures: list[Future[ExtractionResult]] = []
    for task in tasks:
        feed.slots.acquire()
        futures.append(Future())
        feed.start(task, futures[-1])
    return [f.result() for f in futures]
