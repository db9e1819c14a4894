"""How many local worker processes a run on the DirectRunner uses: the cores this process may use, the
Beam flags for `--workers`, and a small run's in-process shortcut."""
from __future__ import annotations

import os
from collections.abc import Sequence

from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.config.options import PagemillOptions


def usable_cores() -> int:
    """The cores this process may run on (its affinity, e.g. a container's CPU set), not the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


DIRECT_FLAGS = ("--direct_running_mode", "--direct_num_workers")


def local_workers_flags(flags: Sequence[str], cores: int) -> list[str]:
    """Pure: the Beam flags that make a local batch run use `--workers` processes (0: `cores`), one
    engine per machine then serving them all (pipelines/config/engine.py, machine_engine). Nothing when the
    flags choose the runner's mode or workers themselves, name another runner, or stream."""
    from apache_beam.options.pipeline_options import StandardOptions

    if {f.split("=")[0] for f in flags} & set(DIRECT_FLAGS):
        return []
    options = PipelineOptions(list(flags))
    standard = options.view_as(StandardOptions)
    if standard.streaming or (standard.runner or "DirectRunner") not in ("DirectRunner", "direct"):
        return []
    workers = options.view_as(PagemillOptions).workers
    if workers == 1 or (workers == 0 and cores <= 1):
        return []
    # `--workers 0` leaves the count to the run (0: resolve_local_workers), which knows the listing.
    return [f"{DIRECT_FLAGS[0]}=multi_processing", f"{DIRECT_FLAGS[1]}={workers}"]


# A run this small does not start a worker pool (~5 s of process starts on 2 cores): it runs in process.
SMALL_RUN_OBJECTS, SMALL_RUN_BYTES = 32, 2 * 2**20


def small_run(objects: int, total_bytes: int) -> bool:
    """Pure: few objects and few bytes (pages are not known before intake; bytes bound them loosely)."""
    return objects <= SMALL_RUN_OBJECTS and total_bytes <= SMALL_RUN_BYTES


def resolve_local_workers(options: PipelineOptions, cores: int, small: bool) -> None:
    """`--direct_num_workers=0` (`--workers 0`, or Beam's own "all cores"): a small run in this process,
    else one worker process a usable core. Any other choice is left as given."""
    from apache_beam.options.pipeline_options import DirectOptions

    direct = options.view_as(DirectOptions)
    if direct.direct_running_mode != "multi_processing" or direct.direct_num_workers != 0:
        return
    if small or cores <= 1:
        direct.direct_running_mode, direct.direct_num_workers = "in_memory", 1
    else:
        direct.direct_num_workers = cores
