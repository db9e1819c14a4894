"""The engine contract: what the extraction feed (transforms/extract/feed.py) asks of any engine, in one place.

An engine answers pages. Each backend has one name, the same in the `--engine` value, its settings' `kind`, its
class and its room: `vllm_local` (VllmLocalSettings, VllmLocalEngine: vLLM in this process, vllm_local/),
`vllm_machine` (VllmMachineSettings, VllmMachineEngine: one engine per machine behind a socket, vllm_machine/),
`openai` (OpenAISettings, OpenAIEngine: an OpenAI-compatible endpoint, openai/) and `simulated` (SimulatedSettings,
SimulatedEngine: benchmarks and tests, simulated.py); the two vLLM backends share vllm_shared/. Every engine is
made by `transforms.engines.make(settings)`, the only maker, from its settings' `kind`, and implements `PageEngine`:

- `start()`: make the engine ready (a no-op when it is); engines also start on first use.
- `prepare(PageRequest) -> Prepared`: the engine's own request for one page, built once and reused by every
  attempt (the vLLM engines: chat template, token budget fit and decoded image, vllm_shared/templated.py; the
  OpenAI engine: the OpenAI messages with the page as a data URL, openai/prompt.py). A `PageRequest` is neutral:
  the page's encoded bytes (`PageSource`), the prompt's parts (`PromptParts`: what to ask, a JSON schema or a
  prompt's words, never an output format object; each engine strips its model's control tokens from the hint and
  applies its own template) and the token budget (`TokenBudget`).
- `submit(Prepared, Sampling) -> Future[Completion]`: one attempt. `Sampling` is pagemill's decoding settings and
  what constrains the answer (a JSON schema or a regex); each engine turns it into its own form (vLLM
  SamplingParams, the endpoint body's fields, JSON on the machine engine's wire).
  A `Completion`'s `Answer` carries its text, finish reason and token counts (image, text, output, cached
  prompt tokens) as the engine counted them, so the feed needs no tokenizer.
- `abort(future)`: give up on one request (--answer-timeout-s), freeing its sequence; the feed has already
  ended the page (the OpenAI engine has nothing to free: its late answer is not read).
- `restart(seen)`: re-create a dead engine, unless it moved on from start number `seen` already (`starts`).
- `shutdown()`: stop and free the engine (the last user of a process's feed is gone); used again, it starts again.
- `sequences()`: how many requests it runs at once (the feed keeps about twice that in flight).

Failures are classes, raised by `prepare` or set on a submit's future:
- `RequestRejected`: the engine refused this one request (invalid input): the attempt fails with
  `engine_error`; nothing restarts.
- `RequestFailed`: the request failed for good with a documented reason code (after the engine's own retries,
  or `over_token_budget` from `prepare`): the page ends with that reason.
- `EngineDead`: the engine died: the feed restarts it once and resubmits the page. From `prepare` (the
  engine cannot start, its tokenizer cannot load) the page fails `engine_error` saying why.
The feed takes any other exception from an engine as `EngineDead` (the conservative reading).

Where kinds differ (every kind passes the one contract suite, tests/transforms/engines/contract_suite.py, which
asserts these): an answer's image tokens are the page's (at the size sent) and its text tokens are the count
`prepare` made (`Prepared.text_tokens`), except for an endpoint, whose server counts the prompt (`text_tokens` 0
there). A prompt over the engine's context is `RequestRejected` by the vLLM engines, `RequestFailed`
`over_token_budget` from an endpoint (its HTTP 400); the simulated engine has no context and answers it.
An endpoint cannot free an aborted request (its answer still comes, unread), and cannot restart its server: a
server that is gone fails its requests `RequestFailed` `server_error` (the endpoint is then marked down),
`restart` is a no-op and `starts` counts only the client's starts. The simulated engine has no process to die;
its `restart(seen)` counts a start once per `seen`, like the others.
"""
from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from transforms.model.prompt import PromptText


class RequestRejected(Exception):
    """The engine refused this one request (invalid input): it fails alone, the engine is fine."""


class RequestFailed(Exception):
    """One request failed for good with `reason_code` (schemas' reason codes); `text_tokens`: the prompt's text
    tokens where they were counted (an over-budget page records them on its row)."""

    def __init__(self, reason_code: str, message: str, text_tokens: int = 0) -> None:
        super().__init__(message)
        self.reason_code = reason_code
        self.text_tokens = text_tokens


class EngineDead(Exception):
    """The engine died or cannot start: every request in it is lost (the feed restarts it once)."""


@dataclass(frozen=True)
class PageSource:
    """A page as encoded bytes (the page stage's JPEG), its detail side (0: full detail) and, once fitted to
    the token budget, the size the engine sees it at (None: as decoded and capped)."""

    data: bytes
    detail_side: int
    size: tuple[int, int] | None = None


@dataclass(frozen=True)
class PromptParts:
    """What the prompt asks for: its words (`text`: pagemill's JSON prompt of the schema, transforms.model.prompt.
    json_prompt, or a markdown format's; made once per run, ExtractConfig.prompt_words), `hint`: the page's text,
    which each engine cleans of its model's control tokens, and `schema_id`: the answer's name (an endpoint's
    response_format). Whether the answer is constrained, and by what, is the request's Sampling."""

    text: PromptText
    schema_id: str
    hint: str


@dataclass(frozen=True)
class TokenBudget:
    """The facts a prompt is fitted by: the context length, the answer's tokens, the image token rule."""

    max_model_len: int
    max_tokens: int
    model_family: Any  # a family name or a transforms.model.token_math rule


@dataclass(frozen=True)
class PageRequest:
    page: PageSource
    prompt: PromptParts
    budget: TokenBudget
    model: str = ""  # the model's name or folder (the served engine reads its tokenizer's control tokens there)


@dataclass(frozen=True)
class Prepared:
    """An engine's own request for one page (`request`: what only that engine reads), with the prompt's text
    tokens (0 where the server counts them) and the image size sent."""

    request: Any
    text_tokens: int
    width: int
    height: int


@dataclass(frozen=True)
class Sampling:
    """One attempt's decoding settings; `json` (a JSON schema) or `regex` constrains the answer."""

    temperature: float
    top_p: float
    max_tokens: int
    json: Mapping[str, Any] | None = None
    regex: str | None = None

    def fields(self) -> dict[str, Any]:
        """As JSON fields (the engine service's wire)."""
        out: dict[str, Any] = {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens}
        if self.json is not None:
            out["json"] = dict(self.json)
        elif self.regex is not None:
            out["regex"] = self.regex
        return out

    @classmethod
    def of_fields(cls, fields: Mapping[str, Any]) -> Sampling:
        return cls(float(fields["temperature"]), float(fields["top_p"]), int(fields["max_tokens"]),
                   fields.get("json"), fields.get("regex"))


@dataclass(frozen=True)
class Answer:
    """One finished request's answer and its token counts, as the engine counted them."""

    text: str
    finish_reason: str | None
    image_tokens: int
    text_tokens: int
    output_tokens: int
    cached_prompt_tokens: int = 0

    @property
    def token_counts(self) -> tuple[int, int, int]:
        return self.image_tokens, self.text_tokens, self.output_tokens


@dataclass(frozen=True)
class Completion:
    """One finished request: its answer and its share of the engine's busy time."""

    output: Answer
    gpu_seconds: float


class PageEngine(Protocol):
    """The lifecycle every engine implements (see the module's docstring)."""

    starts: int  # how many times the engine has started: `restart(seen)` is a no-op once it moved on

    def start(self) -> None: ...

    def prepare(self, request: PageRequest) -> Prepared: ...

    def submit(self, prepared: Prepared, sampling: Sampling) -> Future[Completion]: ...

    def abort(self, future: Future[Completion]) -> None: ...

    def restart(self, seen: int | None = None) -> None: ...

    def shutdown(self) -> None: ...

    def sequences(self) -> int: ...
