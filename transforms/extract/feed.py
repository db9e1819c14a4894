"""Feeding pages to the engine: one request per page, a bounded number in flight, attempts.

One `PageFeed` per worker process (shared by the stage's threads) sits in front of the engine:
- a page becomes the engine's own request once (`engine.prepare`: the engine contract, transforms/engines/base.py),
  reused by every attempt;
- a page whose cache key is already done or in flight in this process is not sent again: its
  caller gets the first page's result (`claim`);
- at most `max_in_flight` pages are in flight (about twice the sequences the engine runs at once:
  the engine always has the next pages queued, and prepared requests exist only for these pages);
- a background thread handles each finished request: validation, another attempt (greedy first,
  then sampled), a restart when the engine died (EngineDead, or any failure that is not one of the contract's
  request failures), and the page's final result.
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
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

from schemas.reasons import ENGINE_ERROR, ENGINE_TIMEOUT, REPETITION
from schemas.records import ExtractionResult, PageTask
from schemas.statuses import FAILED, INVALID, OK
from transforms.engines.base import (
    Answer,
    Completion,
    EngineDead,
    PageEngine,
    PageRequest,
    PageSource,
    Prepared,
    PromptParts,
    RequestFailed,
    RequestRejected,
    Sampling,
    TokenBudget,
)
from transforms.engines.vllm_shared.repetition import MAX_PERIOD, SPAN, retry_cap
from transforms.extract.config import ExtractConfig
from transforms.extract.deadline import Deadlines
from transforms.model import quotes
from transforms.model.markdown import TRUNCATED_FLAG, MarkdownFormat
from transforms.model.postfilter import SchemaValidator
from transforms.model.prompt import decoding

log = logging.getLogger(__name__)
MAX_KEYS = 100_000  # done keys remembered per process for dedup (a few KB each); in-flight keys always


def sampling(schema: Any, max_tokens: int, attempt: int, markdown: MarkdownFormat | None = None) -> Sampling:
    """Pure: the decoding settings of one attempt (greedy first, then sampled: `prompt.decoding`), constrained
    by the JSON schema, or for markdown by the front matter's regex (when the format has one)."""
    temperature, top_p = decoding(attempt)
    if markdown is None:
        return Sampling(temperature, top_p, max_tokens, json=dict(schema.schema))
    return Sampling(temperature, top_p, max_tokens, regex=markdown.regex or None)


def page_request(task: PageTask, cfg: ExtractConfig) -> PageRequest:
    """The neutral request of one page (transforms/engines/base.py): its encoded bytes, the prompt's parts and
    the token budget. Pure."""
    parts = PromptParts(text=cfg.prompt_words, schema_id=cfg.schema.schema_id, hint=task.hint)
    return PageRequest(PageSource(task.page.image, task.page.detail_side), parts,
                       TokenBudget(cfg.max_model_len, cfg.max_tokens, cfg.model_family), cfg.model)


@dataclass
class Request:
    """One page while it is in flight (mutable: its attempts run here)."""

    prepared: Prepared | None
    text_tokens: int
    width: int
    height: int
    attempts: int = 0
    gpu_seconds: float = 0.0
    last: ExtractionResult | None = None
    resubmitted: bool = False
    seen_starts: int = 0
    cap: int = 0  # max_tokens of the next attempt: the run's, or smaller after a loop (repetition.retry_cap)
    looped: bool = False  # an attempt was stopped by the repetition guard (retried once)
    pending: Future[Completion] | None = None  # the engine's future of the attempt in flight
    # Tokens of every answered attempt (image, text, output, cached prompt): the ledger keeps what was spent,
    # so an invalid answer's retry is billed for both answers, as a hosted API bills them.
    spent: tuple[int, int, int, int] = (0, 0, 0, 0)


def stop_reason(finish_reason: str | None) -> str | None:
    """schemas.records.STOP_REASONS of an engine's finish reason (vLLM's and the OpenAI API's spell them
    alike); None for one that is not an end of an answer (an abort)."""
    return finish_reason if finish_reason in ("stop", "length", REPETITION) else None


def judge(output: Answer, validator: SchemaValidator, attempt: int,
          markdown: MarkdownFormat | None = None, with_quotes: bool = False) -> ExtractionResult:
    """One finished request as a result: ok, or invalid with the validator's (or the markdown parser's)
    reason. Pure. Markdown: `extraction` is the front matter as JSON, `markdown` the page text. `with_quotes`:
    the answer is the quotes sidecar's (the validator's schema), whose quotes are taken out of the extraction."""
    ended = stop_reason(output.finish_reason)
    counts = {"image_tokens": output.image_tokens, "text_tokens": output.text_tokens,
              "output_tokens": output.output_tokens, "stop_reason": ended,
              "cached_prompt_tokens": output.cached_prompt_tokens}
    if markdown is not None:
        parsed = markdown.parse(output.text, output.finish_reason)
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
    checked = validator.parse_and_validate(output.text, output.finish_reason)
    text, said = quotes.split(output.text) if checked.ok and with_quotes else (output.text, ())
    return ExtractionResult(
        status=OK if checked.ok else INVALID, reason_code=checked.reason_code, quotes=said,
        extraction=text if checked.ok else None, validation_errors=tuple(checked.errors),
        message=None if checked.ok else f"attempt {attempt}: {'; '.join(checked.errors)[:400]}", **counts)


SPENT_FIELDS = ("image_tokens", "text_tokens", "output_tokens", "cached_prompt_tokens")


def attempt_tokens(result: ExtractionResult) -> tuple[int, int, int, int]:
    """Pure: the tokens one answered attempt spent, in SPENT_FIELDS' order."""
    return (result.image_tokens, result.text_tokens, result.output_tokens, result.cached_prompt_tokens)


def failed(reason: str, message: str, text_tokens: int = 0) -> ExtractionResult:
    return ExtractionResult(status=FAILED, reason_code=reason, message=message[:500], text_tokens=text_tokens)


class PageFeed:
    """Pages in, final ExtractionResults out (as futures), over one engine."""

    def __init__(self, engine: PageEngine, cfg: ExtractConfig, max_in_flight: int) -> None:
        self.engine = engine
        self.cfg = cfg
        self.validator = SchemaValidator(cfg.answer_schema)
        self.max_in_flight = max(1, max_in_flight)
        self.slots = threading.BoundedSemaphore(self.max_in_flight)
        self._keys: OrderedDict[str, Future[ExtractionResult]] = OrderedDict()
        self._lock = threading.Lock()
        self._done: queue.SimpleQueue[tuple[Request, Future[ExtractionResult], Future[Completion]]] = \
            queue.SimpleQueue()
        self._params: dict[tuple[int, int], Sampling] = {}
        self._finishing = threading.Lock()  # the driver and the deadline thread may both end a page
        self._deadlines = Deadlines(self._expire)
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
        if last:
            try:
                self.engine.shutdown()
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
        """Prepare and submit a claimed page; the caller holds one of `slots`, released with the
        final result. Runs in the caller's thread, so preparing (decoding) uses the stage's threads."""
        try:
            prepared = self.engine.prepare(page_request(task, self.cfg))
        except RequestFailed as err:  # over the token budget: decided without the engine
            return self._finish(Request(None, err.text_tokens, task.page.width, task.page.height), result,
                                failed(err.reason_code, str(err), err.text_tokens))
        except RequestRejected as err:  # one page whose request cannot be built fails alone
            return self._finish(Request(None, 0, task.page.width, task.page.height), result,
                                failed(ENGINE_ERROR, str(err)))
        except Exception as err:  # noqa: BLE001 - EngineDead or worse: its pages fail as rows, not the run
            why = str(err) if isinstance(err, EngineDead) else f"{type(err).__name__}: {err}"
            return self._finish(Request(None, 0, task.page.width, task.page.height), result,
                                failed(ENGINE_ERROR, f"engine could not start: {why}"))
        self._submit(Request(prepared, prepared.text_tokens, prepared.width, prepared.height), result)

    def _sampling(self, attempt: int, cap: int) -> Sampling:
        if (attempt, cap) not in self._params:
            self._params[attempt, cap] = sampling(self.cfg.answer_schema, cap, attempt, self.cfg.markdown)
        return self._params[attempt, cap]

    def _submit(self, req: Request, result: Future[ExtractionResult]) -> None:
        req.seen_starts = self.engine.starts
        try:
            assert req.prepared is not None  # a page is submitted only once prepared, until it ends
            done = self.engine.submit(req.prepared, self._sampling(min(req.attempts + 1, 2),
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
        late = failed(ENGINE_TIMEOUT, f"attempt {req.attempts}: no answer within --answer-timeout-s "
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
                self._finish(req, result, failed(ENGINE_ERROR, f"{type(err).__name__}: {err}"))

    def _on_done(self, req: Request, result: Future[ExtractionResult], done: Future[Completion]) -> None:
        if result.done():
            return  # the page already ended (its deadline passed): a late answer or abort is not read
        err = done.exception()
        if isinstance(err, RequestFailed):  # failed for good (after the engine's own retries), with its reason
            req.attempts += 1
            return self._finish(req, result, failed(err.reason_code, str(err), err.text_tokens))
        if err is not None:
            if not isinstance(err, RequestRejected):  # EngineDead, or anything unexpected: take it as dead
                self._restart(req.seen_starts)
                if not req.resubmitted:  # a request lost with the engine is not the page's fault
                    req.resubmitted = True
                    return self._submit(req, result)
            req.attempts += 1
            req.last = failed(ENGINE_ERROR, str(err) if isinstance(err, RequestRejected) else
                              f"{type(err).__name__}: {err}")  # the contract's classes carry the cause
        else:
            completion = done.result()
            req.attempts += 1
            req.gpu_seconds += completion.gpu_seconds
            judged = judge(completion.output, self.validator, req.attempts, self.cfg.markdown,
                           self.cfg.answer_schema is not self.cfg.schema)
            req.spent = tuple(a + b for a, b in zip(req.spent, attempt_tokens(judged), strict=True))
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
            req.prepared = None  # the decoded image goes now, not when the row is written
            self.slots.release()
            if any(req.spent):
                final = replace(final, **dict(zip(SPENT_FIELDS, req.spent, strict=True)))
            result.set_result(replace(final, attempts=req.attempts, gpu_seconds=req.gpu_seconds, sent_width=req.width,
                                      sent_height=req.height, finished_at=dt.datetime.now(dt.UTC)))
