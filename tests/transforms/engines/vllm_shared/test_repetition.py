"""The repetition guard (transforms/engines/vllm_shared/repetition.py) on constructed token streams: a loop of a short
pattern is stopped exactly at the documented threshold, and streams that are not loops are never stopped."""
from __future__ import annotations

import random

import pytest

from tests.support.looping_core import LoopingCore
from transforms.engines.vllm_shared.repetition import MAX_PERIOD, SPAN, RepetitionGuard, retry_cap


def trip_point(tokens: list[int], chunk: int = 1) -> int | None:
    """How many tokens the guard had read when it tripped (None: never), fed `chunk` tokens at a time."""
    guard = RepetitionGuard()
    for start in range(0, len(tokens), chunk):
        if guard.feed(tokens[start:start + chunk]):
            return len(guard.tokens)
    return None


def distinct(n: int, first: int = 10_000) -> list[int]:
    return list(range(first, first + n))


def test_the_documented_threshold() -> None:
    # Written down in the module's docstring; the figures below are derived from it by hand.
    assert (MAX_PERIOD, SPAN) == (32, 128)
    assert retry_cap(1024) == 512 and retry_cap(1) == 1


@pytest.mark.parametrize("period", [1, 2, 7, 32])
def test_a_loop_is_stopped_when_its_last_span_tokens_repeat_the_pattern(period: int) -> None:
    # 50 tokens of an answer, then a pattern of `period` tokens over and over up to a cap of 8,192 tokens.
    prefix, pattern = distinct(50), list(range(1, period + 1))
    stream = prefix + (pattern * 8192)[:8192 - 50]
    # The loop's first copy of the pattern ends at token 50 + period; from there each token equals the one
    # `period` before it, and the guard trips at the SPAN-th such token.
    assert trip_point(stream) == 50 + period + SPAN
    assert trip_point(stream, chunk=5) == 50 + period + SPAN + (-(50 + period + SPAN) % 5)  # read a step at a time


def test_a_loop_one_token_short_of_the_threshold_goes_on() -> None:
    pattern = [5, 6, 7]
    assert trip_point(distinct(20) + (pattern * 100)[:3 + SPAN - 1] + distinct(300, 50_000)) is None
    assert trip_point(distinct(20) + (pattern * 100)[:3 + SPAN]) == 20 + 3 + SPAN


def test_streams_that_are_not_short_loops_are_never_stopped() -> None:
    rng = random.Random(7)
    assert trip_point([rng.randrange(50) for _ in range(8192)]) is None  # random text over a small vocabulary
    # A pattern longer than MAX_PERIOD repeated forever is not a *short* pattern.
    long_pattern = distinct(MAX_PERIOD + 1)
    assert trip_point(long_pattern * 200) is None
    # Many short runs of one token (a table's dashes, a TOC's dots), each under the span, broken by text.
    runs = [t for i in range(60) for t in [0] * 100 + distinct(3, 100 * i)]
    assert trip_point(runs) is None


def test_a_guard_stays_tripped_and_keeps_every_token() -> None:
    guard = RepetitionGuard(max_period=2, span=4)
    assert not guard.feed([1, 2, 1, 2, 1])  # 3 tokens equal the one two before
    assert guard.feed([2, 9, 9])  # the 4th trips; the rest of the step is kept as decoded
    assert guard.feed([]) and guard.tokens == [1, 2, 1, 2, 1, 2, 9, 9]
    with pytest.raises(ValueError):
        RepetitionGuard(max_period=0)


def test_the_engine_stops_a_looping_request_at_the_threshold_and_aborts_it() -> None:
    from tests.support.feed_setup import ENGINE
    from transforms.engines.base import Prepared, Sampling
    from transforms.engines.vllm_local.engine import VllmLocalEngine

    looping = distinct(40) + [1, 2, 3, 4, 5] * 2000
    fine = distinct(9000)
    engine = VllmLocalEngine(ENGINE)
    core = LoopingCore({1: looping, 2: fine})
    engine.llm = core  # started: the loop drives the fake core
    try:
        a = engine.submit(Prepared({"prompt": "a"}, 0, 0, 0), Sampling(0.0, 1.0, max_tokens=8192))
        b = engine.submit(Prepared({"prompt": "bb"}, 0, 0, 0), Sampling(0.0, 1.0, max_tokens=300))
        stopped, finished = a.result(timeout=60).output, b.result(timeout=60).output
    finally:
        engine._stopped.set()
    assert stopped.finish_reason == "repetition"
    assert stopped.output_tokens == 40 + 5 + SPAN  # stopped at the threshold, not at the cap of 8,192
    assert stopped.text == "".join(f"<{t}>" for t in looping[:40 + 5 + SPAN])
    assert core.aborted == ["0"]  # and aborted in the engine: its sequence freed
    assert (finished.finish_reason, finished.output_tokens) == ("length", 300)


def test_an_abort_that_comes_before_its_request_is_admitted_waits_for_it() -> None:
    """The step loop takes new requests, admits them, then reads the aborts: an abort made between the first and
    the last (a caller that gives up at once) finds its request not yet in flight. It is kept for the next turn,
    not lost (the request would run to its end); one whose future is done by then is dropped."""
    import queue
    from concurrent.futures import Future

    from transforms.engines.vllm_shared.repetition import StreamedAnswer, aborted

    aborts: queue.SimpleQueue[Future[object]] = queue.SimpleQueue()
    early, answered = Future(), Future()
    aborts.put(early)
    aborts.put(answered)
    answered.set_result(None)  # ended before the loop read its abort (refused at admission): nothing to abort
    assert aborted(aborts, {}) == []  # neither is in flight
    assert aborted(aborts, {"7": StreamedAnswer(early)}) == ["7"]  # admitted at the next turn: aborted then
    assert aborts.empty()


# The feed's side: a looping attempt is retried once with the next decoding setting and half the cap.
class LoopingEngine:
    """An engine whose answers end as the repetition guard ends them, `loops` times, then normally."""

    def __init__(self, loops: int, text: str, looped_tokens: int = 40 + 5 + SPAN) -> None:
        from transforms.engines.simulated import SimulatedEngine

        self.inner = SimulatedEngine(slots=4, seconds=0.0, text=text)
        self.loops, self.looped_tokens = loops, looped_tokens
        self.caps: list[tuple[int, int]] = []  # (attempt, max_tokens) of each submit
        self.starts = 1

    def submit(self, prepared, sampling):
        from concurrent.futures import Future

        from transforms.engines.base import Answer, Completion
        from transforms.model.prompt import decoding

        attempt = 1 if (sampling.temperature, sampling.top_p) == decoding(1) else 2
        self.caps.append((attempt, sampling.max_tokens))
        if len(self.caps) > self.loops:
            return self.inner.submit(prepared, sampling)
        future: Future = Future()
        future.set_result(Completion(Answer('{"language": "en", "lines": ["a a a', "repetition", 0, 50,
                                            self.looped_tokens), 0.1))
        return future

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def feed_config(**changes: object):
    from tests.support.feed_setup import config

    return config(max_tokens=1000, **changes)


def test_a_page_that_loops_twice_ends_repetition_after_one_retry_at_half_the_cap() -> None:
    from tests.support.feed_setup import tasks
    from tests.support.feeding import extract_all
    from transforms.engines.simulated import PAGE_TEXT

    cfg = feed_config(max_attempts=3)
    engine = LoopingEngine(loops=5, text=PAGE_TEXT)
    (r,) = extract_all(engine, tasks(1, cfg), cfg)
    assert (r.status, r.reason_code, r.stop_reason, r.attempts) == ("invalid", "repetition", "repetition", 2)
    assert engine.caps == [(1, 1000), (2, 500)]  # greedy at the cap, then sampled at half of it; no third try
    # The ledger bills both attempts, each stopped by the guard below the cap.
    assert r.output_tokens == 2 * (40 + 5 + SPAN) and 40 + 5 + SPAN < 500
    assert "repeated a pattern" in (r.message or "")


def test_a_retry_after_a_loop_that_answers_is_the_page_s_answer() -> None:
    from tests.support.feed_setup import tasks
    from tests.support.feeding import extract_all
    from transforms.engines.simulated import PAGE_TEXT

    cfg = feed_config()
    engine = LoopingEngine(loops=1, text=PAGE_TEXT)
    (r,) = extract_all(engine, tasks(1, cfg), cfg)
    assert (r.status, r.stop_reason, r.attempts) == ("ok", "stop", 2)
    assert engine.caps == [(1, 1000), (2, 500)]


def test_a_markdown_page_that_loops_keeps_its_text_with_a_flag() -> None:
    from tests.support.feed_setup import tasks
    from tests.support.feeding import extract_all
    from transforms.model.markdown import load_output

    schema, markdown = load_output("markdown")
    cfg = feed_config(schema=schema, markdown=markdown)
    engine = LoopingEngine(loops=2, text="unused")
    (r,) = extract_all(engine, tasks(1, cfg), cfg)
    assert (r.status, r.flags, r.stop_reason, r.attempts) == ("ok", ("repetition",), "repetition", 2)
    assert r.markdown is not None and r.markdown.startswith('{"language"')
