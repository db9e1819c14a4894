"""A run's memory, time to first result and progress against the number of listed objects (issue 24).

Render-only runs (`--extract false --nsfw-classifier none --hints none`) over N distinct one-page PNGs in a
local folder, each `pagemill run` in its own process: wall time, peak RSS of the whole process tree (the
highest sum of the resident memory of the run's processes seen at one time, sampled every 0.2 s; this process
is their subreaper, so SDK workers and render processes stay in view), the time until the first `pages` row
is on disk (the first part file under the run's `pages` partition), and the progress lines printed before
90% of the wall time. Each size runs with waves (pagemill's default `--wave-objects`, or the one given) and,
for the `--baseline` sizes, as one pipeline over the whole listing (`--wave-objects 0`: main's behaviour)
in the same session. Asserts nothing.

    .venv/bin/python benchmarks/bench_scale.py                                   # 1,000 / 32,000 / 64,000
    .venv/bin/python benchmarks/bench_scale.py --sizes 1000 4000 --baseline 1000 --wave-objects 1000
"""
from __future__ import annotations

import argparse
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.bench_memory import reap_children, tree_memory_kib  # noqa: E402 - after the path is set
from benchmarks.bench_render import become_subreaper  # noqa: E402

RENDER_ONLY = ["--extract", "false", "--nsfw-classifier", "none", "--hints", "none"]


def png(i: int, side: int = 32) -> bytes:
    """A distinct one-page greyscale PNG (its pixels a hash of `i`), written without Pillow: 64,000 take
    seconds."""
    rows = b"".join(b"\x00" + bytes(((x + y * side + i * 31) * 2654435761 >> 24) & 0xFF for x in range(side))
                    for y in range(side))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def make_inputs(pool: Path, folder: Path, n: int) -> None:
    """A folder of the first N files of `pool` (made once, then hard-linked: 64,000 files cost seconds)."""
    pool.mkdir(parents=True, exist_ok=True)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        name = f"p{i:07d}.png"
        if not (pool / name).exists():
            (pool / name).write_bytes(png(i))
        if not (folder / name).exists():
            os.link(pool / name, folder / name)


@dataclass(frozen=True)
class Figures:
    objects: int
    wave_objects: str
    wall_s: float
    peak_tree_mib: float
    largest_mib: float
    first_row_s: float | None
    lines_before_90: int
    lines: int
    code: int


def first_part(folder: Path) -> bool:
    try:
        return any(e.name.endswith(".parquet") for e in os.scandir(folder))
    except OSError:
        return False


def one_run(inputs: Path, n: int, root: Path, wave_objects: str | None, extra: Sequence[str]) -> Figures:
    output = root / f"out-{n}-{wave_objects}"
    cmd = [sys.executable, "-m", "pipelines.cli", "run", "--input", str(inputs), "--output", str(output),
           "--run-id", "scale", "--progress-every-s", "5", *RENDER_ONLY, *extra]
    cmd += ["--wave-objects", wave_objects] if wave_objects is not None else []
    pages = output / "pages" / "tenant=default" / "run_id=scale"
    lines: list[float] = []
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO)})

    def read_progress() -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            text = raw.decode(errors="replace")
            if text.startswith("pagemill: ") and " documents, " in text and "pages/s" in text:
                lines.append(time.perf_counter() - t0)

    reader = threading.Thread(target=read_progress, daemon=True)
    reader.start()
    peak = largest = 0
    first: float | None = None
    code: int | None = None
    me = os.getpid()
    while True:
        pids, tree_rss, tree_hwm = tree_memory_kib(me)
        if not pids:
            break
        peak, largest = max(peak, tree_rss), max(largest, tree_hwm)
        if first is None and first_part(pages):
            first = time.perf_counter() - t0
        code = reap_children(proc.pid, code)
        time.sleep(0.2)
    wall = time.perf_counter() - t0
    reader.join(timeout=5)
    # The last line comes with the run's end; a line "while it works" is one before 90% of the wall time.
    before = sum(1 for t in lines if t < 0.9 * wall)
    return Figures(n, wave_objects if wave_objects is not None else "default", wall, peak / 1024, largest / 1024,
                   first, before, len(lines), code if code is not None else -1)


def show(f: Figures, base: Figures | None) -> str:
    first = f"{f.first_row_s:6.1f} s ({f.first_row_s / f.wall_s:4.0%})" if f.first_row_s is not None else "  none"
    ratio = f"  {f.peak_tree_mib / base.peak_tree_mib:4.2f}x the 1k run" if base is not None else ""
    return (f"{f.objects:7d} objects, --wave-objects {f.wave_objects:>7}: wall {f.wall_s:7.1f} s, peak RSS tree "
            f"{f.peak_tree_mib:6.0f} MiB (largest process {f.largest_mib:5.0f}), first page row {first}, "
            f"progress lines before 90% {f.lines_before_90:3d} of {f.lines:3d}, exit {f.code}{ratio}")


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 32000, 64000])
    p.add_argument("--baseline", type=int, nargs="*", default=[1000, 32000],
                   help="sizes also run as one pipeline over the whole listing (--wave-objects 0)")
    p.add_argument("--wave-objects", default=None, help="pagemill run --wave-objects (default: pagemill's)")
    p.add_argument("--beam-arg", action="append", default=[], help="an extra flag for pagemill run (repeatable)")
    p.add_argument("--keep", default=None, help="folder for the inputs and outputs (default: a temporary one)")
    a = p.parse_args(argv)
    become_subreaper()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(a.keep or tmp)
        inputs = root / "in"
        results: list[Figures] = []
        for n in sorted(set(a.sizes) | set(a.baseline)):
            make_inputs(inputs / "pool", inputs / str(n), n)
        # Waves first, then the baselines (one pipeline over the whole listing is the slow part at scale).
        runs = [(n, a.wave_objects) for n in sorted(a.sizes)] + [(n, "0") for n in sorted(a.baseline)]
        for n, mode in runs:
            results.append(one_run(inputs / str(n), n, root, mode, a.beam_arg))
            print(show(results[-1], None), flush=True)
    print("\nsummary (peak RSS against the smallest size of the same mode; targets: <= 1.25x, first row < 10%):")
    for mode in sorted({f.wave_objects for f in results}):
        runs = sorted((f for f in results if f.wave_objects == mode), key=lambda f: f.objects)
        for f in runs:
            print(show(f, runs[0] if f is not runs[0] else None))


if __name__ == "__main__":
    main()
