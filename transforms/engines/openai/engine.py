"""OpenAIEngine: the extraction stage against an OpenAI-compatible endpoint (`--engine openai`).

vLLM's or SGLang's server on a GPU fleet, or a hosted API, in place of the in-process engine, behind
the same engine contract (transforms/engines/base.py), so the same streaming stage (transforms/extract/feed.py)
feeds it with no barrier: each page becomes one `POST {endpoint}/chat/completions` as it arrives, at most
`concurrency` in flight, sent from one asyncio event loop in a background thread (httpx).

The request is the offline engine's prompt (prompt.py: the same system message,
the same user text, its hint without the model's control tokens, and the page image at the chosen detail
as a JPEG data URL); the schema goes as `response_format` json_schema, plus vLLM's own
`structured_outputs` when /models says the server is vLLM. The server holds the tokenizer and the chat
template, so the prompt is not counted here: a prompt over the server's context length comes back as
HTTP 400, which becomes `over_token_budget`. The answer is untrusted (answer.py:
read up to a cap derived from max_tokens, its shape and usage counts checked, else `invalid_response`).
Token counts come from its `usage`: prompt_tokens is split into image tokens (the --model-family
estimator on the image as sent, capped at prompt_tokens) and text tokens (the rest). Failures after the
tries are RequestFailed with their reason code (base.py).

Faults, per try: 429, 408, 5xx and lost connections are retried with exponential backoff and
jitter, waiting at least what `Retry-After` asks; when the tries run out the page ends as a row with
`rate_limited` or `server_error`. A try over --request-timeout-s ends as `engine_timeout`. Once a
page has exhausted its tries on a connection that cannot be made, the endpoint is marked down and
every later page fails at once (`server_error`): a dead server ends the run, it never hangs it.

gpu_seconds: the wall time during which requests were in flight, shared equally by the requests in
flight (as the offline engine shares each step), so a run's figures add up to the time the endpoint
was busy with it; the ledger prices that at --gpu-hourly-usd for a self-hosted server.
"""
from __future__ import annotations

import asyncio
import email.utils
import itertools
import logging
import random
import re
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, InvalidStateError
from typing import Any

from schemas.reasons import ENGINE_ERROR, ENGINE_TIMEOUT, OVER_TOKEN_BUDGET, RATE_LIMITED, SERVER_ERROR
from transforms.engines.base import (
    Completion,
    EngineDead,
    PageRequest,
    Prepared,
    RequestFailed,
    RequestRejected,
    Sampling,
)
from transforms.engines.openai.answer import (
    ERROR_BODY_BYTES,
    answer_cap,
    answer_data,
    completion_output,
    read_capped,
)
from transforms.engines.openai.endpoint import auth_headers, model_list
from transforms.engines.openai.prompt import build_request
from transforms.engines.openai.settings import OpenAISettings
from transforms.text_safety import redact_url

log = logging.getLogger(__name__)
MAX_RETRY_AFTER_S = 120.0  # a server asking for a longer pause fails the page now (`rate_limited`)
PROBE_TIMEOUT_S = 10.0


def sampling_body(sampling: Sampling, schema_id: str) -> dict[str, Any]:
    """The body's decoding fields of one try (pagemill's Sampling: base.py), its JSON schema as response_format
    named after `schema_id`. Pure."""
    body: dict[str, Any] = {"max_tokens": sampling.max_tokens, "temperature": sampling.temperature,
                            "top_p": sampling.top_p}
    if sampling.json is not None:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": re.sub(r"[^A-Za-z0-9_-]", "_", schema_id)[:64],
                                                   "schema": dict(sampling.json), "strict": True}}
    return body


def request_body(model: str, request: Mapping[str, Any], params: Mapping[str, Any], vllm: bool) -> dict[str, Any]:
    """The JSON body of one chat completion. A vLLM server also gets its own structured-output field (the
    same schema: the response_format of older vLLM releases or other servers may be advisory). Pure."""
    body = {"model": model, "messages": request["messages"], **params}
    if vllm and "response_format" in params:
        body["structured_outputs"] = {"json": params["response_format"]["json_schema"]["schema"]}
    return body


def retry_after_seconds(value: str | None, now: float) -> float | None:
    """`Retry-After` as seconds: delta-seconds or an HTTP date. Pure."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


def retry_delay(status: int | None, retry_after: float | None, tries: int, s: OpenAISettings,
                jitter: float) -> float | None:
    """Seconds to wait before the next try, or None when the failure is final. `status` None is a
    connection error; `tries` is how many tries were made; `jitter` is uniform in [0, 1). Pure."""
    if status is not None and status not in (408, 429) and status < 500:
        return None  # the request itself is wrong: the same request fails the same way
    if tries > s.max_retries:
        return None
    if retry_after is not None and retry_after > MAX_RETRY_AFTER_S:
        return None
    backoff = min(s.max_backoff_s, s.backoff_s * 2 ** (tries - 1))
    wait = backoff * (0.5 + 0.5 * jitter)  # half fixed, half random: retries of many pages spread out
    return max(wait, retry_after or 0.0)


def failure_reason(status: int | None, text: str) -> str:
    """The reason code of a final failure. Pure."""
    if status is None or status >= 500 or status == 408:
        return SERVER_ERROR
    if status == 429:
        return RATE_LIMITED
    low = text.lower()
    if status == 400 and any(s in low for s in ("context length", "max_model_len", "too long", "maximum context")):
        return OVER_TOKEN_BUDGET
    return ENGINE_ERROR


class WallShares:
    """Wall time while requests are in flight, shared equally by those in flight (event-loop thread only)."""

    def __init__(self) -> None:
        self._open: dict[int, float] = {}
        self._last = time.perf_counter()
        self.busy_seconds = 0.0

    def _advance(self) -> None:
        now = time.perf_counter()
        if self._open:
            share = (now - self._last) / len(self._open)
            for key in self._open:
                self._open[key] += share
            self.busy_seconds += now - self._last
        self._last = now

    def begin(self, key: int) -> None:
        self._advance()
        self._open[key] = 0.0

    def end(self, key: int) -> float:
        self._advance()
        return self._open.pop(key, 0.0)


class OpenAIEngine:
    """The engine contract (base.py) over an OpenAI-compatible endpoint. Thread-safe: any thread may submit."""

    def __init__(self, endpoint: OpenAISettings) -> None:
        self.endpoint = endpoint
        self.starts = 0
        self.vllm = False
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: Any = None
        self._slots: asyncio.Semaphore | None = None
        self._pending: set[Future[Completion]] = set()
        self._shares = WallShares()
        self._ids = itertools.count()
        self._down: str | None = None  # why the endpoint is taken for dead; then every request fails at once

    def abort(self, future: Any) -> None:
        """Nothing to free: an HTTP request runs out on its own (its --timeout); the feed has ended the page."""

    @property
    def busy_seconds(self) -> float:
        return self._shares.busy_seconds

    def start(self) -> None:
        self._started()

    def sequences(self) -> int:
        return max(1, self.endpoint.concurrency)

    def prepare(self, request: PageRequest) -> Prepared:
        """The OpenAI messages (prompt.py): the server holds the tokenizer and counts the prompt."""
        try:
            return build_request(request)
        except Exception as err:  # this page's input (an undecodable image), not the endpoint
            raise RequestRejected(f"request could not be built: {type(err).__name__}: {err}") from err

    def restart(self, seen: int | None = None) -> None:
        """Nothing to re-create: a server that went away is the server's to restart."""

    def submit(self, prepared: Prepared, sampling: Sampling) -> Future[Completion]:
        try:
            loop = self._started()
        except Exception as err:
            raise EngineDead(f"the endpoint client: {type(err).__name__}: {err}") from err
        future: Future[Completion] = Future()
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._forget)
        params = sampling_body(sampling, prepared.request.get("schema_id", "schema"))
        asyncio.run_coroutine_threadsafe(self._call(prepared.request, params, future), loop)
        return future

    def shutdown(self) -> None:
        self.close()

    def close(self) -> None:
        """Stop the event loop; a request still in flight fails (never a future left unresolved)."""
        with self._lock:
            loop, thread, client = self._loop, self._thread, self._client
            self._loop = self._thread = self._client = None
            pending, self._pending = list(self._pending), set()
        if loop is not None:
            if client is not None:
                try:
                    asyncio.run_coroutine_threadsafe(client.aclose(), loop).result(timeout=5)
                except Exception as err:  # noqa: BLE001 - best effort at the end of a run
                    log.warning("closing the HTTP client: %s: %s", type(err).__name__, err)
            loop.call_soon_threadsafe(loop.stop)
            if thread is not None:
                thread.join(timeout=5)
        for future in pending:
            if not future.done():
                future.set_exception(EngineDead("engine was shut down"))

    def _forget(self, future: Future[Completion]) -> None:
        with self._lock:
            self._pending.discard(future)

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is not None:
                return self._loop
            self.vllm = self._probe_vllm()
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="pagemill-endpoint", daemon=True)
            thread.start()
            asyncio.run_coroutine_threadsafe(self._open(), loop).result()
            self._loop, self._thread = loop, thread
            self.starts += 1
            log.info("endpoint %s, model %s: %d requests in flight at most (vLLM server: %s)",
                     redact_url(self.endpoint.base_url), self.endpoint.model, self.endpoint.concurrency, self.vllm)
            return loop

    async def _open(self) -> None:
        import httpx

        n = max(1, self.endpoint.concurrency)
        self._slots = asyncio.Semaphore(n)
        # identity: the answer is read raw, so its size cap holds for what is held (no decompression bomb)
        self._client = httpx.AsyncClient(
            base_url=self.endpoint.base_url,
            headers={**auth_headers(self.endpoint.api_key_env), "Accept-Encoding": "identity"},
            timeout=httpx.Timeout(self.endpoint.request_timeout_s, connect=min(10.0, self.endpoint.request_timeout_s)),
            limits=httpx.Limits(max_connections=n, max_keepalive_connections=n))

    def _probe_vllm(self) -> bool:
        """Whether the server is vLLM (its /models entries say `owned_by: vllm`): it then gets vLLM's extras."""
        s = self.endpoint
        try:
            return any(m.get("owned_by") == "vllm" for m in model_list(s.base_url, s.api_key_env, PROBE_TIMEOUT_S))
        except Exception as err:  # noqa: BLE001 - pre-flight checked the endpoint; a generic server then
            log.warning("endpoint %s: /models: %s: %s", redact_url(self.endpoint.base_url), type(err).__name__, err)
            return False

    async def _call(self, request: dict[str, Any], params: Any, future: Future[Completion]) -> None:
        try:
            completion = await self._complete(request, params)
        except RequestFailed as err:
            _settle(future, error=err)
        except Exception as err:  # noqa: BLE001 - anything else fails this page alone, as a row
            _settle(future, error=RequestFailed(ENGINE_ERROR, f"{type(err).__name__}: {err}"))
        else:
            _settle(future, result=completion)

    async def _exchange(self, body: Mapping[str, Any], cap: int) -> tuple[int, bytes, bool, Any]:
        """One try: the status, the body read up to `cap` (an error's up to ERROR_BODY_BYTES), whether it was
        read whole, and the headers. Leaving the stream unread closes its connection."""
        assert self._client is not None
        async with self._client.stream("POST", "/chat/completions", json=body) as response:
            limit = cap if response.status_code == 200 else ERROR_BODY_BYTES
            data, whole = await read_capped(response, limit)
            return response.status_code, data, whole, response.headers

    async def _complete(self, request: dict[str, Any], params: Any) -> Completion:
        import httpx

        s = self.endpoint
        body = request_body(s.model, request, params, self.vllm)
        max_tokens = int(body.get("max_tokens") or 0)
        cap = answer_cap(max_tokens)
        assert self._slots is not None and self._client is not None
        async with self._slots:
            tries = 0
            while True:
                if self._down is not None:
                    raise RequestFailed(SERVER_ERROR, f"endpoint {redact_url(s.base_url)} is down: {self._down}")
                tries += 1
                key = next(self._ids)
                self._shares.begin(key)
                status, text, retry_after = None, "", None
                try:
                    status, data, whole, headers = await asyncio.wait_for(self._exchange(body, cap),
                                                                          s.request_timeout_s)
                    text = "" if status == 200 else data.decode("utf-8", "replace")
                    retry_after = retry_after_seconds(headers.get("retry-after"), time.time())
                except (TimeoutError, httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout):
                    raise RequestFailed(ENGINE_TIMEOUT, f"no answer within --request-timeout-s "
                                                          f"{s.request_timeout_s:g} (try {tries})") from None
                except httpx.TransportError as err:  # refused, reset, lost mid-answer, connect timeout
                    text = f"{type(err).__name__}: {err}"
                finally:
                    seconds = self._shares.end(key)
                if status == 200:
                    answer = answer_data(data, whole, headers.get("content-encoding", "").strip().lower(), cap)
                    output = completion_output(answer, int(request.get("image_tokens", 0)), max_tokens)
                    return Completion(output, seconds)
                wait = retry_delay(status, retry_after, tries, s, random.random())
                if wait is None:
                    what = f"HTTP {status}" if status is not None else "connection failed"
                    if status is None:
                        self._down = text[:200]
                    raise RequestFailed(failure_reason(status, text),
                                        f"{what} after {tries} tries: {text[:300]}")
                log.debug("endpoint: HTTP %s, try %d again in %.1f s", status, tries, wait)
                await asyncio.sleep(wait)


def _settle(future: Future[Completion], result: Completion | None = None, error: Exception | None = None) -> None:
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]
    except InvalidStateError:  # failed by close() meanwhile
        pass
