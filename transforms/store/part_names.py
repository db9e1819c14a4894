"""The names of a run's part files, written and read here only.

`part-<uuid>.parquet` (written without waves), `part-wNNNNN-<uuid>.parquet` (written by wave NNNNN, so a
resumed wave finds its own rows), `part-compacted-<uuid>.parquet` and `part-wNNNNN-compacted-<uuid>.parquet`
(one file of one row per key, transforms/store/compaction.py) with, when a catalog's snapshots may still name
the files it replaced, `<its stem>.replaces.json` beside it (transforms/store/files.py). Pure.
"""
from __future__ import annotations

import re
import uuid

from schemas.layout import PART_SUFFIX

PART_PREFIX = "part-"
COMPACTED = "compacted-"
REPLACES_SUFFIX = ".replaces.json"  # a compacted file's list of the files it replaced
_WAVE = re.compile(rf"/{PART_PREFIX}w(\d{{5}})-[^/]*$")


def part_prefix(wave: int | None) -> str:
    """Part files of one wave are named after it (`part-w00003-...`), so a resumed wave finds its own rows."""
    return PART_PREFIX if wave is None else f"{PART_PREFIX}w{wave:05d}-"


def compacted_prefix(wave: int | None) -> str:
    """A compaction's file: of the whole run (`part-compacted-`), or of one wave (`part-w00003-compacted-`)."""
    return part_prefix(wave) + COMPACTED


def new_stem(prefix: str = PART_PREFIX) -> str:
    """A new part file's name without its suffix: `prefix` and a fresh uuid."""
    return f"{prefix}{uuid.uuid4().hex}"


def part_name(stem: str) -> str:
    return stem + PART_SUFFIX


def new_part_name(prefix: str = PART_PREFIX) -> str:
    """A new part file's name (`<prefix><uuid>.parquet`): never one a writer or an earlier attempt used."""
    return part_name(new_stem(prefix))


def replaces_name(stem: str) -> str:
    """The sidecar of compacted file `stem` naming the files it replaced."""
    return stem + REPLACES_SUFFIX


def replaced_part(sidecar_name: str) -> str:
    """The compacted part file a sidecar (`replaces_name`) sits beside."""
    return part_name(sidecar_name.removesuffix(REPLACES_SUFFIX))


def wave_of(path: str) -> int | None:
    """The wave a part file was written by (its name), or None (compacted whole, or written without waves)."""
    found = _WAVE.search(path)
    return int(found.group(1)) if found else None
