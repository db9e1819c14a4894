"""Engines: what answers a page, behind one contract (base.py), made by `make` from their settings. One room per
backend, one name in the flag, the settings' kind, the class and the room:
- vllm_local/: vLLM in the worker's own process (VllmLocalSettings, VllmLocalEngine);
- vllm_machine/: one vLLM engine per machine, a service process fed by every worker (VllmMachineSettings,
  VllmMachineEngine);
- openai/: an OpenAI-compatible endpoint (OpenAISettings, OpenAIEngine);
- openai_batch/: a hosted batch API, answered from collected batches (OpenAIBatchSettings, OpenAIBatchEngine;
  AnthropicBatchSettings: Anthropic's Message Batches, through the same engine);
- simulated.py: a simulated engine of fixed capacity, for benchmarks (SimulatedSettings, SimulatedEngine);
- vllm_shared/: what both vLLM backends share (chat template and token fit, repetition guard, heap trimming)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:
    from transforms.engines.base import PageEngine
    from transforms.engines.openai.settings import OpenAISettings
    from transforms.engines.openai_batch.settings import OpenAIBatchSettings
    from transforms.engines.simulated import SimulatedSettings
    from transforms.engines.vllm_local.settings import VllmLocalSettings
    from transforms.engines.vllm_machine.settings import VllmMachineSettings

# The one engine choice of a run: a value of one of these (RunSettings.engine).
EngineChoice = Union["VllmLocalSettings", "VllmMachineSettings", "OpenAISettings", "OpenAIBatchSettings",
                     "SimulatedSettings"]


def make(settings: EngineChoice) -> PageEngine:
    """The engine for `settings`, by its `kind`: the only maker of engines. Imports are lazy: importing
    transforms.engines loads neither vLLM nor the HTTP client."""
    kind = settings.kind
    if kind == "vllm_local":
        from transforms.engines.vllm_local.engine import VllmLocalEngine

        if settings.devices not in ("", "1"):  # several devices on this machine: the machine's service, per device
            from transforms.engines.vllm_machine.engine import devices_engine

            several = devices_engine(settings)
            if several is not None:
                return several
        return VllmLocalEngine(settings)
    if kind == "vllm_machine":
        from transforms.engines.vllm_machine.engine import machine_engine

        return machine_engine(settings)
    if kind == "openai":
        from transforms.engines.openai.engine import OpenAIEngine

        return OpenAIEngine(settings)
    if kind in ("openai_batch", "anthropic_batch"):  # one engine; the launcher's driver speaks each provider
        from transforms.engines.openai_batch.engine import OpenAIBatchEngine

        return OpenAIBatchEngine(settings)
    if kind == "simulated":
        from transforms.engines.simulated import SimulatedEngine

        return SimulatedEngine(slots=settings.slots, seconds=settings.seconds, text=settings.text)
    raise ValueError(f"no engine of kind {kind!r}")
