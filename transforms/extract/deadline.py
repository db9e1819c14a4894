"""Deadlines: one thread that calls back once a wall-clock limit has passed (--answer-timeout-s in the feed).

A deadline is never cancelled: the callback sees whether its work finished in time and does nothing then. So
entries live at most one timeout each, and a run holds about as many as it has answers in flight.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class Deadlines:
    """`add(seconds, item)`: `expire(item)` runs on this object's thread `seconds` from now (monotonic clock)."""

    def __init__(self, expire: Callable[[Any], None], clock: Callable[[], float] = time.monotonic) -> None:
        self.expire = expire
        self.clock = clock
        self._heap: list[tuple[float, int, Any]] = []
        self._ids = itertools.count()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, seconds: float, item: Any) -> None:
        with self._cv:
            heapq.heappush(self._heap, (self.clock() + seconds, next(self._ids), item))
            if self._thread is None:  # started on first use: a run without a limit has no thread
                self._thread = threading.Thread(target=self._run, name="pagemill-deadlines", daemon=True)
                self._thread.start()
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._heap or self._heap[0][0] > self.clock():
                    self._cv.wait(None if not self._heap else max(0.0, self._heap[0][0] - self.clock()))
                _, _, item = heapq.heappop(self._heap)
            try:
                self.expire(item)
            except Exception:  # the thread must outlive one bad callback
                log.exception("deadline callback failed")
