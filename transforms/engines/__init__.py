"""Engines: what answers a page (vLLM in process, one engine per machine, a served endpoint, a simulated engine for
benchmarks), behind one contract (base.py), made by `make` from their settings."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transforms.engines.base import PageEngine


def make(settings: Any) -> PageEngine:
    """The engine for `settings` (EngineSettings: "local" or "machine"; EndpointSettings: "served"), by its
    `kind`. Imports are lazy: importing transforms.engines loads neither vLLM nor the HTTP client."""
    kind = settings.kind
    if kind == "served":
        from transforms.engines.served import OpenAIEngine

        return OpenAIEngine(settings)
    if kind == "machine":
        from transforms.engines.machine import RemoteEngine

        return RemoteEngine(settings)
    if kind == "local":
        from transforms.engines.local import Engine

        return Engine(settings)
    raise ValueError(f"no engine of kind {kind!r}")
