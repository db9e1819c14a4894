"""DevicePool (transforms/engines/devices/pool.py): one engine per device behind one PageEngine: least work in
flight, a dead engine's pages moved to the others once, the device restarted in the background, a device that
cannot start left out."""
from __future__ import annotations

import logging
import threading
from concurrent.futures import Future

import pytest

from tests.support.machine_stubs import wait_until
from transforms.engines.base import Answer, Completion, EngineDead, Prepared, RequestRejected, Sampling
from transforms.engines.devices.pool import DevicePool
from transforms.engines.devices.routing import request_work

SAMPLING = Sampling(0.0, 1.0, 100)


class Manual:
    """An engine whose requests wait for the test (`answer`, `fail`); its restarts count a start unless
    `cannot_start`."""

    def __init__(self) -> None:
        self.starts = 1
        self.pending: list[tuple[Prepared, Future[Completion]]] = []
        self.aborted: list[Future[Completion]] = []
        self.restarts: list[int | None] = []
        self.cannot_start = False
        self.restarted = threading.Event()

    def start(self) -> None:
        if self.cannot_start:
            raise EngineDead("out of memory")

    def sequences(self) -> int:
        return 4

    def prepare(self, request: object) -> Prepared:
        raise NotImplementedError

    def submit(self, prepared: Prepared, sampling: Sampling) -> Future[Completion]:
        future: Future[Completion] = Future()
        self.pending.append((prepared, future))
        return future

    def abort(self, future: Future[Completion]) -> None:
        self.aborted.append(future)
        future.set_exception(RuntimeError("request aborted"))

    def restart(self, seen: int | None = None) -> None:
        self.restarts.append(seen)
        if not self.cannot_start and seen == self.starts:
            self.starts += 1
        self.restarted.set()

    def shutdown(self) -> None:
        pass

    def answer(self, i: int = 0, text: str = "ok") -> None:
        _, future = self.pending.pop(i)
        future.set_result(Completion(Answer(text, "stop", 1, 1, 1), 0.5))

    def fail(self, err: BaseException, i: int = 0) -> None:
        self.pending.pop(i)[1].set_exception(err)


def page(text_tokens: int) -> Prepared:
    return Prepared({"prompt": "p"}, text_tokens, 28, 28)


def pool_of(n: int) -> tuple[DevicePool, list[Manual]]:
    engines = [Manual() for _ in range(n)]
    return DevicePool(engines, [f"gpu{i}" for i in range(n)], start=0), engines


def test_each_page_goes_to_the_engine_with_the_fewest_tokens_in_flight() -> None:
    pool, (a, b) = pool_of(2)
    pool.submit(page(3000), SAMPLING)  # a tie: the first engine
    pool.submit(page(100), SAMPLING)
    pool.submit(page(100), SAMPLING)  # b holds two small pages, still fewer tokens than a's one
    assert [len(a.pending), len(b.pending)] == [1, 2]
    a.answer()  # a is empty again: the next page is a's
    pool.submit(page(100), SAMPLING)
    assert [len(a.pending), len(b.pending)] == [1, 2]
    assert request_work(3000, 28, 28, 100) > 2 * request_work(100, 28, 28, 100)  # why b took two
    assert pool.sequences() == 8 and pool.starts == 2


def test_an_answer_and_a_rejection_pass_through_and_move_nothing() -> None:
    pool, (a, b) = pool_of(2)
    done, refused = pool.submit(page(10), SAMPLING), pool.submit(page(10), SAMPLING)
    a.answer(text="the answer")
    b.fail(RequestRejected("bad image"))
    assert done.result().output.text == "the answer"
    assert isinstance(refused.exception(), RequestRejected)
    assert a.restarts == b.restarts == [] and pool.usable() == [0, 1]


def test_a_dead_engines_pages_go_to_the_other_once_and_it_is_restarted(caplog: pytest.LogCaptureFixture) -> None:
    pool, (a, b) = pool_of(2)
    first, second = pool.submit(page(10), SAMPLING), pool.submit(page(10), SAMPLING)
    assert [len(a.pending), len(b.pending)] == [1, 1]
    with caplog.at_level(logging.WARNING):
        a.fail(EngineDead("engine service connection lost"))
        assert a.restarted.wait(30) and a.restarts == [1]  # restarted from the start it died in
    assert not first.done() and len(b.pending) == 2  # moved to b, not failed
    b.answer(1)
    assert first.result().output.text == "ok" and not second.done()
    assert wait_until(lambda: pool.usable() == [0, 1])  # back in the rotation once it started again
    assert any("device gpu0 died" in r.getMessage() for r in caplog.records)


def test_a_page_whose_second_engine_dies_too_fails_to_the_feeds_rules() -> None:
    pool, (a, b) = pool_of(2)
    moved = pool.submit(page(10), SAMPLING)
    a.cannot_start = True  # a stays out after its death
    a.fail(EngineDead("died"))
    assert len(b.pending) == 1
    b.fail(EngineDead("died too"))
    assert isinstance(moved.exception(), EngineDead)  # moved once only: the feed restarts and resubmits


def test_a_device_that_cannot_start_is_one_line_and_the_others_carry_on(caplog: pytest.LogCaptureFixture) -> None:
    pool, (a, b, c) = pool_of(3)
    b.cannot_start = True
    with caplog.at_level(logging.ERROR):
        pool.start()
    assert pool.usable() == [0, 2]
    lines = [r.getMessage() for r in caplog.records if "could not start" in r.getMessage()]
    assert len(lines) == 1 and "gpu1" in lines[0] and "out of memory" in lines[0]
    for _ in range(4):
        pool.submit(page(10), SAMPLING)
    assert [len(a.pending), len(b.pending), len(c.pending)] == [2, 0, 2]


def test_a_restart_that_does_not_start_the_engine_leaves_it_out() -> None:
    pool, (a, b) = pool_of(2)
    pool.submit(page(10), SAMPLING)
    a.cannot_start = True
    a.fail(EngineDead("died"))
    assert a.restarted.wait(30)
    assert wait_until(lambda: len(b.pending) == 1)
    b.answer()
    assert pool.usable() == [1]  # its start count did not move: still out
    pool.submit(page(10), SAMPLING)
    assert len(a.pending) == 0 and len(b.pending) == 1


def test_with_no_device_up_a_request_fails_engine_dead_and_start_says_why() -> None:
    pool, engines = pool_of(2)
    for e in engines:
        e.cannot_start = True
    with pytest.raises(EngineDead, match="no device could start: gpu0: out of memory; gpu1: out of memory"):
        pool.start()
    assert isinstance(pool.submit(page(10), SAMPLING).exception(), EngineDead)
    pool.restart(pool.starts)  # the feed's restart tries each device once more, in its thread
    assert [e.restarts for e in engines] == [[1], [1]]


def test_an_aborted_page_frees_its_engines_request_and_its_share_of_the_load() -> None:
    pool, (a, b) = pool_of(2)
    held = pool.submit(page(5000), SAMPLING)
    pool.abort(held)
    assert isinstance(held.exception(), RuntimeError) and a.aborted == [a.pending[0][1]]
    pool.submit(page(10), SAMPLING)  # a's load is back to 0: the tie goes to a again
    assert len(a.pending) == 2 and len(b.pending) == 0
    assert a.restarts == []  # an abort is not a death


def test_the_restart_names_the_start_the_engine_died_in_as_known_at_its_death() -> None:
    pool, (a, _) = pool_of(2)
    a.starts = 0  # sent before the engine's first answer: the worker knew of no start yet
    pool.submit(page(10), SAMPLING)
    a.starts = 1  # another page's answer said the engine runs its first start
    a.fail(EngineDead("died"))
    assert a.restarted.wait(30) and a.restarts == [1]  # so a new service starts its engine now
    assert wait_until(lambda: a.starts == 2 and pool.usable() == [0, 1])


def test_an_engine_that_stops_answering_is_taken_as_dead_and_its_pages_moved() -> None:
    now = [0.0]
    engines = [Manual(), Manual()]
    pool = DevicePool(engines, ["gpu0", "gpu1"], start=0, stall_s=10.0, clock=lambda: now[0])
    a, b = engines
    pool.submit(page(10), SAMPLING)
    pool.submit(page(10), SAMPLING)  # one each; b never answers: it is still loading its model, not watched
    now[0] = 1.0
    a.answer()
    stuck = pool.submit(page(10), SAMPLING)  # a again (the least work); a's silence counts from t=1
    now[0] = 5.0
    assert pool.check() == []
    now[0] = 11.5
    assert pool.check() == [0]
    assert a.aborted and not stuck.done() and len(b.pending) == 2  # aborted on a, moved to b
    assert a.restarted.wait(30) and a.restarts == [1]
    assert pool.check() == []  # already out: taken once


def test_an_engine_idle_for_long_is_not_hung_when_it_gets_work() -> None:
    now = [0.0]
    engines = [Manual(), Manual()]
    pool = DevicePool(engines, ["gpu0", "gpu1"], start=0, stall_s=10.0, clock=lambda: now[0])
    pool.submit(page(10), SAMPLING)
    engines[0].answer()  # it answered at t=0, then nothing to do for 100 s
    now[0] = 100.0
    pool.submit(page(10), SAMPLING)
    now[0] = 105.0
    assert pool.check() == [] and engines[0].restarts == []
