"""VllmLocalSettings: a vLLM engine in this process (`--engine vllm_local`). Plain data: importing it loads no vLLM."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class VllmLocalSettings:
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
    # --devices (transforms/engines/devices/plan.py): where the machine has several devices, the worker processes
    # of a machine feed one engine per device through the machine's engine service (vllm_machine/), in a folder
    # named after `run_key` (the run id) and these settings, never one engine per process on the same GPU.
    devices: str = "1"
    run_key: str = ""

    kind: ClassVar[str] = "vllm_local"  # what transforms.engines.make builds
    # The cache key names it by its former class name, so that earlier runs' keys still match
    # (transforms/model/cache_key.py).
    key_name: ClassVar[str] = "EngineSettings"
