"""Waves: a run's inputs are listed once, by the launcher, into a durable listing under the run
(transforms/store/listing_file.py), then processed in waves of at most `--wave-objects` objects, one bounded
pipeline each, under the same run id.

Why: a batch runner holds every PCollection that crosses a shuffle (the listing's spread, dedup, the joins)
for the whole pipeline; the in-process DirectRunner keeps it in its own memory (~25 KB a listed object). A
wave bounds that to its own objects, puts its first pages on disk within the wave's time instead of after
the whole listing's intake, and bounds what a kill can lose. Dedup stays global: the listing is in URI
order, so the copy a single pipeline would keep (the smallest URI) is in the earliest wave that has one, and
a later wave's copies become `duplicate` rows of it (transforms/intake/dedup.py SkipEarlierWaves). Earlier
runs' results reach every wave through the result cache, as they reach a single pipeline.

Resume: a finished wave has a `.done` marker and is skipped without reading its objects again; the wave that
was cut short skips the documents it already wrote (its own part files, `part-wNNNNN-*`). `--wave-objects 0`:
one pipeline over the whole listing, listed inside the pipeline (a distributed runner that holds its
shuffles on disk may prefer it).

A listing belongs to its run (`bound_listing`): a resume reuses it only when it records this invocation's
`--input` and its wave files are the ones written; otherwise the run stops before it starts (exit 2), and
`--force` or a new run id lists again. Each wave's file is checked again just before its pipeline, and as it
is read.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.run.pool_watch import pool_address, wait_for_job
from schemas.run_place import RunPlace
from transforms.store.listing_file import (
    Listing,
    ListingChanged,
    ReadWave,
    changed_waves,
    clear_listing,
    mark_done,
    read_listing,
    write_listing,
)
from transforms.store.part_names import wave_of  # a part file's wave, from its name

if TYPE_CHECKING:
    from transforms.store.run_tables import RunTables

log = logging.getLogger(__name__)


def wave_files(files: list[str], wave: int) -> tuple[list[str], list[str]]:
    """Pure: (this wave's files and those of no wave: what a resumed wave has done; the earlier waves'
    files and those of no wave: what this wave's dedup checks against)."""
    own = [f for f in files if wave_of(f) in (wave, None)]
    earlier = [f for f in files if (w := wave_of(f)) is None or w < wave]
    return own, earlier


@dataclass
class Waves:
    """What one invocation did with the run's waves (the manifest's `waves`)."""

    total: int = 1
    objects: int | None = None  # listed objects (None: listed inside a single pipeline)
    skipped: list[int] = field(default_factory=list)  # finished before this invocation: not read again
    ran: list[int] = field(default_factory=list)
    seconds: dict[int, float] = field(default_factory=dict)  # wave -> its wall time, pipeline and commit

    def as_dict(self) -> dict[str, Any]:
        return {"total": self.total, "objects": self.objects, "skipped": len(self.skipped),
                "ran": len(self.ran), "first_ran": self.ran[0] if self.ran else None,
                "seconds": {str(w): s for w, s in sorted(self.seconds.items())}}


RELIST = "run with --force to list the inputs again, or choose a new --run-id"


def shown(values: Any) -> str:
    """What a listing records, for a message: it lies where a tenant may write, so made terminal-safe and cut."""
    from transforms.text_safety import terminal_safe

    return terminal_safe(", ".join(str(v) for v in values)[:500]) or "nothing"


def listing_refusal(listing: Listing, inputs: tuple[str, ...], run_id: str) -> str | None:
    """Pure: why an earlier invocation's listing cannot serve this one (None: it can)."""
    if listing.inputs is None:
        return (f"the listing of run {run_id} under {listing.folder} records no --input it was made from (written by "
                f"an older pagemill, or not by pagemill): it is not trusted; {RELIST}")
    if tuple(listing.inputs) != inputs:
        return (f"run {run_id} was listed from --input {shown(listing.inputs)}, but this invocation's --input is "
                f"{shown(inputs)}: resume with the same --input, or {RELIST}")
    return None


def changed_message(listing: Listing, waves: list[int]) -> str:
    files = ", ".join(listing.wave_file(w).rsplit("/", 1)[-1] for w in waves[:5])
    return (f"the listing changed since it was written ({files}{' ...' if len(waves) > 5 else ''} under "
            f"{listing.folder}: not the files it records); {RELIST}")


def bound_listing(o: Any, place: RunPlace | None = None) -> tuple[Listing | None, list[str]]:
    """An earlier invocation's listing of this run, if it may be reused: (it, []); (None, []) when there is
    none to reuse (none written whole, `--force`, `--wave-objects 0`); (None, [why]) when it records other
    inputs, none, or wave files that changed since: the run must not start (exit 2). `place`: the run's
    (default the options' --output, --tenant and --run-id)."""
    from transforms.intake.bounds import normalised_inputs

    if o.wave_objects <= 0 or o.force:
        return None, []
    place = place or RunPlace(o.output, o.tenant, o.run_id)
    listing = read_listing(place.listing_folder())
    if listing is None:
        return None, []
    problem = listing_refusal(listing, normalised_inputs(o.input or ()), place.run_id)
    if problem is None and (changed := changed_waves(listing)):
        problem = changed_message(listing, changed)
    return (None, [problem]) if problem else (listing, [])


def listing_for(o: Any, place: RunPlace, since: float | None, until: float | None,
                found: Listing | None = None) -> Listing | None:
    """The run's durable listing: `found` (`bound_listing`'s, checked), else listed now and written, in a
    folder emptied first (nothing left of an unfinished listing, such as a `.done` marker, may count). None
    with `--wave-objects 0`."""
    if o.wave_objects <= 0:
        return None
    if found is not None:
        return found
    from transforms.intake.bounds import normalised_inputs
    from transforms.intake.listing import list_matching

    folder = place.listing_folder()
    clear_listing(folder)
    return write_listing(folder, list_matching(o.input or (), since, until), o.wave_objects,
                         normalised_inputs(o.input or ()))


def run_waves(options: Any, settings: Any, run: dict[str, Any], listing: Listing | None,
              since: float | None, until: float | None, force: bool,
              on_wave: Callable[[int], None] = lambda wave: None,
              tables: RunTables | None = None) -> tuple[Waves, dict[str, Any]]:
    """Run the pipeline once per unfinished wave (once in all without a listing). Returns what was done
    and the Beam metrics of every pipeline, summed. Raises what the pipeline raised. With the run's `tables`
    (transforms/store/run_tables.py), each wave is done there after its pipeline and before it is marked done
    (with `--catalog`: committed); a wave the catalog already holds (a kill between its commit and its mark) is
    not run again."""
    s, metrics = settings, {}
    done = Waves(total=listing.waves if listing else 1, objects=listing.objects if listing else None)
    committed = tables.committed_waves() if tables is not None and listing is not None else set()
    with EngineHold(s):  # the machine's engine, once a wave started it, waits for the next wave
        for wave in _waves(listing, done, committed):
            on_wave(wave)
            started = time.perf_counter()
            metrics = merge_metrics(metrics, _one_wave(options, s, run, listing, wave, since, until, force))
            if listing is not None:
                if tables is not None:
                    tables.wave_done(wave)
                mark_done(listing.folder, wave)
            done.ran.append(wave)
            done.seconds[wave] = round(time.perf_counter() - started, 3)
    return done, metrics


def _one_wave(options: Any, s: Any, run: dict[str, Any], listing: Listing | None, wave: int,
              since: float | None, until: float | None, force: bool) -> dict[str, Any]:
    """One wave's pipeline (the whole listing's without a listing), run to its end; its metrics."""
    import apache_beam as beam

    from pipelines.run import graph  # looked up at call time: tests put a failing builder there
    from transforms.store.files import run_files, tenant_files
    from transforms.store.part_names import part_prefix

    documents = run_files(s.output, "documents", s.tenant, run["run_id"])
    earlier_files = [] if force else tenant_files(s.output, "pages", s.tenant)  # the result cache's source
    p = beam.Pipeline(options=options)
    if listing is None:
        graph.build_pipeline(p, s, run, earlier_files, documents, since, until)
    else:
        if changed_waves(listing, [wave]):  # rewritten since the run started
            raise ListingChanged(changed_message(listing, [wave]))
        own, earlier = wave_files(documents, wave)
        digest = listing.digests[wave] if wave < len(listing.digests) else None
        graph.build_pipeline(p, s, run, earlier_files, own, listing=ReadWave(listing.wave_file(wave), digest),
                             earlier_kept=earlier, prefix=part_prefix(wave))
    result = p.run()
    wait_for_job(result, pool_address(options))
    return stage_metrics(result)


class EngineHold:
    """The launcher's connection to the machine's engine service for the whole run: the service exits a few
    seconds after its last worker leaves, and a wave's workers leave at its end (their shutdown can outlast
    that on a busy machine) while the next wave's reach the model only after its intake and dedup; without
    it every wave would load the model again. A thread connects once a wave has started the service (a run
    that never needs the model never starts one). Best effort: a failure only costs a reload."""

    def __init__(self, settings: Any) -> None:
        # Only a machine engine's settings name a service folder; an engine in process or an endpoint has none.
        self.folder = getattr(settings.engine, "service_dir", None) if settings.extract is not None else None
        self.settings = settings.engine
        self.engine: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> EngineHold:
        if self.folder:
            self._thread = threading.Thread(target=self._watch, name="pagemill-engine-hold", daemon=True)
            self._thread.start()
        return self

    def _watch(self) -> None:
        from transforms.engines import make
        from transforms.engines.vllm_machine.engine import SOCKET

        while not self._stop.wait(0.5):
            if Path(self.folder or "", SOCKET).exists():
                try:
                    engine = make(self.settings)  # the machine engine's worker side
                    engine.start()  # connect only: no request is ever sent on it
                    self.engine = engine
                except Exception as err:  # noqa: BLE001
                    log.warning("could not hold the engine service between waves: %s", err)
                return

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.engine is not None:
            self.engine.shutdown()


def _waves(listing: Listing | None, done: Waves, committed: Container[int] = ()) -> Iterator[int]:
    """The waves to run (0 alone without a listing); a finished one is recorded as skipped, never read. A wave
    the catalog holds but that was not marked done (killed in between) is finished: marked now."""
    if listing is None:
        yield 0
        return
    for wave in range(listing.waves):
        if not listing.done(wave) and wave in committed:
            mark_done(listing.folder, wave)
        if wave in committed or listing.done(wave):
            done.skipped.append(wave)
        else:
            yield wave


def stage_metrics(result: Any) -> dict[str, Any]:
    """Counters and time distributions from Beam's metrics (every runner reports them)."""
    out: dict[str, Any] = {}
    try:
        queried = result.metrics().query()
    except Exception:  # noqa: BLE001 - some runners cannot report metrics; the manifest says so
        return {"unavailable": True}
    for counter in queried.get("counters", []):
        out[counter.key.metric.name] = out.get(counter.key.metric.name, 0) + counter.committed
    for dist in queried.get("distributions", []):
        d = dist.committed
        if d is not None and d.count:
            out[dist.key.metric.name] = {"count": d.count, "sum": d.sum, "mean": round(d.sum / d.count, 3),
                                         "max": d.max}
    return out


def merge_metrics(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Pure: two pipelines' metrics as one run's (counters add, distributions combine)."""
    out = dict(a)
    for name, value in b.items():
        mine = out.get(name)
        if mine is None:
            out[name] = value
        elif isinstance(value, dict) and isinstance(mine, dict) and "count" in value and "count" in mine:
            count, total = mine["count"] + value["count"], mine["sum"] + value["sum"]
            out[name] = {"count": count, "sum": total, "mean": round(total / count, 3),
                         "max": max(mine["max"], value["max"])}
        elif isinstance(value, int | float) and isinstance(mine, int | float) and not isinstance(value, bool):
            out[name] = mine + value
        else:
            out[name] = value
    return out
