"""A served endpoint's answer is untrusted (transforms/engines/openai/answer.py): read up to a cap derived from
--max-tokens and no further, its shape and usage counts checked; a bad answer fails its page as
`invalid_response` and nothing else. Against the fault injector (served_faults.py), a real HTTP server on
127.0.0.1 that sends these answers."""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.feeding import extract_all
from tests.support.served_faults import USAGE, Huge, Injector, completion, config, fault_server, page_task
from transforms.engines.openai.answer import BYTES_PER_TOKEN, ENVELOPE_BYTES, answer_cap
from transforms.engines.openai.engine import OpenAIEngine
from transforms.engines.openai.settings import OpenAISettings

MAX_TOKENS = 256  # config()'s
CAP = 64 * 1024 + 256 * MAX_TOKENS  # the documented cap, by hand: 64 KiB + 256 bytes a token = 131,072 bytes


@pytest.fixture
def injector() -> Iterator[tuple[Injector, str]]:
    state = Injector()
    with fault_server(state) as url:
        yield state, url


def run(url: str, n: int = 1) -> list[Any]:
    # One request at a time, in the pages' order: the first page gets the injector's first answer.
    engine = OpenAIEngine(OpenAISettings(url, "tiny", concurrency=1, backoff_s=0.05, max_backoff_s=0.2))
    try:
        return extract_all(engine, [page_task(f"p{i}.png") for i in range(n)], config(max_tokens=MAX_TOKENS))
    finally:
        engine.close()


def test_the_cap_is_the_documented_bound() -> None:
    assert (BYTES_PER_TOKEN, ENVELOPE_BYTES) == (256, 65536)
    assert answer_cap(MAX_TOKENS) == CAP == 131_072
    assert answer_cap(1024) == 320 * 1024  # docs/served.md: 320 KiB at the default --max-tokens


@pytest.mark.parametrize("declared", [False, True], ids=["streamed", "content-length"])
def test_an_answer_over_the_cap_fails_its_page_and_is_read_no_further(injector: tuple[Injector, str],
                                                                     declared: bool) -> None:
    state, url = injector
    total = 256 * 2**20  # 256 MiB offered; the page may hold 128 KiB of it
    state.bodies = [Huge(total, declared)]
    first, second = run(url, n=2)  # the second page gets a good answer: only the first fails
    assert (first.status, first.reason_code) == ("failed", "invalid_response"), first.message
    assert f"over {CAP} bytes" in first.message
    assert (second.status, second.reason_code) == ("ok", None)
    assert len(state.seen) == 2  # not retried
    # The client stopped reading and hung up: the server could write no more than the cap plus what the
    # sockets' buffers hold, a small part of what it offered.
    (sent,) = state.sent
    assert sent < total // 8, sent
    assert state.headers[0]["accept-encoding"] == "identity"  # raw bytes: the cap is what is held


@pytest.mark.parametrize(("usage", "says"), [
    ({"prompt_tokens": -10_000_000, "completion_tokens": 40}, "usage.prompt_tokens is -10000000, outside 0..16777216"),
    ({"prompt_tokens": 10**20, "completion_tokens": 40}, "usage.prompt_tokens is 100000000000000000000, outside"),
    ({"prompt_tokens": 1500, "completion_tokens": MAX_TOKENS + 1}, "usage.completion_tokens is 257, outside 0..256"),
    ({"prompt_tokens": 1500, "completion_tokens": -1}, "usage.completion_tokens is -1, outside 0..256"),
    ({"prompt_tokens": 1500.5, "completion_tokens": 40}, "usage.prompt_tokens is not an integer: '1500.5'"),
    ({"prompt_tokens": 1500, "completion_tokens": 40.0}, "usage.completion_tokens is not an integer: '40.0'"),
    ({"prompt_tokens": "1500", "completion_tokens": 40}, "usage.prompt_tokens is not an integer"),
    ({"prompt_tokens": True, "completion_tokens": 40}, "usage.prompt_tokens is not an integer: 'True'"),
    ([1500, 40], "usage is not an object"),
])
def test_usage_counts_that_are_not_counts_fail_the_page(injector: tuple[Injector, str], usage: Any,
                                                        says: str) -> None:
    state, url = injector
    state.bodies = [completion({}, usage=usage)]
    bad, good = run(url, n=2)
    assert (bad.status, bad.reason_code) == ("failed", "invalid_response")
    assert says in bad.message, bad.message
    assert (bad.image_tokens, bad.text_tokens, bad.output_tokens) == (0, 0, 0)  # nothing of it reaches the ledger
    assert (good.status, good.image_tokens + good.text_tokens, good.output_tokens) == ("ok", 1500, 40)


@pytest.mark.parametrize("usage", [
    {"prompt_tokens": 1500, "completion_tokens": MAX_TOKENS},  # at the limits: fine
    {"prompt_tokens": 0, "completion_tokens": 0},
    {},  # absent counts count 0, as servers without usage always did
])
def test_counts_within_the_bounds_are_taken(injector: tuple[Injector, str], usage: dict[str, int]) -> None:
    state, url = injector
    state.bodies = [completion({}, usage=usage)]
    (r,) = run(url)
    assert (r.status, r.reason_code) == ("ok", None)
    assert r.image_tokens + r.text_tokens == usage.get("prompt_tokens", 0)
    assert r.output_tokens == usage.get("completion_tokens", 0)


@pytest.mark.parametrize(("body", "says"), [
    (b"<html>gateway</html>", "the answer is not JSON"),
    (b'"just a string"', "the answer is not a JSON object"),
    (b"[" * 50_000 + b"]" * 50_000, "the answer is not JSON"),  # nested past the parser's recursion limit
    ({"choices": []}, "the answer has no choices"),
    ({"choices": [{"message": {"content": {"vendor_name": "x"}}}], "usage": USAGE},
     "the answer's message is not a chat completion's"),
    ({"choices": [{"message": "text"}], "usage": USAGE}, "the answer's message is not a chat completion's"),
])
def test_a_body_that_is_not_a_chat_completion_fails_the_page(injector: tuple[Injector, str], body: Any,
                                                             says: str) -> None:
    state, url = injector
    state.bodies = [body]
    (r,) = run(url)
    assert (r.status, r.reason_code) == ("failed", "invalid_response") and says in r.message, r.message


def test_a_compressed_answer_is_refused_not_inflated(injector: tuple[Injector, str]) -> None:
    import gzip

    state, url = injector
    state.script = [(200, {"Content-Encoding": "gzip"}, 0.0)]
    state.bodies = [gzip.compress(json.dumps(completion({})).encode())]
    (r,) = run(url)
    assert (r.status, r.reason_code) == ("failed", "invalid_response")
    assert "compressed (Content-Encoding: gzip)" in r.message
