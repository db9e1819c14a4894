"""Which engine a page goes to (transforms/engines/devices/routing.py): least work in flight, in tokens."""
from __future__ import annotations

from transforms.engines.devices.routing import pick, request_work


def test_work_counts_the_prompt_the_image_and_the_answer_cap() -> None:
    # 28 x 28 px is one image token: a 280 x 560 page is 10 x 20 = 200 of them.
    assert request_work(text_tokens=50, width=280, height=560, max_tokens=100) == 50 + 200 + 100
    assert request_work(0, 0, 0, 0) == 1  # never free


def test_the_least_loaded_usable_engine_wins_by_tokens_not_requests() -> None:
    # engine 0 holds one big request, engine 1 three small ones: fewer tokens, though more requests.
    loads = [3000, 3 * 300, 1200]
    assert pick(loads, [0, 1, 2]) == 1
    assert pick(loads, [0, 2]) == 2  # engine 1 is down
    assert pick(loads, []) is None


def test_ties_go_to_the_first_at_or_after_the_start() -> None:
    assert pick([0, 0, 0, 0], [0, 1, 2, 3], start=2) == 2
    assert pick([0, 0, 0, 0], [0, 1, 3], start=2) == 3
    assert pick([5, 0, 0, 5], [0, 1, 2, 3], start=3) == 1  # wraps around
