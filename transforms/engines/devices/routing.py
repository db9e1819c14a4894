"""Which engine a page goes to: the one with the least work in flight, counted in tokens, not requests (a page
of 3,000 prompt tokens is not a page of 300). Pure: the pool (pool.py) keeps the counts and asks here."""
from __future__ import annotations

from collections.abc import Collection, Sequence

PATCH_PIXELS = 28 * 28  # a Qwen2-VL image token covers 28x28 px: the image's share of the prompt, near enough


def request_work(text_tokens: int, width: int, height: int, max_tokens: int) -> int:
    """A request's work in tokens: its prompt (text, and the image at about one token per 28x28 px) and the
    answer it may write. At least 1. Pure."""
    return max(1, text_tokens + (max(0, width) * max(0, height)) // PATCH_PIXELS + max(0, max_tokens))


def pick(loads: Sequence[int], usable: Collection[int], start: int = 0) -> int | None:
    """The usable engine with the least work in flight (`loads[i]`: engine i's tokens in flight); ties go to the
    first at or after `start` (each worker process starts elsewhere, so that idle engines fill evenly). None
    when no engine is usable. Pure."""
    if not usable:
        return None
    n = len(loads)
    return min(usable, key=lambda i: (loads[i], (i - start) % n))
