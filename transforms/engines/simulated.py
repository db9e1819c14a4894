"""`--engine simulated`: a simulated engine of fixed capacity (SimulatedSettings, SimulatedEngine), for benchmarks and
tests of the feed, never a product default.

It models a GPU with continuous batching and no CPU cost: `slots` requests run at once, each for
`seconds` of wall time from when it gets a slot; the rest wait in a queue. Its output is a fixed
text, and its token counts are plausible (image tokens from the page size, like Qwen2-VL).
"""
from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, ClassVar

from transforms.engines.base import Answer, Completion, EngineDead, PageRequest, Prepared, Sampling
from transforms.engines.vllm_shared.templated import Templated
from transforms.model import token_math

PAGE_TEXT = '{"language": "en", "lines": ["simulated"], "tables": []}'


@dataclass(frozen=True)
class SimulatedSettings:
    """`slots` requests at once, `seconds` each; `text` is every request's output (`--engine simulated`)."""

    slots: int = 16
    seconds: float = 0.5
    text: str = PAGE_TEXT

    kind: ClassVar[str] = "simulated"  # what transforms.engines.make builds


class SimTokenizer:
    """About four characters a token, like a real BPE tokenizer on English text."""

    def apply_chat_template(self, messages: list[dict[str, Any]], tokenize: bool = False,
                            add_generation_prompt: bool = True) -> str:
        parts = []
        for m in messages:
            content = m["content"]
            if isinstance(content, list):
                content = " ".join("<image>" if c.get("type") == "image" else str(c.get("text", "")) for c in content)
            parts.append(f"{m['role']}: {content}")
        return "\n".join(parts)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [2] * (len(text) // 4 + 1)


@dataclass
class SimulatedEngine:
    """`slots` requests at once, `seconds` each; `text` is every request's output."""

    slots: int = 16
    seconds: float = 0.5
    text: str = PAGE_TEXT
    starts: int = 1
    submitted: int = 0
    aborted: int = 0
    busy_seconds: float = 0.0
    _queue: deque[tuple[dict[str, Any], Future[Completion]]] = field(default_factory=deque)
    _running: list[tuple[float, int, Future[Completion], Answer]] = field(default_factory=list)
    _cv: threading.Condition = field(default_factory=threading.Condition)
    _ids: Any = field(default_factory=itertools.count)
    _thread: threading.Thread | None = None

    def tokenizer(self) -> SimTokenizer:
        return SimTokenizer()

    def start(self) -> None:
        pass

    def sequences(self) -> int:
        return self.slots

    def prepare(self, request: PageRequest) -> Prepared:
        """The local engine's prompt (templated.py) with a tokenizer of about four characters a token."""
        try:
            tokenizer = self.tokenizer()
        except Exception as err:
            raise EngineDead(f"{type(err).__name__}: {err}") from err
        return Templated(tokenizer).prepare(request)

    def shutdown(self) -> None:
        pass

    def restart(self, seen: int | None = None) -> None:
        with self._cv:
            if seen is None or seen == self.starts:  # as VllmLocalEngine.restart: once per death
                self.starts += 1

    def close(self) -> None:
        pass

    def abort(self, future: Future[Completion]) -> None:
        """As VllmLocalEngine.abort: the request leaves the queue or its slot (freed at once), and its future fails."""
        with self._cv:
            queued = [item for item in self._queue if item[1] is future]
            running = [item for item in self._running if item[2] is future]
            for item in queued:
                self._queue.remove(item)
            if running:
                self._running = [item for item in self._running if item[2] is not future]
                heapq.heapify(self._running)
            self.aborted += len(queued) + len(running)
            self._cv.notify()
        if (queued or running) and not future.done():
            future.set_exception(RuntimeError("request aborted"))

    def submit(self, prepared: Prepared, sampling: Sampling) -> Future[Completion]:
        request = prepared.request
        img = request["multi_modal_data"]["image"]
        # The prompt's one image placeholder is the image (as vLLM counts: its tokens are the image tokens).
        text_tokens = len(SimTokenizer().encode(request["prompt"])) - 1
        out = Answer(self.text, "stop", token_math.estimate_image_tokens("qwen2_vl", img.width, img.height),
                     text_tokens, max(1, len(self.text) // 4))
        future: Future[Completion] = Future()
        with self._cv:
            self.submitted += 1
            self._queue.append(({"out": out}, future))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="simulated-engine", daemon=True)
                self._thread.start()
            self._cv.notify()
        return future

    def _run(self) -> None:
        while True:
            with self._cv:
                now = time.perf_counter()
                while self._queue and len(self._running) < self.slots:
                    item, future = self._queue.popleft()
                    heapq.heappush(self._running, (now + self.seconds, next(self._ids), future, item["out"]))
                if not self._running:
                    self._cv.wait()
                    continue
                wait = self._running[0][0] - now
                if wait > 0:
                    self._cv.wait(wait)
                    continue
                _, _, future, out = heapq.heappop(self._running)
                self.busy_seconds += self.seconds
            # One slot's full time is this request's share: a GPU's time at `slots` sequences at once.
            future.set_result(Completion(out, self.seconds / self.slots))


def simulated(settings: object, slots: int = 16, seconds: float = 0.5, text: str = PAGE_TEXT) -> SimulatedEngine:
    """An engine factory (functools.partial it) in place of transforms.engines.make: the pipeline calls it with its
    engine settings, which it ignores. `make(SimulatedSettings(...))` builds the same engine from settings."""
    return SimulatedEngine(slots=slots, seconds=seconds, text=text)
