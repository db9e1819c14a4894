"""Fault injection: code that runs inside a pagemill child (the render worker's process, or any ChildWorker's) and
tries to read the environment of every process above it, as a document that took over pdfium would.

`probe(secret)` is a ChildWorker work function; `ProbeCheck` is a `--safety-check` factory, so a real run's render
child runs it: it reads the secret to look for from PAGEMILL_CHECK_PROBE_SECRET (the prefix the child's
environment keeps) and writes what it saw to PAGEMILL_CHECK_PROBE_DIR/probe-<pid>.json."""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SECRET_VAR, DIR_VAR = "PAGEMILL_CHECK_PROBE_SECRET", "PAGEMILL_CHECK_PROBE_DIR"


def _stat(pid: int) -> tuple[str, int]:
    """A process's name and its parent's pid (/proc/<pid>/stat: readable by anyone)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    name, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
    return name, int(rest[1])


def ancestors() -> list[tuple[int, str]]:
    """(pid, name) of every process above this one, its parent first, up to pid 1."""
    found: list[tuple[int, str]] = []
    pid = os.getppid()
    while pid > 0:
        name, parent = _stat(pid)
        found.append((pid, name))
        pid = parent
    return found


def read_environ(pid: int, secret: str) -> str:
    """'secret' when /proc/<pid>/environ could be read and holds `secret`, 'read' when it could be read,
    else 'refused: <why>'."""
    try:
        data = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError as err:
        return f"refused: {err.strerror}"
    return "secret" if secret.encode() in data else "read"


def own_status() -> tuple[str, str]:
    """This process's user namespace map (its first line) and effective capabilities: how it is isolated."""
    uid_map = Path("/proc/self/uid_map").read_text().strip().splitlines()
    caps = next(line.split()[1] for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith("CapEff:"))
    return " ".join(uid_map[0].split()) if uid_map else "", caps


def probe(secret: str) -> Iterator[tuple[Any, ...]]:
    """Work for a ChildWorker: ("self", uid_map, CapEff), then (pid, name, what read_environ saw) per ancestor."""
    yield ("self", *own_status())
    for pid, name in ancestors():
        yield (pid, name, read_environ(pid, secret))


class ProbeCheck:
    """A page check that checks nothing: built in the render child, it records what that child can read."""

    name = "ancestors_probe"

    def __init__(self) -> None:
        secret, folder = os.environ[SECRET_VAR], Path(os.environ[DIR_VAR])
        seen = [list(item) for item in probe(secret)]
        (folder / f"probe-{os.getpid()}.json").write_text(json.dumps(seen))

    def check(self, page: Any, image: Any) -> None:
        return None
