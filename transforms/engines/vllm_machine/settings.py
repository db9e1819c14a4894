"""VllmMachineSettings: one vLLM engine per machine (`--engine vllm_machine`), a service process in a private
folder that every worker process feeds. Plain data: importing it loads no vLLM."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from transforms.engines.vllm_local.settings import VllmLocalSettings


@dataclass(frozen=True)
class VllmMachineSettings:
    """`vllm`: the engine the service holds (it runs a VllmLocalEngine of these); `service_dir`: the service's
    folder, decided once by the launcher (vllm_machine/folder.py `service_dir`): it holds the run id."""

    vllm: VllmLocalSettings
    service_dir: str

    kind: ClassVar[str] = "vllm_machine"  # what transforms.engines.make builds
