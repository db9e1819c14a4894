"""Render-only inputs and flags of the wave tests: RENDER_ONLY, png, make_inputs.
Moved from tests/pipelines/test_waves.py, which other test files imported."""
from __future__ import annotations

import io
import json
from pathlib import Path

from PIL import Image

RENDER_ONLY = ["--extract", "false", "--nsfw-classifier", "none", "--hints", "none", "--workers", "1"]


def png(i: int) -> bytes:
    """A distinct one-page PNG: its own bytes, its own page hash."""
    image = Image.new("L", (24, 24), 255)
    for bit in range(16):
        image.putpixel((bit, 0), 0 if i >> bit & 1 else 255)
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def make_inputs(folder: Path, n: int, copies: dict[str, int] | None = None) -> list[str]:
    folder.mkdir(parents=True)
    for i in range(n):
        (folder / f"p{i:04d}.png").write_bytes(png(i))
    for name, of in (copies or {}).items():
        (folder / name).write_bytes(png(of))
    return sorted(str(p) for p in folder.iterdir())


def manifest(output: Path, run_id: str) -> dict:
    """The run's manifest, wherever the layout puts it under `runs/`."""
    (path,) = (output / "runs").rglob(f"{run_id}.json")
    return json.loads(path.read_text())
