"""The durable listing of a run: its objects, listed once by the launcher and written under the run as waves
of at most `--wave-objects` objects (Parquet, URI order), so that a resumed run knows what was listed and
skips a finished wave without reading it again (pipelines/run/waves.py).

`<output>/listings/tenant=<t>/run_id=<id>/`: `wave-00000.parquet` ... one file a wave, then `_LISTED` (written
last: its presence says the listing is whole), and `wave-00000.done` once that wave's pipeline finished.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from schemas import layout
from schemas.records import ListedObject

LISTING_SCHEMA = pa.schema([("uri", pa.string()), ("size", pa.int64()), ("last_modified", pa.float64())])
COMPLETE = "_LISTED"


@dataclass(frozen=True)
class Listing:
    """A run's written listing: where it lies, how many waves and objects it holds."""

    folder: str
    waves: int
    objects: int
    bytes: int  # their listed sizes, summed

    def wave_file(self, wave: int) -> str:
        return wave_file(self.folder, wave)

    def done(self, wave: int) -> bool:
        return FileSystems.exists(done_marker(self.folder, wave))


def wave_file(folder: str, wave: int) -> str:
    return layout.join_uri(folder, f"wave-{wave:05d}.parquet")


def done_marker(folder: str, wave: int) -> str:
    return layout.join_uri(folder, f"wave-{wave:05d}.done")


def first_wave(wave_objects: int, objects: int) -> int:
    """Pure: when the listing needs more than one wave, the first is a tenth of the others (at least 1), so
    that the first pages reach the disk (and the model) after a tenth of a wave's intake, as in a ramp-up;
    the later waves are full. A listing that fits one wave is one wave (each wave starts its workers)."""
    return wave_objects if objects <= wave_objects else max(1, wave_objects // 10)


def wave_chunks(objects: Sequence[ListedObject], wave_objects: int) -> Iterator[list[ListedObject]]:
    """Pure: consecutive chunks (the listing's order kept): `first_wave` objects, then at most `wave_objects`."""
    chunk: list[ListedObject] = []
    size = first_wave(wave_objects, len(objects))
    for obj in objects:
        chunk.append(obj)
        if len(chunk) >= size:
            yield chunk
            chunk, size = [], wave_objects
    if chunk:
        yield chunk


def write_listing(folder: str, objects: Sequence[ListedObject], wave_objects: int) -> Listing:
    """Write the objects (in URI order: an earlier wave holds the smaller URIs, so the copy that dedup keeps
    is always in the earliest wave that has one) as wave files, then the completeness marker."""
    waves = count = total = 0
    for chunk in wave_chunks(objects, max(1, wave_objects)):
        table = pa.Table.from_pylist([{"uri": o.uri, "size": o.size, "last_modified": o.last_modified}
                                      for o in chunk], schema=LISTING_SCHEMA)
        buf = pa.BufferOutputStream()
        pq.write_table(table, buf, compression="zstd")
        with FileSystems.create(wave_file(folder, waves)) as handle:
            handle.write(buf.getvalue().to_pybytes())
        waves, count, total = waves + 1, count + len(chunk), total + sum(max(0, o.size) for o in chunk)
    # Last, and whole or not at all (a kill before it leaves no marker: the next attempt lists again).
    marker = layout.join_uri(folder, COMPLETE)
    local = "://" not in folder or folder.startswith("file://")
    with FileSystems.create(marker + ".inprogress" if local else marker) as handle:
        handle.write(f"{waves} {count} {total}\n".encode())
    if local:
        FileSystems.rename([marker + ".inprogress"], [marker])
    return Listing(folder, waves, count, total)


def read_listing(folder: str) -> Listing | None:
    """The run's listing, or None when it was never written whole (a kill while listing: list again)."""
    marker = layout.join_uri(folder, COMPLETE)
    if not FileSystems.exists(marker):
        return None
    with FileSystems.open(marker) as handle:
        waves, count, total = (int(x) for x in handle.read().decode().split())
    return Listing(folder, waves, count, total)


def mark_done(folder: str, wave: int) -> None:
    with FileSystems.create(done_marker(folder, wave)) as handle:
        handle.write(b"done\n")


def clear_listing(folder: str) -> None:
    """`--force`: the run starts afresh, with a new listing."""
    found = [m.path for m in FileSystems.match([layout.join_uri(folder, "*")])[0].metadata_list]
    if found:
        FileSystems.delete(found)


def _listed(row: dict) -> ListedObject:
    return ListedObject(uri=row["uri"], size=int(row["size"]), last_modified=row["last_modified"])


class _Submitted(beam.DoFn):
    """Counts the objects a wave hands to intake (a resumed run's counter shows what it read again)."""

    def setup(self) -> None:
        self.submitted = Metrics.counter("pagemill", "objects_submitted")

    def process(self, row: dict) -> Iterator[ListedObject]:
        self.submitted.inc()
        yield _listed(row)


class ReadWave(beam.PTransform):
    """One wave's listed objects, spread over the workers (the listing's role in a wave's pipeline)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        return (
            pbegin
            | "WaveFile" >> beam.io.ReadFromParquet(self.path)
            | "Spread" >> beam.Reshuffle()
            | "Submitted" >> beam.ParDo(_Submitted())
        )
