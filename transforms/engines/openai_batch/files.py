"""A run's batch folder (schemas.layout.batch_folder), on any storage Beam's FileSystems reaches (workers may run
on other hosts: nothing they need lives only on the launcher's disk):

- `state.json`: the batch manifest, written whole or not at all (transforms.store.listing_file.write_whole): every
  batch's request file fingerprint, custom_ids, provider ids, status and request counts as the provider reported
  them, each request's resubmissions and the queue of requests to resubmit. The launcher is its only writer.
- `spool/<uuid>.jsonl`: request lines the workers could not answer yet (engine.py), one file per flush.
- `requests/<fingerprint>.jsonl`: the exact bytes of each batch input file, written before it is uploaded.
- `results/<batch_id>.jsonl`: a collected batch, normalised: `{"custom_id", "body"}` (the chat completion) or
  `{"custom_id", "failed": reason_code, "message"}` (a request that ran out of resubmissions).
"""
from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from schemas import layout
from transforms.store.listing_file import read_whole, write_whole

STATE = "state.json"
FORMAT = 1


def empty_state(run_key: str) -> dict[str, Any]:
    """A run's state before its first batch. Pure."""
    return {"format": FORMAT, "run_key": run_key, "entries": [], "tries": {}, "resubmit": [], "cancelled": False}


def load_state(folder: str, run_key: str) -> dict[str, Any]:
    data = read_whole(layout.join_uri(folder, STATE))
    if data is None:
        return empty_state(run_key)
    state = json.loads(data)
    if state.get("run_key") != run_key:  # a folder is its run's: never adopt another run's batches
        raise ValueError(f"{folder}/{STATE} belongs to run {state.get('run_key')!r}, not {run_key!r}")
    return state


def save_state(folder: str, state: dict[str, Any]) -> None:
    write_whole(layout.join_uri(folder, STATE), (json.dumps(state, sort_keys=True) + "\n").encode())


def fingerprint(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


def request_file(folder: str, fp: str) -> str:
    return layout.join_uri(folder, "requests", f"{fp}.jsonl")


def result_file(folder: str, batch_id: str) -> str:
    return layout.join_uri(folder, "results", f"{batch_id}.jsonl")


def write_lines(uri: str, lines: Iterable[bytes]) -> None:
    write_whole(uri, b"".join(line.rstrip(b"\n") + b"\n" for line in lines))


def read_lines(uri: str) -> list[bytes]:
    data = read_whole(uri)
    return [] if data is None else [line for line in data.split(b"\n") if line.strip()]


def matching(folder: str, sub: str) -> list[str]:
    """The finished files of `folder/sub/` (a temporary `.inprogress` file is not one)."""
    found = FileSystems.match([layout.join_uri(folder, sub, "*.jsonl")])[0].metadata_list
    return sorted(m.path for m in found)


def write_spool(folder: str, lines: Iterable[bytes]) -> str:
    uri = layout.join_uri(folder, "spool", f"{uuid.uuid4().hex}.jsonl")
    write_lines(uri, lines)
    return uri


def delete(uris: list[str]) -> None:
    if uris:
        FileSystems.delete(uris)


def results(folder: str) -> Iterator[dict[str, Any]]:
    """Every collected result line of the run."""
    for uri in matching(folder, "results"):
        for line in read_lines(uri):
            yield json.loads(line)


def open_raw(uri: str) -> Any:
    return FileSystems.open(uri, compression_type=CompressionTypes.UNCOMPRESSED)
