"""VllmMachineSettings: one vLLM engine per machine (`--engine vllm_machine`), a service process in a private
folder that every worker process feeds. Plain data: importing it loads no vLLM."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from transforms.engines.simulated import SimulatedSettings
from transforms.engines.vllm_local.settings import VllmLocalSettings


@dataclass(frozen=True)
class VllmMachineSettings:
    """`vllm`: the engine the service holds (it runs a VllmLocalEngine of these); `service_dir`: the service's
    folder, decided once by the launcher (vllm_machine/folder.py `service_dir`): it holds the run id."""

    vllm: VllmLocalSettings
    service_dir: str
    # --devices: one engine per device (transforms/engines/devices/plan.py), planned on the machine that runs
    # them; each engine's service is a `device-<i>` folder in service_dir, made with `device` (its label) and
    # `device_env` (what pins its process) set. A plan of one engine: in service_dir itself.
    devices: str = "all"
    device: str = ""
    device_env: tuple[tuple[str, str], ...] = ()
    # The run's log file (pipelines/run/run_log.py), set by the launcher: the services' stdout and stderr go there
    # when this machine has its folder (engine.py log_path), else to service.log in their private folder.
    log_file: str = ""
    # Benchmarks: the services run this simulated engine (no model, no tokenizer) instead of vLLM.
    simulated: SimulatedSettings | None = None

    kind: ClassVar[str] = "vllm_machine"  # what transforms.engines.make builds
