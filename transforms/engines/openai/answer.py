"""An OpenAI-compatible endpoint's answer (engine.py), read and checked as untrusted input: a size
cap enforced while the body is read, and the response's shape and `usage` counts checked before anything
is taken from them. An answer that breaks them fails its page as `invalid_response`; never the run.

The cap. A page's answer is at most `--max-tokens` tokens, and BYTES_PER_TOKEN is a bound on a token's
text as the response carries it (JSON-escaped), not an estimate: typical tokens are 3-5 bytes; the long
ones are runs of spaces, newlines or punctuation, and the characters an escape writes as 6 bytes (`\\u0001`)
are single-byte tokens. A whole answer fails only if its tokens average over 256 bytes. So a body over
ENVELOPE_BYTES + BYTES_PER_TOKEN x max_tokens (320 KiB at the default 1024) is not an answer to this
request: it is read no further, and the page fails. The body is read raw (`Accept-Encoding: identity`, no
decompression), chunk by chunk, so a request holds at most the cap plus one network chunk: `--concurrency 8`
holds at most 8 caps.

The counts. `usage.prompt_tokens` and `usage.completion_tokens` must be integers (not floats, strings or
booleans), at least 0; completion_tokens at most the request's max_tokens, prompt_tokens at most
MAX_PROMPT_TOKENS (above any served model's context: a count past it is corrupt, and it would reach the
ledger's cost). A `usage` that is absent, or a count that is absent or null, counts 0 as before.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from schemas.reasons import INVALID_RESPONSE
from transforms.engines.base import Answer, RequestFailed

BYTES_PER_TOKEN = 256  # a bound on one token's JSON-escaped text, not an estimate (see above)
ENVELOPE_BYTES = 64 * 1024  # the response around the content: id, model, usage, finish_reason, ...
ERROR_BODY_BYTES = 64 * 1024  # an error answer is read this far: only its first lines are kept anyway
MAX_PROMPT_TOKENS = 1 << 24  # 16.8 M: over every served model's context length


def invalid(message: str) -> RequestFailed:
    return RequestFailed(INVALID_RESPONSE, message)


def answer_cap(max_tokens: int) -> int:
    """The most bytes a chat completion of `max_tokens` tokens can take. Pure."""
    return ENVELOPE_BYTES + BYTES_PER_TOKEN * max(1, max_tokens)


class CappedBody:
    """A body gathered chunk by chunk, up to `cap` bytes: `add` says False once there is more than that."""

    def __init__(self, cap: int, declared: str | None = None) -> None:
        self.cap, self.size, self.parts = cap, 0, []  # type: list[bytes]
        # A Content-Length over the cap: nothing is read at all.
        self.whole = not (declared is not None and declared.isdigit() and int(declared) > cap)

    def add(self, chunk: bytes) -> bool:
        self.size += len(chunk)
        if self.size > self.cap:
            self.parts.append(chunk[:self.cap - (self.size - len(chunk))])
            self.whole = False
        else:
            self.parts.append(chunk)
        return self.whole

    def result(self) -> tuple[bytes, bool]:
        return b"".join(self.parts), self.whole


async def read_capped(response: Any, cap: int) -> tuple[bytes, bool]:
    """An httpx streaming response's raw body (never decompressed) up to `cap` bytes: (body, True), or (at
    most the first `cap` bytes, False) when there was more, which is then never read."""
    body = CappedBody(cap, response.headers.get("content-length"))
    if body.whole:
        async for chunk in response.aiter_raw():
            if not body.add(chunk):
                break
    return body.result()


def read_capped_sync(response: Any, cap: int) -> tuple[bytes, bool]:
    """read_capped for a synchronous httpx stream."""
    body = CappedBody(cap, response.headers.get("content-length"))
    if body.whole:
        for chunk in response.iter_raw():
            if not body.add(chunk):
                break
    return body.result()


def answer_data(body: bytes, complete: bool, encoding: str, cap: int) -> Mapping[str, Any]:
    """A 200 answer's body as JSON, or `invalid_response`. Pure."""
    if not complete:
        raise invalid(f"the answer is over {cap} bytes (--max-tokens x {BYTES_PER_TOKEN} + "
                      f"{ENVELOPE_BYTES // 1024} KiB): not read further")
    if encoding not in ("", "identity"):
        raise invalid(f"the answer is compressed (Content-Encoding: {encoding[:40]}) although identity was asked")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as err:
        raise invalid(f"the answer is not JSON ({type(err).__name__})") from None
    if not isinstance(data, dict):
        raise invalid("the answer is not a JSON object")
    return data


def usage_count(usage: Mapping[str, Any], name: str, most: int) -> int:
    """One `usage` count, checked: an int in [0, most]; absent or null is 0. Pure."""
    value = usage.get(name)
    if value is None:
        return 0
    if type(value) is not int:  # bool is an int subclass, 3.0 is a float: neither is a count
        raise invalid(f"usage.{name} is not an integer: {str(value)[:40]!r}")
    if not 0 <= value <= most:
        raise invalid(f"usage.{name} is {str(value)[:40]}, outside 0..{most}")
    return value


def completion_output(data: Mapping[str, Any], image_tokens: int, max_tokens: int) -> Answer:
    """A chat completion's response as the Answer the feed reads, with token counts from `usage`;
    `invalid_response` when its shape or counts are not those of an answer to a request of `max_tokens`. Pure."""
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise invalid("the answer has no choices")
    choice = choices[0]
    message = choice.get("message") or {}
    text = message.get("content") if isinstance(message, dict) else None
    finish = choice.get("finish_reason")
    if not isinstance(message, dict) or not isinstance(text, str | None) or not isinstance(finish, str | None):
        raise invalid("the answer's message is not a chat completion's")
    usage = data.get("usage") or {}
    if not isinstance(usage, dict):
        raise invalid("usage is not an object")
    prompt = usage_count(usage, "prompt_tokens", MAX_PROMPT_TOKENS)
    output = usage_count(usage, "completion_tokens", max_tokens)
    image = min(image_tokens, prompt)
    # The prompt tokens the server's prefix cache held, where it says (OpenAI, vLLM with prompt-tokens details).
    details = usage.get("prompt_tokens_details") or {}
    cached = usage_count(details, "cached_tokens", prompt) if isinstance(details, dict) else 0
    return Answer(text or "", finish, image, prompt - image, output, cached)
