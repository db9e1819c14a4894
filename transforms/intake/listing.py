"""Listing: the input patterns (folders, wildcards, `@FILE` lists, S3 prefixes) become one ListedObject per
distinct object, with the time window and the symlink rule applied. `ListObjects` is the Beam transform;
`list_matching` applies the same rules without Beam (the estimate uses it).
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from schemas.records import ListedObject
from transforms.intake.reading import under

MISSING = -1  # ListedObject.size of a URI that was listed by name but does not exist
OUTSIDE = -2  # ListedObject.size of a local path that a wildcard reached through a symlink leading out


def is_literal(glob: str) -> bool:
    """A URI named on its own (no wildcard)."""
    return not any(c in glob for c in "*?[")


def expand_input(pattern: str) -> list[str]:
    """A folder becomes a recursive glob; `@FILE` becomes the URIs it lists (one a line, # comments)."""
    if pattern.startswith("@"):
        with FileSystems.open(pattern[1:], compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            lines = handle.read().decode("utf-8").splitlines()
        return [s for s in (line.strip() for line in lines) if s and not s.startswith("#")]
    if pattern.endswith("/"):
        return [pattern + "**"]
    if is_literal(pattern) and _is_dir(pattern):
        return [pattern.rstrip("/") + "/**"]
    return [pattern]


def _is_dir(path: str) -> bool:
    return "://" not in path and os.path.isdir(path)


def to_listed(meta: fileio.FileMetadata) -> ListedObject:
    return ListedObject(uri=meta.path, size=int(meta.size_in_bytes), last_modified=meta.last_updated_in_seconds)


def literal_prefix(pattern: str) -> str:
    """The part of a pattern before its first wildcard: what a listing can check exists."""
    return re.split(r"[*?\[]", pattern, maxsplit=1)[0]


def glob_root(pattern: str) -> str | None:
    """The local folder a wildcard pattern lists (before its first wildcard); None for a path named on
    its own (the caller chose that file, link or not) and for object storage (no symlinks there)."""
    if "://" in pattern or is_literal(pattern):
        return None
    return os.path.dirname(literal_prefix(pattern)) or "."


def local_roots(patterns: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """The local folders the patterns' wildcards walk, each as (absolute path, resolved path): what the reader
    checks an opened file against (transforms/intake/reading.py). `@FILE` lists are not opened here: their
    wildcards are not covered."""
    roots = {glob_root(g) for p in patterns if not p.startswith("@") for g in expand_input(p)}
    return tuple(sorted((os.path.abspath(r), os.path.realpath(r)) for r in roots if r is not None))


def inside(path: str, real_root: str) -> bool:
    """True when `path`, with every symlink resolved, lies under `real_root` (already resolved: it is
    resolved once per listing, not once per object)."""
    return under(os.path.realpath(path), real_root)


def match_pattern(pattern: str) -> Iterator[ListedObject]:
    """The objects a pattern lists. A local file that a wildcard reached through a symlink leading out
    of the listed folder is listed with size OUTSIDE (rejected at intake as `outside_input`, never
    read); a symlink to a file inside the folder is followed."""
    root = glob_root(pattern)
    root = os.path.realpath(root) if root is not None else None
    for meta in FileSystems.match([pattern])[0].metadata_list:
        obj = to_listed(meta)
        if root is not None and not inside(meta.path, root):
            obj = ListedObject(uri=obj.uri, size=OUTSIDE, last_modified=obj.last_modified)
        yield obj


def input_globs(patterns: Iterable[str]) -> list[str]:
    """Every pattern expanded (`expand_input`), each glob once, sorted."""
    return sorted({g for p in patterns for g in expand_input(p)})


def list_glob(glob: str, since: float | None = None, until: float | None = None) -> Iterator[ListedObject]:
    """One glob's objects modified in the window (`in_window`). A URI named on its own that lists nothing
    and does not exist is listed as MISSING: a listed object must never vanish silently."""
    matched = False
    for obj in match_pattern(glob):
        matched = True
        if in_window(obj, since, until):
            yield obj
    if not matched and is_literal(glob):
        yield from missing_object(glob)


def once_per_uri(objs: Iterable[ListedObject]) -> ListedObject:
    """One object reached twice: a path both named on its own and reached by a wildcard keeps its real
    size (named wins over MISSING or OUTSIDE)."""
    return max(objs, key=lambda o: o.size)


def list_matching(patterns: Iterable[str], since: float | None = None,
                  until: float | None = None) -> list[ListedObject]:
    """What `ListObjects` lists, without a pipeline (`pagemill estimate`), in URI order: the same globs,
    `list_glob` and `once_per_uri`."""
    by_uri: dict[str, list[ListedObject]] = {}
    for glob in input_globs(patterns):
        for obj in list_glob(glob, since, until):
            by_uri.setdefault(obj.uri, []).append(obj)
    return [once_per_uri(by_uri[uri]) for uri in sorted(by_uri)]


class ListObjects(beam.PTransform):
    """Patterns -> one ListedObject per distinct object (an object reached twice is listed once). The
    rules are `list_glob` and `once_per_uri`, which `list_matching` applies without Beam."""

    def __init__(self, patterns: Iterable[str], modified_since: float | None = None,
                 modified_until: float | None = None) -> None:
        super().__init__()
        self.patterns = list(patterns)
        self.since, self.until = modified_since, modified_until

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        return (
            pbegin
            | "Patterns" >> beam.Create(input_globs(self.patterns))
            | "Match" >> beam.FlatMap(list_glob, self.since, self.until)
            | "Spread" >> beam.Reshuffle()
            | "ByUri" >> beam.Map(lambda o: (o.uri, o))
            | "OncePerUri" >> beam.CombinePerKey(once_per_uri)
            | "Values" >> beam.Values()
        )


def in_window(obj: ListedObject, since: float | None, until: float | None) -> bool:
    """Nightly and backfill jobs take objects by LastModified; an unknown time is always taken."""
    if obj.last_modified is None:
        return True
    return (since is None or obj.last_modified >= since) and (until is None or obj.last_modified < until)


def missing_object(uri: str) -> Iterator[ListedObject]:
    """A URI given by name: nothing if it exists, else its `MISSING` listing (the row says not_found)."""
    try:
        exists = FileSystems.exists(uri)
    except Exception:  # noqa: BLE001 - an unreachable store is reported as a missing object
        exists = False
    if not exists:
        yield ListedObject(uri=uri, size=MISSING)
