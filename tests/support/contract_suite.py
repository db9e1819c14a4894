"""The engine contract's suite (transforms/engines/base.py): the checks every engine kind must pass, written once.

Each check is a plain function of a `Subject` (an engine, its kind, and how to kill it); the test files that
already start each engine run them on it (no engine is started for the suite):
- simulated: tests/transforms/engines/test_engine_contract.py;
- vllm_local and vllm_machine (the session engine, behind the machine service's real socket in threads):
  tests/transforms/extract/test_extract.py;
- openai (vLLM's real OpenAI-compatible server): tests/pipelines/test_served.py.
Where a kind documents a different behaviour (base.py's docstring, `Behaviour` here), the check asserts that.
"""
from __future__ import annotations

import io
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import pytest
from PIL import Image

from schemas.reasons import OVER_TOKEN_BUDGET, SERVER_ERROR
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
from transforms.model.prompt import json_prompt

WAIT_S = 300.0  # a guard against a hang (a CPU engine on a loaded machine), not a speed limit
PAGE_SIZE = (280, 392)
# Qwen2-VL (the tiny model's family; the simulated engine counts as it does): one image token per 28x28 pixels
# (14 px patches merged 2x2); 280 x 392 is already a multiple of 28 and within its pixel limits: 10 x 14.
PAGE_IMAGE_TOKENS = 140
SCHEMA = {"type": "object", "properties": {"invoice_number": {"type": "string"}}}
SHORT = Sampling(temperature=0.0, top_p=1.0, max_tokens=16)
# Long enough to be in flight when aborted or killed: the repetition guard stops a loop after 129 tokens at the
# earliest (transforms/engines/vllm_shared/repetition.py), and a random model rarely ends sooner.
LONG = Sampling(temperature=0.0, top_p=1.0, max_tokens=1000)


@dataclass(frozen=True)
class Behaviour:
    """What a kind documents where the contract lets kinds differ (base.py's docstring says why)."""

    counts_prompt: bool  # prepare counts the prompt's text tokens (else 0: the server counts them)
    frees_aborted: bool  # abort frees the sequence and fails the future (else: nothing to free)
    overlong: type[Exception] | None  # what a prompt over the engine's context gets (None: it has no context)
    restarts: bool  # its death is EngineDead and restart(seen) makes a new engine (else: restart is a no-op)


BEHAVIOUR = {
    "vllm_local": Behaviour(counts_prompt=True, frees_aborted=True, overlong=RequestRejected, restarts=True),
    "vllm_machine": Behaviour(counts_prompt=True, frees_aborted=True, overlong=RequestRejected, restarts=True),
    "openai": Behaviour(counts_prompt=False, frees_aborted=False, overlong=RequestFailed, restarts=False),
    "simulated": Behaviour(counts_prompt=True, frees_aborted=True, overlong=None, restarts=True),
}


@dataclass(frozen=True)
class Subject:
    """An engine under the contract. `die(submit)` submits through `submit` and kills the engine (its process,
    server or core) while that request is in flight, returning its future; None: the kind has nothing to kill.
    `held()`: how many requests the engine itself still holds, where it can tell (None: it cannot)."""

    engine: PageEngine
    kind: str
    model: str = ""  # PageRequest.model: the served engine reads the tokenizer's control tokens there
    die: Callable[[Callable[[], Future[Completion]]], Future[Completion]] | None = None
    held: Callable[[], int] | None = None

    @property
    def behaviour(self) -> Behaviour:
        return BEHAVIOUR[self.kind]


def page_jpeg(size: tuple[int, int] = PAGE_SIZE) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (230, 230, 230)).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def page_request(s: Subject, hint: str = "Invoice 7, total 12.00", data: bytes | None = None,
                 max_model_len: int = 8192) -> PageRequest:
    return PageRequest(PageSource(page_jpeg() if data is None else data, 0),
                       PromptParts(json_prompt(SCHEMA), "contract", hint),
                       TokenBudget(max_model_len, SHORT.max_tokens, "qwen2_vl"), s.model)


def answer_of(future: Future[Completion]) -> Answer:
    return future.result(timeout=WAIT_S).output


def answered(s: Subject) -> Prepared:
    """A page prepared and answered (the engine is then started); its Prepared, for more attempts."""
    prepared = s.engine.prepare(page_request(s))
    assert answer_of(s.engine.submit(prepared, SHORT)).output_tokens > 0
    return prepared


def check_admission(s: Subject) -> None:
    """prepare + submit of a page answer, at the page's size; the engine says how many requests it runs."""
    prepared = s.engine.prepare(page_request(s))
    assert (prepared.width, prepared.height) == PAGE_SIZE
    answer = answer_of(s.engine.submit(prepared, SHORT))
    assert isinstance(answer.text, str) and answer.finish_reason in ("stop", "length", "repetition"), answer
    assert s.engine.sequences() >= 1 and s.engine.starts >= 1


def check_counts(s: Subject) -> None:
    """The answer's counts as the engine counted them: the page's image tokens (hand-derived for its size), the
    prompt's text tokens as prepare counted them with the model's tokenizer (where it counts them), and at most
    max_tokens output tokens (all of them when the answer was cut at the cap)."""
    prepared = s.engine.prepare(page_request(s))
    completion = s.engine.submit(prepared, SHORT).result(timeout=WAIT_S)
    a = completion.output
    assert a.image_tokens == PAGE_IMAGE_TOKENS, a
    assert a.text_tokens > 0 and 0 < a.output_tokens <= SHORT.max_tokens, a
    if a.finish_reason == "length":
        assert a.output_tokens == SHORT.max_tokens, a
    if s.behaviour.counts_prompt:
        assert a.text_tokens == prepared.text_tokens > 0, (a, prepared.text_tokens)
    else:
        assert prepared.text_tokens == 0
    assert completion.gpu_seconds >= 0


def check_abort(s: Subject) -> None:
    """An aborted request never resolves as an answer and frees its sequence: a later request answers and the
    engine holds nothing after it. An engine with nothing to free (openai) still resolves the aborted future."""
    prepared = s.engine.prepare(page_request(s))
    aborted = s.engine.submit(prepared, LONG if s.behaviour.frees_aborted else SHORT)  # else nothing is freed
    s.engine.abort(aborted)
    later = answer_of(s.engine.submit(prepared, SHORT))
    assert later.output_tokens > 0
    if s.behaviour.frees_aborted:
        assert aborted.exception(timeout=WAIT_S) is not None, "the aborted request answered"
        if s.held is not None:
            assert s.held() == 0, "the aborted request still holds its sequence"
    else:
        aborted.exception(timeout=WAIT_S)  # resolved on its own (its answer or a failure), never left hanging


def overlong_hint() -> str:
    """A hint of over 8,192 tokens for any tokenizer of about four characters a token or fewer."""
    return "word " * 8000


def check_refusal(s: Subject) -> None:
    """One bad request fails alone and nothing restarts: an undecodable page is RequestRejected at prepare; a
    prompt over the engine's context (a budget that claims more room than the engine has) gets the kind's
    documented failure at submit; the engine then answers the next page."""
    answered(s)
    starts = s.engine.starts
    with pytest.raises(RequestRejected):
        s.engine.prepare(page_request(s, data=b"not an image"))
    overlong = s.engine.prepare(page_request(s, hint=overlong_hint(), max_model_len=10**6))
    failure = s.engine.submit(overlong, SHORT).exception(timeout=WAIT_S)
    expected = s.behaviour.overlong
    if expected is None:
        assert failure is None, failure
    else:
        assert isinstance(failure, expected), repr(failure)
        if isinstance(failure, RequestFailed):
            assert failure.reason_code == OVER_TOKEN_BUDGET, failure.reason_code
    answered(s)
    assert s.engine.starts == starts  # a refused request is not a dead engine


def check_death_and_restart(s: Subject) -> None:
    """A request in flight when the engine dies fails as EngineDead; restart(seen) brings the engine back once
    (`starts` counts it), and a second restart(seen) for the same death restarts nothing. An engine with nothing
    to restart (openai: its server is already gone here) fails the request with `server_error` and counts no
    start."""
    prepared = answered(s) if s.behaviour.restarts else s.engine.prepare(page_request(s))
    seen = s.engine.starts
    if s.die is not None:
        failure = s.die(lambda: s.engine.submit(prepared, LONG)).exception(timeout=WAIT_S)
        if s.behaviour.restarts:
            assert isinstance(failure, EngineDead), repr(failure)
        else:
            assert isinstance(failure, RequestFailed) and failure.reason_code == SERVER_ERROR, repr(failure)
    s.engine.restart(seen)
    if not s.behaviour.restarts:
        assert s.engine.starts == seen
        return
    assert s.engine.starts == seen + 1
    answered(s)
    s.engine.restart(seen)  # a second report of the same death (another page's, another worker's)
    assert s.engine.starts == seen + 1
    answered(s)
    assert s.engine.starts == seen + 1


def check_shutdown(s: Subject) -> None:
    """After shutdown the engine is used again: it starts again and answers; `starts` never goes back."""
    answered(s)
    starts = s.engine.starts
    s.engine.shutdown()
    answered(s)
    assert s.engine.starts >= starts


CHECKS = (check_admission, check_counts, check_abort, check_refusal, check_death_and_restart, check_shutdown)
