"""DevicePool: the engine a worker process feeds when its machine runs one engine per device (`--devices`): the
PageEngine contract (transforms/engines/base.py) over one engine per device, each a client of that device's
engine service (transforms/engines/vllm_machine/), which every worker process of the machine feeds.

- A page goes to the usable engine with the least work in flight, in tokens (routing.py).
- An engine that dies (EngineDead, or any failure that is not one of the contract's request failures): its
  pages in flight go to the others, once each (a page that fails again takes the feed's usual rules: one
  restart and resubmission, then attempts); the device leaves the rotation and is restarted in the background,
  and comes back once its engine runs again. The run goes on with the others meanwhile.
- An engine that stops answering (it has answered since its start, has pages in flight, and gave no answer for
  `stall_s`) is taken as dead the same way: its requests are aborted there and moved. Before its first answer an
  engine is loading its model (minutes for a large one): it is not watched.
- A device whose engine cannot start (out of memory, busy: its restart leaves its start count unchanged) is one
  clear line and stays out; with no device left, a request fails EngineDead (the feed fails the page
  `engine_error`; a run whose every page fails so exits 3).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from functools import partial

from transforms.engines.base import (
    Completion,
    EngineDead,
    PageEngine,
    PageRequest,
    Prepared,
    RequestFailed,
    RequestRejected,
    Sampling,
)
from transforms.engines.devices.routing import pick, request_work

log = logging.getLogger(__name__)
STALL_S = 600.0  # no answer for this long, with pages in flight, from an engine that answered before: hung


class DevicePool:
    """One engine per device behind the one PageEngine a worker's feed uses; `labels[i]` names engine i."""

    def __init__(self, engines: Sequence[PageEngine], labels: Sequence[str], start: int | None = None,
                 stall_s: float = STALL_S, clock: Callable[[], float] = time.monotonic) -> None:
        if not engines or len(engines) != len(labels):
            raise ValueError("DevicePool needs one label per engine, and at least one engine")
        self.engines, self.labels = list(engines), list(labels)
        self._lock = threading.Lock()
        self._loads = [0] * len(engines)  # tokens in flight per engine (routing.request_work)
        self._down: set[int] = set()  # out of the rotation: restarting, or could not start
        self._revive_locks = [threading.Lock() for _ in engines]
        self._sent: dict[Future[Completion], tuple[int, Future[Completion]]] = {}  # outer -> (engine, inner)
        self._start = os.getpid() % len(engines) if start is None else start
        self._started = threading.Lock()  # held by the first prepare while every engine starts at once
        self._up = False
        self.stall_s, self.clock = stall_s, clock
        # When each engine last answered, or last got work after an idle spell (None: not since its start).
        self._last: list[float | None] = [None] * len(engines)
        self._watch: threading.Thread | None = None

    @property
    def starts(self) -> int:  # type: ignore[override]
        """Every engine's starts together: the feed's `restart(seen)` is a no-op once any engine started since."""
        return sum(e.starts for e in self.engines)

    def usable(self) -> list[int]:
        with self._lock:
            return [i for i in range(len(self.engines)) if i not in self._down]

    def start(self) -> None:
        """Start (connect to) every engine at once; one that cannot is one line and stays out. EngineDead when
        none can."""
        errors: dict[int, BaseException] = {}

        def one(i: int) -> None:
            try:
                self.engines[i].start()
            except Exception as err:  # noqa: BLE001 - this device only
                errors[i] = err

        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(self.engines))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i, err in sorted(errors.items()):
            with self._lock:
                self._down.add(i)
            log.error("pagemill: device %s could not start (%s): the run goes on with the other devices",
                      self.labels[i], err)
        if len(errors) == len(self.engines):
            raise EngineDead("no device could start: " + "; ".join(f"{self.labels[i]}: {e}"
                                                                   for i, e in sorted(errors.items())))

    def sequences(self) -> int:
        return sum(max(1, e.sequences()) for e in self.engines)

    def prepare(self, request: PageRequest) -> Prepared:
        """The first engine's request: every engine of a pool runs the same model, so the prompt is the same. The
        first call starts every engine at once (`start`), not one by one as pages first reach them."""
        if not self._up:
            with self._started:
                if not self._up:
                    self.start()  # EngineDead when no device can: the page fails saying why
                    self._up = True
        return self.engines[0].prepare(request)

    def submit(self, prepared: Prepared, sampling: Sampling) -> Future[Completion]:
        outer: Future[Completion] = Future()
        self._send(outer, prepared, sampling, frozenset(), moved=False)
        return outer

    def _send(self, outer: Future[Completion], prepared: Prepared, sampling: Sampling, exclude: frozenset[int],
              moved: bool) -> None:
        work = request_work(prepared.text_tokens, prepared.width, prepared.height, sampling.max_tokens)
        with self._lock:
            usable = [i for i in range(len(self.engines)) if i not in self._down and i not in exclude]
            chosen = pick(self._loads, usable, self._start)
            if chosen is not None:
                if self._loads[chosen] == 0 and self._last[chosen] is not None:
                    self._last[chosen] = self.clock()  # idle until now: its silence counts from here
                self._loads[chosen] += work
            if self._watch is None and self.stall_s > 0:
                self._watch = threading.Thread(target=self._watchdog, name="pagemill-stall-watch", daemon=True)
                self._watch.start()
        if chosen is None:
            outer.set_exception(EngineDead("no device's engine is up (" + ", ".join(self.labels) + ")"))
            return
        engine = self.engines[chosen]
        seen = engine.starts
        try:
            inner = engine.submit(prepared, sampling)
        except Exception as err:  # noqa: BLE001 - as a dead engine's failure: handled below
            inner = Future()
            inner.set_exception(err)
        with self._lock:
            self._sent[outer] = (chosen, inner)
        inner.add_done_callback(partial(self._done, outer, chosen, seen, work, prepared, sampling, exclude, moved))

    def _done(self, outer: Future[Completion], chosen: int, seen: int, work: int, prepared: Prepared,
              sampling: Sampling, exclude: frozenset[int], moved: bool, inner: Future[Completion]) -> None:
        with self._lock:
            self._loads[chosen] -= work
            if self._sent.get(outer, (None, None))[1] is inner:
                del self._sent[outer]
        if outer.done():
            return  # aborted by the feed (its answer timeout): nothing more to do
        err = inner.exception()
        if err is None or isinstance(err, RequestRejected | RequestFailed):  # it answered: it is alive
            with self._lock:
                if chosen not in self._down:
                    self._last[chosen] = self.clock()
        if err is None:
            outer.set_result(inner.result())
            return
        if isinstance(err, RequestRejected | RequestFailed):
            outer.set_exception(err)  # this request's own failure: the engine is fine
            return
        self._died(chosen, seen, err)
        if not moved and self.usable():
            self._send(outer, prepared, sampling, exclude | {chosen}, moved=True)  # once, to another device
            return
        outer.set_exception(err)

    def _died(self, i: int, seen: int, err: BaseException) -> None:
        with self._lock:
            if i in self._down:
                return
            self._down.add(i)
            self._last[i] = None
        self._dead(i, seen, err)

    def _dead(self, i: int, seen: int, err: BaseException) -> None:
        """Engine i is out of the rotation now: one line, and its restart in the background."""
        log.warning("pagemill: the engine on device %s died (%s: %s): its pages go to the other devices while it "
                    "restarts", self.labels[i], type(err).__name__, err)
        threading.Thread(target=self._revive, args=(i, seen), name=f"pagemill-revive-{i}", daemon=True).start()

    def _revive(self, i: int, seen: int) -> bool:
        """Restart engine i; back in the rotation when it started again, else one line and it stays out."""
        with self._revive_locks[i]:
            with self._lock:
                if i not in self._down:
                    return True
            # The start it died in, as this worker knows it now (a request sent before the engine's first answer saw
            # no start yet): a new service of the device is then told to start its engine, not left to start it
            # on the next page while the pool sends it pages.
            seen = max(seen, self.engines[i].starts)
            why = "its start count did not change"
            try:
                self.engines[i].restart(seen)
                ok = self.engines[i].starts != seen
            except Exception as err:  # noqa: BLE001 - this device only
                ok, why = False, f"{type(err).__name__}: {err}"
            if ok:
                with self._lock:
                    self._down.discard(i)
                log.warning("pagemill: the engine on device %s runs again (start %d)", self.labels[i],
                            self.engines[i].starts)
                return True
            log.error("pagemill: device %s could not start (%s): the run goes on with %d other device(s)",
                      self.labels[i], why, len(self.usable()))
            return False

    def check(self) -> list[int]:
        """The engines that stopped answering (see the module's docstring), taken as dead: their requests are
        aborted there (and so moved to the others) and they are restarted. Their indexes."""
        now = self.clock()
        with self._lock:
            hung = [i for i, last in enumerate(self._last) if last is not None and i not in self._down
                    and self._loads[i] > 0 and now - last > self.stall_s]
            held = {i: [inner for d, inner in self._sent.values() if d == i] for i in hung}
            for i in hung:  # out of the rotation before its requests are aborted: they go to the others
                self._down.add(i)
                self._last[i] = None
        for i in hung:  # its requests moved first, then its restart (which puts it back in the rotation)
            seen = self.engines[i].starts
            for inner in held[i]:
                self.engines[i].abort(inner)
            self._dead(i, seen, EngineDead(f"no answer for {self.stall_s:g} s with pages in flight"))
        return hung

    def _watchdog(self) -> None:
        while True:
            time.sleep(min(30.0, self.stall_s / 4))
            try:
                self.check()
            except Exception as err:  # noqa: BLE001 - the watch must not die: one line, and on
                log.warning("engine stall watch: %s: %s", type(err).__name__, err)

    def abort(self, future: Future[Completion]) -> None:
        """Give up on a request: the page has ended (the feed's answer timeout); its engine frees the sequence."""
        with self._lock:
            sent = self._sent.pop(future, None)
        if not future.done():
            future.set_exception(RuntimeError("request aborted"))
        if sent is not None:
            self.engines[sent[0]].abort(sent[1])

    def restart(self, seen: int | None = None) -> None:
        """The feed's restart after a request failed on every device it tried: each device out of the rotation is
        tried once more (now, in this thread), unless an engine started since `seen`."""
        if seen is not None and seen != self.starts:
            return
        with self._lock:
            down = sorted(self._down)
        for i in down:
            self._revive(i, self.engines[i].starts)

    def shutdown(self) -> None:
        for engine in self.engines:
            try:
                engine.shutdown()
            except Exception as err:  # noqa: BLE001 - best effort at the end of a run
                log.warning("engine shutdown on device %s: %s: %s", self.labels[self.engines.index(engine)],
                            type(err).__name__, err)
