"""--answer-timeout-s (transforms/extract/deadline.py, the feed's `_expire`): an answer over the limit is aborted in
the engine, its page ends `engine_timeout` with stop reason `deadline`, its slot is freed, and the pages after it
go on. Over the simulated engine, then over the real one slowed by an injected step delay."""
from __future__ import annotations

import threading
import time

import pytest

from tests.support import docmaker
from tests.support.extract_pages import config as vllm_config
from tests.support.extract_pages import pages_of, tasks_for
from tests.support.feed_setup import ENGINE, config, tasks
from tests.support.feeding import extract_all
from tests.support.stuck_engine import Stuck
from transforms.engines.simulated import SimulatedEngine
from transforms.extract.deadline import Deadlines
from transforms.extract.feed import PageFeed


def test_deadlines_fire_in_order_of_their_time_not_of_their_adding() -> None:
    fired: list[str] = []
    done = threading.Event()

    def expire(item: str) -> None:
        fired.append(item)
        if len(fired) == 3:
            done.set()

    deadlines = Deadlines(expire)
    deadlines.add(0.3, "late")
    deadlines.add(0.0, "now")
    deadlines.add(0.1, "soon")
    assert done.wait(10)
    assert fired == ["now", "soon", "late"]


def test_an_answer_over_the_limit_is_aborted_and_the_run_goes_on() -> None:
    cfg = config(answer_timeout_s=0.5, max_attempts=2)
    engine = Stuck(stuck=1, slots=4, seconds=0.01)
    first, *rest = extract_all(engine, tasks(5, cfg), cfg, max_in_flight=2)
    assert (first.status, first.reason_code, first.stop_reason, first.attempts) == \
        ("failed", "engine_timeout", "deadline", 1)  # a timed-out answer is not retried
    assert "--answer-timeout-s 0.5" in (first.message or "")
    assert engine.aborted == 1 and engine.held[0].done()  # the engine was told to stop it
    assert [r.status for r in rest] == ["ok"] * 4 and {r.stop_reason for r in rest} == {"stop"}


def test_a_timed_out_page_frees_its_slot() -> None:
    cfg = config(answer_timeout_s=0.3)
    engine = Stuck(stuck=2, slots=4, seconds=0.01)
    feed = PageFeed(engine, cfg, max_in_flight=2)
    futures = []
    for task in tasks(2, cfg):  # both slots held by answers that never come
        assert feed.slots.acquire(timeout=1)
        futures.append(__import__("concurrent.futures").futures.Future())
        feed.start(task, futures[-1])
    assert not feed.slots.acquire(blocking=False)
    assert feed.slots.acquire(timeout=20)  # freed by the deadline, not by an answer
    assert futures[0].result(timeout=20).reason_code == "engine_timeout"


def test_without_a_limit_a_slow_answer_is_waited_for() -> None:
    cfg = config()  # answer_timeout_s 0: none
    engine = SimulatedEngine(slots=1, seconds=0.6)
    (r,) = extract_all(engine, tasks(1, cfg), cfg)
    assert (r.status, r.stop_reason, engine.aborted) == ("ok", "stop", 0)
    assert ENGINE.max_num_seqs == 4  # the feed tests' engine settings, unchanged


@pytest.mark.vllm
def test_a_slowed_vllm_engine_aborts_the_answer_and_frees_its_sequence(engine, engine_settings, monkeypatch) -> None:
    real_step = engine._step
    slow = threading.Event()
    slow.set()

    def slowed(core):  # the injected fault: every step takes 0.5 s while `slow` is set
        if slow.is_set():
            time.sleep(0.5)
        return real_step(core)

    monkeypatch.setattr(engine, "_step", slowed)
    cfg = vllm_config(answer_timeout_s=1.0, max_tokens=384)
    page = pages_of(docmaker.invoice_pdf(), "inv.pdf")
    (r,) = extract_all(engine, tasks_for(page, engine_settings, cfg), cfg)
    assert (r.status, r.reason_code, r.stop_reason) == ("failed", "engine_timeout", "deadline")
    core = engine.llm.llm_engine
    deadline = time.monotonic() + 10
    while core.has_unfinished_requests() and time.monotonic() < deadline:
        time.sleep(0.1)  # the loop aborts the request at its next turn (one slowed step)
    # Aborted in vLLM: still slowed, the answer (~150 tokens at 0.5 s a step) would have run for over a minute.
    assert not core.has_unfinished_requests()
    slow.clear()
    ok = vllm_config(answer_timeout_s=60.0)
    (after,) = extract_all(engine, tasks_for(page, engine_settings, ok), ok)
    assert (after.status, after.stop_reason) == ("ok", "stop")
