"""One run manifest file (`runs/tenant=<t>/<run_id>.json`), read and written so that no one's file breaks
anyone else.

A manifest lies under its tenant's prefix, which that tenant may write, so a reader takes any shape: it checks
the fields pagemill reads (SHAPE) and skips a file without that shape, with one warning line naming the file,
never a traceback. A writer never leaves half a manifest: locally the text goes to a temporary name beside it
and is renamed over it (a rename replaces atomically); elsewhere (s3://) the whole text is one write to one
new object, which appears whole when its upload completes or not at all.
"""
from __future__ import annotations

import datetime as dt
import json
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from transforms.text_safety import terminal_safe

# A real manifest is a few KiB; a bigger file is not one, and reading it would cost every reader.
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
INT64 = 2 ** 63  # the `runs` view's integer columns are BIGINT
NUMBER = (int, float)


@dataclass(frozen=True)
class Obj:
    """A JSON object whose listed fields, when present and not null, have these shapes; `required`
    must be present."""
    fields: Mapping[str, tuple[type, ...] | Obj]
    required: tuple[str, ...] = ()


# What pagemill reads from a manifest: the `runs` view's columns (pipelines/tables/sql.py), `--since-last-run`
# (started_at, options.job_name), the typed views (options.schema) and the report (stage_timings.render_ms).
SHAPE = Obj({
    "run_id": (str,), "started_at": (dt.datetime,), "finished_at": (dt.datetime,), "wall_seconds": NUMBER,
    "tenant": (str,), "documents": (int,),
    "totals": Obj({"pages": (int,), "model_calls": (int,), "cost_usd": NUMBER, "api_equivalent_usd": NUMBER}),
    "options": Obj({"tenant": (str,), "schema": (str,), "job_name": (str,)}),
    "stage_timings": Obj({"render_ms": Obj({"count": (int,), "sum": NUMBER}, required=("count", "sum"))}),
})

_warned: set[tuple[str, str]] = set()


def shape_problem(value: Any, shape: tuple[type, ...] | Obj, where: str) -> str | None:
    """Pure: why `value` does not have `shape` (a datetime is an ISO 8601 string), or None."""
    if isinstance(shape, Obj):
        if not isinstance(value, dict):
            return f"{where} is {_kind(value)}, not an object"
        missing = [k for k in shape.required if k not in value]
        if missing:
            return f"{where} lacks {', '.join(missing)}"
        for key, inner in shape.fields.items():
            if value.get(key) is not None and (why := shape_problem(value[key], inner, f"{where}.{key}")):
                return why
        return None
    if dt.datetime in shape:
        return None if isinstance(value, str) and _is_iso(value) else f"{where} is not an ISO 8601 time"
    if isinstance(value, bool) or not isinstance(value, shape):  # JSON true is not a number here
        return f"{where} is {_kind(value)}, not {' or '.join(t.__name__ for t in shape)}"
    if isinstance(value, int) and not -INT64 <= value < INT64:
        return f"{where} is out of range"
    return None


def parse(data: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """Pure: (the manifest, None), or (None, why it is not one)."""
    if len(data) > MAX_MANIFEST_BYTES:
        return None, f"larger than {MAX_MANIFEST_BYTES} bytes"
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as err:  # truncated, not UTF-8, nested beyond reason
        return None, f"not JSON ({' '.join(str(err).split())[:120]})"
    why = shape_problem(value, SHAPE, "the manifest")
    return (None, why) if why else (value, None)


def read(fs: pafs.FileSystem, path: str) -> dict[str, Any] | None:
    """The manifest at `path`, or None after one warning line on stderr that names the file."""
    try:
        with fs.open_input_stream(path) as handle:
            data = handle.read(MAX_MANIFEST_BYTES + 1)
    except OSError as err:
        manifest, why = None, f"cannot be read ({err})"
    else:
        manifest, why = parse(data)
    if why is not None:
        warn(path, why)
    return manifest


def warn(path: str, why: str) -> None:
    """One line per file and cause in a process (every query of a run reconnects; one line is enough)."""
    if (path, why) not in _warned:
        _warned.add((path, why))
        print(f"pagemill: warning: skipped the manifest {terminal_safe(path)}: {terminal_safe(why)}",
              file=sys.stderr)


def write(uri: str, manifest: Mapping[str, Any]) -> None:
    """Write `manifest` to `uri` whole or not at all (an interrupted write leaves the old file as it was)."""
    from apache_beam.io.filesystems import FileSystems  # the launcher's; `pagemill sql` never loads Beam for it
    from apache_beam.io.localfilesystem import LocalFileSystem

    data = json.dumps(manifest, indent=1, default=str, sort_keys=True).encode()  # all of it before any file
    if not isinstance(FileSystems.get_filesystem(uri), LocalFileSystem):
        with FileSystems.create(uri) as handle:  # one object: an upload completes whole or leaves nothing
            handle.write(data)
        return
    folder, name = uri.rsplit("/", 1)
    # Not `*.json`: a reader never lists it, and a killed writer's leftover is never read as a manifest.
    temporary = f"{folder}/.{name}.{uuid.uuid4().hex}.tmp"
    try:
        with FileSystems.create(temporary) as handle:
            handle.write(data)
        FileSystems.rename([temporary], [uri])
    except BaseException:
        if FileSystems.exists(temporary):
            FileSystems.delete([temporary])
        raise


def _is_iso(text: str) -> bool:
    try:
        dt.datetime.fromisoformat(text)
    except ValueError:
        return False
    return True


def _kind(value: Any) -> str:
    return "null" if value is None else {dict: "an object", list: "a list", str: "a string",
                                         bool: "a boolean"}.get(type(value), "a number")
