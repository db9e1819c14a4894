"""A run reads only its own `--input`: every listed URI is checked again, before anything reads it, to lie under
one of this invocation's input roots. The listing it comes from lives under the output root, where a tenant may
write (docs/safety.md), so a listing is a claim to check, not a fact.

`input_roots(patterns)` builds the roots once, in the launcher (it opens `@FILE` lists); `within_inputs(uri,
roots)` is pure. A root is a URI named on its own (a file, or a line of an `@FILE` list): the same string, or a
wildcard pattern (a folder is `folder/**`): Beam's own glob rule (what listing matched) and, lexically, no
`..` climbing out of the pattern's folder. Symlinks of local files are resolved where the file is opened
(transforms/intake/reading.py `local_roots`), as they are at listing.
"""
from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass

from apache_beam.io.filesystem import FileSystem

from transforms.intake.listing import expand_input, is_literal, literal_prefix


@dataclass(frozen=True)
class InputRoots:
    """The roots of one invocation's `--input`: URIs named on their own, and (glob regex, the glob's folder)."""

    named: frozenset[str] = frozenset()
    globs: tuple[tuple[re.Pattern[str], str], ...] = ()

    def admits(self, uri: str) -> bool:
        """`within_inputs(uri, self)`: the reader asks through this, so it needs no import of this module
        (bounds -> listing -> reading would be a circle)."""
        return within_inputs(uri, self)


def _local(uri: str) -> str:
    return uri.removeprefix("file://")


def split_uri(uri: str) -> tuple[str, str]:
    """Pure: (`scheme://bucket`, or "" for a local path; the path, an object key without its leading /)."""
    uri = _local(uri)
    if "://" not in uri:
        return "", uri
    scheme, rest = uri.split("://", 1)
    bucket, _, key = rest.partition("/")
    return f"{scheme}://{bucket}", key


def contained(path: str, folder: str) -> bool:
    """Pure: `path` (normalised) is `folder` (normalised) or below it; "." holds every relative path that does
    not climb out. A boundary is a whole segment: `alpha_in2/x` is not under `alpha_in`."""
    if folder in ("", "."):
        return not (path == ".." or path.startswith("../") or path.startswith("/"))
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def glob_folder(glob: str) -> str:
    """Pure: the folder (or key prefix up to its last /) that a wildcard pattern lists, as Beam lists it."""
    return posixpath.dirname(literal_prefix(_local(glob)))


def _root(glob: str) -> tuple[re.Pattern[str], str]:
    return re.compile(FileSystem.translate_pattern(_local(glob))), glob_folder(glob)


def input_roots(patterns: Iterable[str]) -> InputRoots:
    """The roots of `--input` patterns (`@FILE`: the URIs and patterns the file lists, read now)."""
    named: set[str] = set()
    globs: list[tuple[re.Pattern[str], str]] = []
    for pattern in patterns:
        for glob in expand_input(pattern):
            if is_literal(glob):
                named.add(_local(glob))
            else:
                globs.append(_root(glob))
    return InputRoots(frozenset(named), tuple(globs))


def _under_glob(uri: str, regex: re.Pattern[str], folder: str) -> bool:
    if not regex.match(uri):
        return False
    origin, path = split_uri(uri)
    root_origin, root_path = split_uri(folder)
    # `..` segments: matched by the glob's `**`, so the lexical path must stay under the glob's folder too.
    return origin == root_origin and contained(posixpath.normpath(path), posixpath.normpath(root_path))


def within_inputs(uri: str, roots: InputRoots) -> bool:
    """Pure: whether a listed URI lies under one of the roots. A named root matches only itself, as written (a
    `..` or `./` spelling of it is not it); a wildcard root by its glob and its folder."""
    uri = _local(uri)
    return uri in roots.named or any(_under_glob(uri, regex, folder) for regex, folder in roots.globs)


def normalised_inputs(patterns: Iterable[str]) -> tuple[str, ...]:
    """The `--input` patterns as a listing records them: local paths absolute (a folder with its trailing /),
    object-store URIs as given, `@FILE` as `@` and its file's URI so normalised; sorted, each once."""
    def one(pattern: str) -> str:
        if pattern.startswith("@"):
            return "@" + one(pattern[1:])
        path = _local(pattern)
        if "://" in path:
            return pattern
        folder = path.endswith("/") or (is_literal(path) and os.path.isdir(path))
        return os.path.abspath(path) + ("/" if folder else "")

    return tuple(sorted({one(p) for p in patterns}))
