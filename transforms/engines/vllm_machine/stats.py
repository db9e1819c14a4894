"""Each engine service's figures, `stats.json` in its folder: what the run's manifest says of each engine
(`engines`: device, pages, output tokens, busy fraction, starts) and what the progress lines rate per device.

The service rewrites the file after every answer (a small JSON, renamed over the old one: a reader never sees
half of it) and a new service of the same folder (its engine died and was restarted) counts on from it. The
launcher reads the folders of the run's engine service (`engine_figures`): on this machine only, so a run on a
remote runner's VMs has no `engines` in its manifest.
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

STATS = "stats.json"
MAX_STATS_BYTES = 1 << 16


@dataclass
class EngineStats:
    """One engine's counts (mutable, guarded by `lock`); `first_at`/`last_at`: its first request received and
    its last answer (epoch seconds); `busy_seconds`: its answers' gpu_seconds together."""

    device: str
    pages: int = 0
    output_tokens: int = 0
    busy_seconds: float = 0.0
    first_at: float | None = None
    last_at: float | None = None
    starts: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "lock"}

    def received(self, now: float | None = None) -> None:
        with self.lock:
            if self.first_at is None:
                self.first_at = time.time() if now is None else now

    def answered(self, output_tokens: int, gpu_seconds: float, starts: int, now: float | None = None) -> int:
        """Count one answer; the pages answered so far."""
        with self.lock:
            self.pages += 1
            self.output_tokens += output_tokens
            self.busy_seconds += gpu_seconds
            self.last_at = time.time() if now is None else now
            self.starts = max(self.starts, starts)
            return self.pages

    def started(self, starts: int) -> None:
        """The engine (re)started: its start count, answered or not."""
        with self.lock:
            self.starts = max(self.starts, starts)

    def write(self, directory: Path) -> None:
        """Write `stats.json` whole (a temporary file renamed over it)."""
        with self.lock:
            text = json.dumps(self.as_dict())
        tmp = directory / f".{STATS}.{os.getpid()}.{threading.get_ident()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, directory / STATS)


def load(directory: Path, device: str) -> EngineStats:
    """The folder's figures so far (a restarted service counts on), or new ones."""
    found = read(directory)
    if found is None:
        return EngineStats(device)
    keep = {k: found[k] for k in ("pages", "output_tokens", "busy_seconds", "first_at", "last_at", "starts")
            if k in found}
    return EngineStats(device, **keep)


def read(directory: Path) -> dict[str, Any] | None:
    """A folder's `stats.json`, or None (none yet, or not one)."""
    try:
        with os.fdopen(os.open(directory / STATS, os.O_RDONLY | os.O_NOFOLLOW), "rb") as handle:
            found = json.loads(handle.read(MAX_STATS_BYTES))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and isinstance(found.get("pages"), int) else None


def busy_fraction(busy_seconds: float, first_at: float | None, last_at: float | None) -> float | None:
    """An engine's busy seconds over the seconds from its first request to its last answer (1.0: never idle
    while it had work to come). Pure."""
    if first_at is None or last_at is None or last_at <= first_at:
        return None
    return round(min(1.0, busy_seconds / (last_at - first_at)), 3)


def manifest_entry(found: dict[str, Any]) -> dict[str, Any]:
    """The manifest's entry of one engine from its `stats.json`. Pure."""
    return {"device": str(found.get("device", "")), "pages": int(found.get("pages", 0)),
            "output_tokens": int(found.get("output_tokens", 0)),
            "busy_fraction": busy_fraction(float(found.get("busy_seconds", 0.0)), found.get("first_at"),
                                           found.get("last_at")),
            "starts": int(found.get("starts", 0))}


def service_folders(service_dir: str | Path) -> list[Path]:
    """The engine folders of a run's service folder: the folder itself (one engine for the machine) and its
    `device-<i>` folders (one engine per device), in device order."""
    root = Path(service_dir)
    devices = sorted(root.glob("device-*"), key=lambda p: (len(p.name), p.name))
    return [root, *devices]


def engine_figures(service_dir: str | Path) -> list[dict[str, Any]]:
    """The manifest's `engines`: one entry per engine that answered or started in this run's service folder."""
    found = [read(folder) for folder in service_folders(service_dir)]
    return [manifest_entry(f) for f in found if f is not None]


def pages_by_device(service_dir: str | Path) -> dict[str, int]:
    """Each engine's pages answered so far (the progress lines' per-device rates)."""
    found = [read(folder) for folder in service_folders(service_dir)]
    return {str(f.get("device", "")): int(f["pages"]) for f in found if f is not None}
