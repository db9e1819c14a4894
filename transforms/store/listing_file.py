"""The durable listing of a run: its objects, listed once by the launcher and written under the run as waves
of at most `--wave-objects` objects (Parquet, URI order), so that a resumed run knows what was listed and
skips a finished wave without reading it again (pipelines/run/waves.py).

`<output>/listings/tenant=<t>/run_id=<id>/`: `wave-00000.parquet` ... one file a wave, then `_LISTED` (written
last: its presence says the listing is whole), and `wave-00000.done` once that wave's pipeline finished.

A listing belongs to its run: `_LISTED` (JSON, written whole or not at all) records the `--input` it was made
from (normalised, transforms/intake/bounds.py) and the sha256 of every wave file, so that a resume with other
inputs, or over a wave file changed since, is refused (pipelines/run/waves.py), and a wave's file is checked
against its digest again as the wave reads it. The folder lies under the output root, which a tenant may write:
that is why every URI read from it is also checked against this invocation's `--input` before it is read.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from schemas import layout
from schemas.records import ListedObject

LISTING_SCHEMA = pa.schema([("uri", pa.string()), ("size", pa.int64()), ("last_modified", pa.float64())])
COMPLETE = "_LISTED"
FORMAT = 2  # of `_LISTED`; 1 was "waves objects bytes", which records no inputs and no digests


class ListingChanged(Exception):
    """A wave file is not the one written with the listing (its sha256 differs, or it is gone)."""


@dataclass(frozen=True)
class Listing:
    """A run's written listing: where it lies, how many waves and objects it holds, what it was made from."""

    folder: str
    waves: int
    objects: int
    bytes: int  # their listed sizes, summed
    inputs: tuple[str, ...] | None = None  # normalised --input; None: the marker records none (not trusted)
    digests: tuple[str, ...] = ()  # sha256 of each wave file, in wave order

    def wave_file(self, wave: int) -> str:
        return wave_file(self.folder, wave)

    def done(self, wave: int) -> bool:
        return FileSystems.exists(done_marker(self.folder, wave))

    def record(self) -> dict[str, object]:
        """The manifest's `listing`: the inputs it was made from and the sha256 of its marker (which holds
        every wave file's), so a reader can tell which listing the run's rows came from."""
        return {"inputs": list(self.inputs or ()), "sha256": sha256(marker_text(self).encode())}


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


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def wave_bytes(chunk: Sequence[ListedObject]) -> bytes:
    """Pure: one wave's Parquet file."""
    table = pa.Table.from_pylist([{"uri": o.uri, "size": o.size, "last_modified": o.last_modified}
                                  for o in chunk], schema=LISTING_SCHEMA)
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue().to_pybytes()


def write_listing(folder: str, objects: Sequence[ListedObject], wave_objects: int,
                  inputs: Sequence[str] = ()) -> Listing:
    """Write the objects (in URI order: an earlier wave holds the smaller URIs, so the copy that dedup keeps
    is always in the earliest wave that has one) as wave files, then the completeness marker, which records
    `inputs` (the normalised --input they were listed from) and each wave file's sha256."""
    count = total = 0
    digests: list[str] = []
    for chunk in wave_chunks(objects, max(1, wave_objects)):
        data = wave_bytes(chunk)
        with FileSystems.create(wave_file(folder, len(digests))) as handle:
            handle.write(data)
        digests.append(sha256(data))
        count, total = count + len(chunk), total + sum(max(0, o.size) for o in chunk)
    listing = Listing(folder, len(digests), count, total, tuple(inputs), tuple(digests))
    # Last, and whole or not at all (a kill before it leaves no marker: the next attempt lists again).
    write_whole(layout.join_uri(folder, COMPLETE), marker_text(listing).encode())
    return listing


def write_whole(uri: str, data: bytes) -> None:
    """A file that a reader sees whole or not at all: a temporary name, then a rename (local); one upload
    that the store makes visible at its end (object stores)."""
    local = "://" not in uri or uri.startswith("file://")
    with FileSystems.create(uri + ".inprogress" if local else uri) as handle:
        handle.write(data)
    if local:
        FileSystems.rename([uri + ".inprogress"], [uri])


def marker_text(listing: Listing) -> str:
    """Pure: `_LISTED`'s content."""
    return json.dumps({"format": FORMAT, "inputs": list(listing.inputs or ()), "waves": listing.waves,
                       "objects": listing.objects, "bytes": listing.bytes, "wave_sha256": list(listing.digests)},
                      sort_keys=True) + "\n"


def parse_marker(folder: str, text: str) -> Listing:
    """Pure: the listing a marker describes; one that records no inputs or digests (format 1, or not written by
    pagemill) has `inputs` None: nothing binds it to a run, so it is not trusted."""
    try:
        found = json.loads(text)
        inputs, digests = found["inputs"], found["wave_sha256"]
        waves, objects, total = (int(found[k]) for k in ("waves", "objects", "bytes"))
        if found.get("format") != FORMAT or len(digests) != waves or not all(
                isinstance(x, str) for x in (*inputs, *digests)):
            raise ValueError("not a bound listing")
    except (ValueError, TypeError, KeyError, AttributeError):  # json's errors are ValueErrors
        return Listing(folder, 0, 0, 0)
    return Listing(folder, waves, objects, total, tuple(inputs), tuple(digests))


def read_listing(folder: str) -> Listing | None:
    """The run's listing, or None when it was never written whole (a kill while listing: list again)."""
    marker = layout.join_uri(folder, COMPLETE)
    if not FileSystems.exists(marker):
        return None
    with FileSystems.open(marker) as handle:
        return parse_marker(folder, handle.read(1 << 24).decode("utf-8", "replace"))


def read_whole(uri: str) -> bytes | None:
    """A file's bytes, or None when it is gone (not the file that was written). A file that is there but cannot
    be read raises what the storage raised: a storage failure must say so, not pass for a changed listing (a
    worker whose filesystem has no credentials once did)."""
    if not FileSystems.exists(uri):
        return None
    with FileSystems.open(uri, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        return handle.read()


def changed_waves(listing: Listing, waves: Sequence[int] | None = None) -> list[int]:
    """The waves (all, or those given) whose file's sha256 is not the one recorded (or that are gone)."""
    chosen = range(listing.waves) if waves is None else waves
    return [w for w in chosen if (data := read_whole(listing.wave_file(w))) is None
            or w >= len(listing.digests) or sha256(data) != listing.digests[w]]


def mark_done(folder: str, wave: int) -> None:
    with FileSystems.create(done_marker(folder, wave)) as handle:
        handle.write(b"done\n")


def reopen_waves(folder: str, waves: int) -> None:
    """Every wave of the listing in `folder` (of `waves` waves) is read again: their done markers go."""
    markers = [done_marker(folder, w) for w in range(waves)]
    found = [m for m in markers if FileSystems.exists(m)]
    if found:
        FileSystems.delete(found)


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


def wave_rows(path: str, digest: str | None) -> Iterator[dict]:
    """A wave file's rows, read once and checked against its recorded sha256 (None: not checked) as it is read:
    a file rewritten after the launcher checked it fails the wave rather than feed it."""
    data = read_whole(path)
    if data is None or (digest is not None and sha256(data) != digest):
        raise ListingChanged(f"the listing changed: {path} is not the file written with the listing")
    yield from pq.read_table(pa.BufferReader(data)).to_pylist()


class ReadWave(beam.PTransform):
    """One wave's listed objects, spread over the workers (the listing's role in a wave's pipeline)."""

    def __init__(self, path: str, digest: str | None = None) -> None:
        super().__init__()
        self.path, self.digest = path, digest

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        return (
            pbegin
            | "WaveFile" >> beam.Create([self.path])
            | "Read" >> beam.FlatMap(wave_rows, self.digest)
            | "Spread" >> beam.Reshuffle()
            | "Submitted" >> beam.ParDo(_Submitted())
        )
