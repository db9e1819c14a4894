"""The repetition guard: stop an answer that has fallen into a loop, before it burns its whole token cap.

Document models loop (the same line, cell or phrase again and again until max_tokens); a loop's tokens are
paid for and thrown away. The threshold, in tokens of the answer:
- a *short pattern* is at most MAX_PERIOD (32) tokens long;
- the answer is looping when each of its last SPAN (128) tokens equals the token one pattern length before
  it: the last SPAN + p tokens are the same p tokens over and over (for p = 32, four times and more; for
  p = 1, one token 129 times).
A guarded request is stopped at the first token where that holds, so it never spends more than SPAN +
MAX_PERIOD tokens inside a loop. SPAN is above the length of any one bounded string field of the shipped
schemas (80 characters), so a model that fills one field with one character does not trip it; a real page
rarely repeats an exact 32-token run four times (empty table rows that do are a loop too).

The guard reads the tokens as they are decoded (`feed`), one integer comparison per pattern length and
token: cheap beside a decode step. The engines that decode here (transforms/engines/vllm_local/engine.py, and
through it the machine's engine service) apply it to every request; the page then ends with stop reason `repetition`,
and the feed retries it once with the next decoding setting and a smaller cap (transforms/extract/feed.py).
"""
from __future__ import annotations

import queue
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from typing import Any, Final

MAX_PERIOD: Final = 32
SPAN: Final = 128


def retry_cap(max_tokens: int) -> int:
    """The output cap of the one retry after a loop: half the looping attempt's. The retry samples (the next
    decoding setting); if it loops again it spends half as much, and an answer that needed the whole cap
    rarely looped on the way."""
    return max(1, max_tokens // 2)


class RepetitionGuard:
    """Fed an answer's tokens in order; `tripped` once the answer's tail is a loop (the module's threshold)."""

    __slots__ = ("max_period", "runs", "span", "tokens", "tripped")

    def __init__(self, max_period: int = MAX_PERIOD, span: int = SPAN) -> None:
        if max_period < 1 or span < 1:
            raise ValueError("max_period and span must be >= 1")
        self.max_period = max_period
        self.span = span
        self.tokens: list[int] = []
        # runs[p - 1]: how many of the latest tokens in a row equal the token p positions before them.
        self.runs = [0] * max_period
        self.tripped = False

    def feed(self, token_ids: Iterable[int]) -> bool:
        """Add decoded tokens; True when the answer is looping (and from then on)."""
        tokens, runs, span = self.tokens, self.runs, self.span
        for token in token_ids:
            tokens.append(token)
            n = len(tokens)
            for p in range(1, min(self.max_period, n - 1) + 1):
                if tokens[n - 1 - p] == token:
                    runs[p - 1] += 1
                    if runs[p - 1] >= span:
                        self.tripped = True
                else:
                    runs[p - 1] = 0
        return self.tripped


class StreamedAnswer:
    """One request in an engine's step loop, its answer assembled from vLLM's DELTA outputs and guarded."""

    __slots__ = ("future", "gpu_seconds", "guard", "guarded", "text")

    def __init__(self, future: Future[Any], guarded: bool = True) -> None:
        self.future = future
        self.guarded = guarded
        self.gpu_seconds = 0.0
        self.guard = RepetitionGuard()
        self.text: list[str] = []

    def add(self, output: Any) -> bool:
        """Take one DELTA RequestOutput; True when the answer is looping (stop it)."""
        completion = output.outputs[0]
        self.text.append(completion.text)
        return self.guard.feed(completion.token_ids) and self.guarded

    def sample(self, finish_reason: str | None) -> tuple[str, tuple[int, ...], str | None]:
        """(text, token ids, finish reason) of the whole answer so far."""
        return "".join(self.text), tuple(self.guard.tokens), finish_reason


def aborted(aborts: queue.SimpleQueue[Future[Any]], in_flight: Mapping[str, StreamedAnswer]) -> list[str]:
    """The ids of the requests in flight whose futures were queued on `aborts` (an engine's `abort`); an abort of
    a request not admitted yet stays queued."""
    wanted: list[Future[Any]] = []
    try:
        while True:
            wanted.append(aborts.get_nowait())
    except queue.Empty:
        pass
    if not wanted:
        return []
    ids = {id(f) for f in wanted}
    found = [rid for rid, a in in_flight.items() if id(a.future) in ids]
    admitted = {id(in_flight[rid].future) for rid in found}
    for future in wanted:  # aborted before the loop admitted it: kept for the turn that does (unless it ended)
        if id(future) not in admitted and not future.done():
            aborts.put(future)
    return found
