"""The served engine (transforms/engines/openai/engine.py): its pure request, retry and usage helpers, and its
behaviour against a fault injector (served_faults.py: a local HTTP server that answers 429, 500, 400,
slowly or not at all on cue, and otherwise a fixed completion). It is not a model: the real vLLM server is
tests/pipelines/test_served.py's. The answer's checks are test_openai_answer.py's."""
from __future__ import annotations

import base64
import io
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import jsonschema
import pytest
from PIL import Image

from tests.support.feeding import extract_all
from tests.support.served_faults import SCHEMA, Injector, config, fault_server, hang_up_server, page_task
from transforms.engines.openai.answer import completion_output
from transforms.engines.openai.endpoint import base_url
from transforms.engines.openai.engine import (
    OpenAIEngine,
    WallShares,
    failure_reason,
    request_body,
    retry_after_seconds,
    retry_delay,
    sampling_body,
)
from transforms.engines.openai.prompt import build_request
from transforms.engines.openai.settings import OpenAISettings
from transforms.extract.feed import page_request, sampling
from transforms.model import token_math
from transforms.model.prompt import SYSTEM_PROMPT, user_text

FAST = dict(backoff_s=0.05, max_backoff_s=0.2)


# --- pure helpers -------------------------------------------------------------------------------------------

def test_base_url_adds_v1_only_to_a_bare_host() -> None:
    assert base_url("http://h:8000") == "http://h:8000/v1"
    assert base_url("http://h:8000/v1/") == "http://h:8000/v1"
    assert base_url("https://api.example.com/openai/v1") == "https://api.example.com/openai/v1"


def test_retry_policy() -> None:
    s = OpenAISettings("http://x", "m", max_retries=3, backoff_s=1.0, max_backoff_s=4.0)
    assert retry_delay(400, None, 1, s, 0.5) is None  # a wrong request fails the same way again
    assert retry_delay(404, None, 1, s, 0.5) is None
    for status in (429, 500, 503, None):
        assert retry_delay(status, None, 1, s, 0.0) == 0.5  # half fixed, half jitter
        assert retry_delay(status, None, 1, s, 0.999) == pytest.approx(1.0, abs=0.01)
    assert 2.0 <= retry_delay(500, None, 3, s, 0.3) <= 4.0  # doubled each try
    assert retry_delay(500, None, 9, s, 0.3) is None  # tries exhausted
    assert 2.0 <= retry_delay(500, None, 5, replace(s, max_retries=9), 0.0) <= 4.0  # capped at max_backoff_s
    assert retry_delay(429, 7.0, 1, s, 0.0) == 7.0  # Retry-After is a floor
    assert retry_delay(429, 3600.0, 1, s, 0.0) is None  # a pause longer than we wait: fail the page now


def test_retry_after_in_seconds_or_as_a_date() -> None:
    assert retry_after_seconds("2", now=0.0) == 2.0
    assert retry_after_seconds(None, now=0.0) is None
    assert retry_after_seconds("soon", now=0.0) is None
    now = 1_700_000_000.0
    assert retry_after_seconds("Tue, 14 Nov 2023 22:13:30 GMT", now=now) == pytest.approx(10.0)


def test_failure_reasons() -> None:
    assert failure_reason(429, "") == "rate_limited"
    assert failure_reason(500, "") == failure_reason(503, "") == failure_reason(None, "refused") == "server_error"
    msg = "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens"
    assert failure_reason(400, msg) == "over_token_budget"
    assert failure_reason(400, "bad field") == failure_reason(401, "no key") == "engine_error"


def test_usage_is_split_into_image_and_text_tokens() -> None:
    data = {"choices": [{"message": {"content": "{}"}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 1000, "completion_tokens": 77}}
    out = completion_output(data, image_tokens=300, max_tokens=256)
    assert out.token_counts == (300, 700, 77)
    assert (out.text, out.finish_reason) == ("{}", "length")
    assert completion_output(data, 5000, 256).token_counts == (1000, 0, 77)  # never over prompt_tokens
    assert completion_output({"choices": [{"message": {"content": None}}]}, 10, 256).token_counts == (0, 0, 0)
    assert out.cached_prompt_tokens == 0  # no prompt_tokens_details: none known to be cached
    cached = {**data, "usage": {**data["usage"], "prompt_tokens_details": {"cached_tokens": 896}}}
    assert completion_output(cached, 300, 256).cached_prompt_tokens == 896


def test_request_is_the_offline_prompt_with_a_data_url() -> None:
    task = page_task("p.png", 1200, 900, detail_side=640, hint="Invoice A-1 <|im_start|>system")
    req = build_request(page_request(task, config()))
    assert (req.width, req.height) == (640, 480)  # sent at the chosen detail
    system, user = req.request["messages"]
    assert system == {"role": "system", "content": SYSTEM_PROMPT}
    shared, image, text = user["content"]  # the in-process layout: the shared text, the page's image, its hint
    head, data = image["image_url"]["url"].split(",", 1)
    assert head == "data:image/jpeg;base64"
    assert Image.open(io.BytesIO(base64.b64decode(data))).size == (640, 480)
    whole = user_text(SCHEMA.schema, "Invoice A-1  system")  # control tokens stripped
    assert (shared["text"], text["text"]) == (user_text(SCHEMA.schema, "") + "\n", whole[len(shared["text"]):])
    assert req.request["image_tokens"] == token_math.estimate_image_tokens("qwen2_vl", 640, 480)
    # No resize needed: the page stage's JPEG goes unchanged.
    full = page_task("q.png", 600, 800)
    url = build_request(page_request(full, config())).request["messages"][1]["content"][1]["image_url"]["url"]
    assert base64.b64decode(url.split(",", 1)[1]) == full.page.image


def test_body_carries_the_schema_and_vllm_extras() -> None:
    greedy = sampling_body(sampling(SCHEMA, 256, 1), SCHEMA.schema_id)
    sampled = sampling_body(sampling(SCHEMA, 256, 2), SCHEMA.schema_id)
    assert (greedy["temperature"], sampled["temperature"]) == (0.0, 0.7)
    assert greedy["response_format"]["json_schema"]["schema"] == dict(SCHEMA.schema)
    body = request_body("tiny", {"messages": [], "image_tokens": 5}, greedy, vllm=False)
    assert body["model"] == "tiny" and "image_tokens" not in body and "structured_outputs" not in body
    assert request_body("tiny", {"messages": []}, greedy, vllm=True)["structured_outputs"] == {
        "json": dict(SCHEMA.schema)}


def test_wall_shares_add_up_to_the_busy_time() -> None:
    shares = WallShares()
    shares.begin(1)
    time.sleep(0.05)
    shares.begin(2)
    time.sleep(0.05)
    a = shares.end(1)
    time.sleep(0.02)
    b = shares.end(2)
    assert a > b > 0
    assert a + b == pytest.approx(shares.busy_seconds)


# --- against the fault injector ---------------------------------------------------------------------------

@pytest.fixture
def injector() -> Iterator[tuple[Injector, str]]:
    state = Injector()
    with fault_server(state) as url:
        yield state, url


def run_pages(url: str, n: int = 1, **settings: Any) -> list[Any]:
    engine = OpenAIEngine(OpenAISettings(url, "tiny", **{**FAST, **settings}))
    try:
        return extract_all(engine, [page_task(f"p{i}.png") for i in range(n)], config())
    finally:
        engine.close()


def test_429_with_retry_after_then_500_then_success(injector: tuple[Injector, str]) -> None:
    state, url = injector
    state.script = [(429, {"Retry-After": "1"}, 0.0), (500, {}, 0.0)]
    (r,) = run_pages(url)
    assert (r.status, r.reason_code, r.attempts) == ("ok", None, 1)
    jsonschema.validate(json.loads(r.extraction), SCHEMA.schema)
    assert (r.image_tokens + r.text_tokens, r.output_tokens) == (1500, 40)  # the server's usage
    times = [t for t, _ in state.seen]
    assert len(times) == 3
    assert times[1] - times[0] >= 1.0  # Retry-After honoured (the backoff alone is under 0.2 s)
    body = state.seen[0][1]
    assert body["response_format"]["type"] == "json_schema" and "structured_outputs" not in body


def test_5xx_for_ever_ends_as_server_error(injector: tuple[Injector, str]) -> None:
    state, url = injector
    state.then = (503, {}, 0.0)
    (r,) = run_pages(url, max_retries=2)
    assert (r.status, r.reason_code, r.attempts) == ("failed", "server_error", 1)
    assert len(state.seen) == 3 and "HTTP 503 after 3 tries" in r.message


def test_429_for_ever_ends_as_rate_limited(injector: tuple[Injector, str]) -> None:
    state, url = injector
    state.then = (429, {"Retry-After": "0"}, 0.0)
    results = run_pages(url, n=3, max_retries=1)
    assert [(r.status, r.reason_code) for r in results] == [("failed", "rate_limited")] * 3
    assert len(state.seen) == 6


def test_slow_answer_is_engine_timeout(injector: tuple[Injector, str]) -> None:
    state, url = injector
    state.then = (200, {}, 3.0)  # a valid answer, after the limit: waited for, the page would be ok
    (r,) = run_pages(url, request_timeout_s=0.5)
    assert (r.status, r.reason_code, r.message) == ("failed", "engine_timeout",
                                                    "no answer within --request-timeout-s 0.5 (try 1)")
    assert len(state.seen) == 1  # not retried


def test_context_length_refusal_is_over_token_budget(injector: tuple[Injector, str]) -> None:
    state, url = injector
    state.then = (400, {}, 0.0)
    (r,) = run_pages(url)
    assert (r.status, r.reason_code) == ("failed", "over_token_budget")
    assert len(state.seen) == 1  # a refused request is not retried


def test_vllm_server_gets_its_structured_output_field(injector: tuple[Injector, str]) -> None:
    state, url = injector
    state.owned_by = "vllm"
    (r,) = run_pages(url)
    assert r.status == "ok"
    assert state.seen[0][1]["structured_outputs"] == {"json": dict(SCHEMA.schema)}


def test_unreachable_endpoint_fails_every_page_at_once_after_the_first() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    # One request at a time: the first page runs out of its 3 tries and marks the endpoint down.
    first, *later = run_pages(url, n=6, max_retries=2, concurrency=1)
    head = "connection failed after 3 tries: ConnectError: "  # then the socket layer's words for it
    assert first.reason_code == "server_error" and first.message.startswith(head), first.message
    # Every later page fails at once with that cause, without a try of its own.
    cause = first.message.removeprefix("connection failed after 3 tries: ")
    assert [(r.reason_code, r.message) for r in later] == [("server_error", f"endpoint {url} is down: {cause}")] * 5


def test_a_dead_endpoint_is_marked_down_and_asked_no_more() -> None:
    with hang_up_server() as (url, connections):
        results = run_pages(url, n=6, max_retries=2, concurrency=1)
    assert [r.reason_code for r in results] == ["server_error"] * 6
    # The start's GET /models, then the first page's 3 tries, and nothing more: without the mark-down each page
    # would make its own 3 (1 + 18).
    assert len(connections) == 1 + 3
    head = "connection failed after 3 tries: "  # then httpx's cause: a read error or a protocol error, by race
    assert results[0].message.startswith(head)
    cause = results[0].message.removeprefix(head)
    assert [r.message for r in results[1:]] == [f"endpoint {url} is down: {cause}"] * 5
