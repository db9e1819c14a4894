"""How many local worker processes a run on the DirectRunner uses: the cores this process may use, the
Beam flags for `--workers`, and a small run's in-process shortcut."""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.config.options import PagemillOptions

if TYPE_CHECKING:
    from transforms.intake.inspection import IntakeLimits
    from transforms.store.listing_file import Listing


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


# A run this small does not start a worker pool (~5 s of process starts on 2 cores, ~4 CPU s): it runs in process.
# Pages count too: one core renders, gates and hints ~30 born-digital pages a second (benchmarks/README.md), so past
# ~128 pages (4 s of one core, what the pool's start costs) the other cores gain more than the pool costs.
SMALL_RUN_OBJECTS, SMALL_RUN_BYTES, SMALL_RUN_PAGES = 32, 2 * 2**20, 128
COUNT_TIMEOUT_S = 10.0  # the launcher's page count of one small listing's objects; past it, not small


def small_run(objects: int, total_bytes: int, pages: int | None) -> bool:
    """Pure: few objects, few bytes and few pages. `pages` None: not counted (the count failed or ran out of
    time), which is not small: a needless pool costs seconds, one core for a 400-page PDF leaves the others idle."""
    return (objects <= SMALL_RUN_OBJECTS and total_bytes <= SMALL_RUN_BYTES and pages is not None
            and pages <= SMALL_RUN_PAGES)


def listed_pages(uris: Sequence[str], read: Callable[[str], bytes], limits: IntakeLimits,
                 timeout_s: float = COUNT_TIMEOUT_S) -> int | None:
    """The pages of a few listed objects, counted from their page trees and image headers (no pixel decoded) in
    one intake child (transforms/intake/timed.py's: untrusted bytes are opened under a deadline, never in the
    launcher); None when any object cannot be read or counted within `timeout_s` in all. An object intake will
    reject (an unknown format, an encrypted PDF, more pages than --max-pages) counts no pages."""
    from functools import partial

    from schemas.records import ListedObject
    from transforms.intake.formats import IMAGE_FORMATS, PAGED_IMAGE_FORMATS, sniff_format
    from transforms.intake.inspection import counted_in_child, header_page_count
    from transforms.intake.timed import IntakeWorker

    deadline = time.monotonic() + timeout_s
    worker = IntakeWorker(partial(counted_in_child, count=header_page_count))
    pages = 0
    try:
        for uri in uris:
            data = read(uri)
            fmt = sniff_format(data[:1024])
            left = deadline - time.monotonic()
            if fmt is None or not data:
                continue
            if fmt in IMAGE_FORMATS and fmt not in PAGED_IMAGE_FORMATS:  # one page: no child needed to say so
                pages += 1
                continue
            if left <= 0:
                return None
            replies, stopped, _ = worker.ask((ListedObject(uri, len(data)), data, fmt, "", limits), left)
            if stopped is not None or len(replies) != 1:
                return None
            count = replies[0]
            pages += count if isinstance(count, int) and count <= limits.max_pages else 0
    except Exception:  # noqa: BLE001 - a read or a child that fails: not known, so not small
        return None
    finally:
        worker.stop()
    return pages


def small_listing(listing: Listing, settings: Any) -> bool:
    """Whether a run's listing is small (`small_run`); its objects are read and their pages counted only when
    their number and bytes are small already. `settings`: the run's (pipelines/run/settings.py: its reader
    and intake limits)."""
    if not small_run(listing.objects, listing.bytes, 0):
        return False
    from transforms.intake.reading import ObjectReader
    from transforms.store.listing_file import wave_rows

    reader = ObjectReader(settings.read)
    try:
        uris = [row["uri"] for wave in range(listing.waves)
                for row in wave_rows(listing.wave_file(wave), listing.digests[wave] if listing.digests else None)]
    except Exception:  # noqa: BLE001 - a listing that changed fails its wave later, with its own message
        return False
    pages = listed_pages(uris, lambda uri: reader.read(uri, settings.intake.max_bytes), settings.intake)
    return small_run(listing.objects, listing.bytes, pages)


def decides_workers(options: PipelineOptions) -> bool:
    """Whether the run chooses its local workers (`--workers 0`, or Beam's own "all cores")."""
    from apache_beam.options.pipeline_options import DirectOptions

    direct = options.view_as(DirectOptions)
    return direct.direct_running_mode == "multi_processing" and direct.direct_num_workers == 0


def resolve_local_workers(options: PipelineOptions, cores: int, small: bool) -> None:
    """`--direct_num_workers=0` (`--workers 0`, or Beam's own "all cores"): a small run in this process,
    else one worker process a usable core. Any other choice is left as given."""
    from apache_beam.options.pipeline_options import DirectOptions

    direct = options.view_as(DirectOptions)
    if not decides_workers(options):
        return
    if small or cores <= 1:
        direct.direct_running_mode, direct.direct_num_workers = "in_memory", 1
    else:
        direct.direct_num_workers = cores
