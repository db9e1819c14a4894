"""Whole pipelines and the command line. `pipelines.read(output, schema)` is a typed view as an Arrow
table for notebooks (pipelines/tables/export.py); it is imported on first use, so importing a submodule of
`pipelines` does not load DuckDB."""
from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "read":
        from pipelines.tables.export import read

        return read
    raise AttributeError(f"module 'pipelines' has no attribute {name!r}")
