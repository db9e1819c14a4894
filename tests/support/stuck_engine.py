"""A simulated engine whose first requests never finish: Stuck.
Moved from tests/transforms/extract/test_deadline.py, which other test files imported."""
from __future__ import annotations

from transforms.engines.simulated import SimulatedEngine


class Stuck(SimulatedEngine):
    """A simulated engine whose first `stuck` requests never finish (a loop, a hung GPU): until aborted."""

    def __init__(self, stuck: int, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.stuck = stuck
        self.held: list = []

    def submit(self, prepared, sampling):
        if len(self.held) < self.stuck:
            from concurrent.futures import Future

            future: Future = Future()
            self.held.append(future)
            return future
        return super().submit(prepared, sampling)

    def abort(self, future) -> None:
        if future in self.held and not future.done():
            self.aborted += 1
            future.set_exception(RuntimeError("request aborted"))
            return
        super().abort(future)
