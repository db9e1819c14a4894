"""The killable child process: every item a request yields comes back in order; a request past its deadline
kills the child and a new one serves the next; a child that dies is reported with its exit code."""
from __future__ import annotations

import os
import time
from collections.abc import Iterator

from transforms.child_process import CRASHED, TIMEOUT, ChildWorker


def echo(*args: object) -> Iterator[object]:
    """Work (runs in the child): each argument back, one reply each."""
    yield from args


def sleeps(seconds: float) -> Iterator[float]:
    time.sleep(seconds)
    yield seconds


def exits(code: int) -> Iterator[int]:
    os._exit(code)
    yield code


def test_ask_returns_every_item_in_order_and_reuses_the_child() -> None:
    worker = ChildWorker(echo)
    try:
        assert worker.ask((1, "two", b"3" * 200_000), 30) == ([1, "two", b"3" * 200_000], None, "")
        assert worker.ask((), 30) == ([], None, "")
        assert worker.started == 1
    finally:
        worker.stop()


def test_a_request_past_its_deadline_kills_the_child_and_the_next_is_served() -> None:
    worker = ChildWorker(sleeps)
    try:
        replies, stopped, detail = worker.ask((3600,), 1)
        assert (replies, stopped) == ([], TIMEOUT) and "1 s" in detail
        assert worker.ask((0,), 30) == ([0], None, "")
        assert worker.started == 2
    finally:
        worker.stop()


def test_a_child_that_dies_is_reported_and_replaced() -> None:
    worker = ChildWorker(exits)
    try:
        replies, stopped, detail = worker.ask((7,), 30)
        assert (replies, stopped) == ([], CRASHED) and "exit code 7" in detail, detail
        assert worker.proc is None  # forgotten: the next request starts another
    finally:
        worker.stop()
