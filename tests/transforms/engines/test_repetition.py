"""The repetition guard (transforms/engines/repetition.py) on constructed token streams: a loop of a short
pattern is stopped exactly at the documented threshold, and streams that are not loops are never stopped."""
from __future__ import annotations

import random

import pytest

from transforms.engines.repetition import MAX_PERIOD, SPAN, RepetitionGuard, retry_cap


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
