"""What vLLM is given for a VllmLocalSettings: the process environment it reads, vllm.LLM's arguments, the
sampling parameters, how many sequences it runs, and which of its exceptions refuse one request. Pure where it can
be (tested without an engine); vLLM itself is imported only inside the functions that need it."""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transforms.engines.base import Sampling
from transforms.engines.vllm_local.settings import VllmLocalSettings

CPU_MAX_NUM_SEQS = 16
ONEDNN_CACHE_CAPACITY = 64


def is_cpu_platform() -> bool:
    from vllm.platforms import current_platform

    return current_platform.device_type == "cpu"


def engine_environment(s: VllmLocalSettings, cpu: bool, environ: Mapping[str, str]) -> dict[str, str]:
    """Pure: the variables an engine with settings `s` needs that `environ` does not hold yet. vLLM, the hub
    client and oneDNN read them only from the process environment, so the process that will hold the
    engine sets them once, before the engine exists (prepare_environment), never while one runs:
    - VLLM_ENABLE_V1_MULTIPROCESSING: the engine in this process (--engine-in-process; by default on a
      CPU) or in vLLM's engine process; always the option's value;
    - HF_HUB_OFFLINE=1 for a local model folder: nothing may reach for a hub (unless the caller set it);
    - ONEDNN_PRIMITIVE_CACHE_CAPACITY on a CPU: oneDNN keeps up to 1,024 compiled kernels, one per new
      prompt length, so that cache grew with the run (unless the caller set it;
      transforms/engines/vllm_shared/heap.py)."""
    in_process = cpu if s.in_process is None else s.in_process
    wanted = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0" if in_process else "1"}
    defaults = {}
    if Path(s.model).exists():
        defaults["HF_HUB_OFFLINE"] = "1"
    if cpu:
        defaults["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = str(ONEDNN_CACHE_CAPACITY)
    wanted.update({k: v for k, v in defaults.items() if k not in environ})
    return {k: v for k, v in wanted.items() if environ.get(k) != v}


def prepare_environment(s: VllmLocalSettings) -> dict[str, str]:
    """Set engine_environment in this process, once, before its engine is made: by VllmLocalEngine's constructor,
    which runs in the extract stage's setup (an engine per worker process) or at the engine service's start
    (one per machine, transforms/engines/vllm_machine/engine.py), before any engine exists.
    Telling a CPU (vllm.platforms) imports neither the hub client nor the engine, so all still take effect.
    Returns what it set."""
    env = engine_environment(s, is_cpu_platform(), os.environ)
    os.environ.update(env)
    return env


def engine_kwargs(s: VllmLocalSettings, cpu: bool) -> dict[str, Any]:
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


def engine_sequences(s: VllmLocalSettings, cpu: bool) -> int:
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
