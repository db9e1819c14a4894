"""What `--catalog` costs a backfill: the Iceberg commit of each wave (transforms/store/commits.py: the wave's
duplicate-key check and compaction, then one snapshot per table) against the wave's wall time, at 5,000 objects.

Render-only runs (`--extract false --nsfw-classifier none --hints none`) over N distinct one-page PNGs (made as
benchmarks/bench_scale.py makes them), each `pagemill run` in its own process: once with `--catalog sqlite`
(the embedded catalog) and, as the baseline in the same session, once without (Parquet only, main's path).
Prints, per wave, its wall time and its commit's, the commit's share, and both runs' wall times. Asserts
nothing.

    .venv/bin/python benchmarks/bench_catalog.py                    # 5,000 objects, waves of 1,000
    .venv/bin/python benchmarks/bench_catalog.py --objects 2000 --wave-objects 500
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.bench_scale import RENDER_ONLY, make_inputs  # noqa: E402 - after the path is set


def run(inputs: Path, output: Path, wave_objects: int, catalog: bool) -> tuple[float, dict]:
    """One run's wall time and manifest."""
    argv = [sys.executable, "-m", "pipelines.cli", "run", "--input", str(inputs), "--output", str(output),
            "--run-id", "bench", "--wave-objects", str(wave_objects), "--progress-every-s", "0", *RENDER_ONLY,
            *(["--catalog", "sqlite"] if catalog else [])]
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return wall, json.loads((output / "runs" / "tenant=default" / "bench.json").read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=5000)
    parser.add_argument("--wave-objects", type=int, default=1000)
    parser.add_argument("--pairs", type=int, default=2, help="runs of each kind, alternated (a busy machine is noisy)")
    args = parser.parse_args(argv)
    walls: dict[bool, list[float]] = {True: [], False: []}
    manifest: dict = {}
    with tempfile.TemporaryDirectory(prefix="pagemill-bench-catalog-") as tmp:
        work = Path(tmp)
        make_inputs(work / "pool", work / "in", args.objects)
        for i in range(args.pairs):
            for catalog in (False, True):
                wall, found = run(work / "in", work / f"out-{i}-{catalog}", args.wave_objects, catalog)
                walls[catalog].append(wall)
                if catalog:
                    manifest = found  # the last --catalog run's per-wave figures are printed
    waves = manifest["waves"]["seconds"]
    commits = manifest["catalog"]["commit_seconds"]
    print(f"bench_catalog: {args.objects} one-page PNGs, render-only, --wave-objects {args.wave_objects}, "
          f"{len(waves)} waves")
    print(f"{'wave':>5} {'wave s':>8} {'commit s':>9} {'share':>6}")
    for wave in sorted(waves, key=int):
        share = commits.get(wave, 0.0) / waves[wave] if waves[wave] else 0.0
        print(f"{wave:>5} {waves[wave]:>8.2f} {commits.get(wave, 0.0):>9.3f} {share:>6.1%}")
    total_commit, total_waves = sum(commits.values()), sum(waves.values())
    print(f"commits {total_commit:.2f} s of {total_waves:.2f} s in waves ({total_commit / total_waves:.1%}); "
          f"mean {total_commit / max(1, len(commits)):.3f} s a wave")
    with_catalog, base = min(walls[True]), min(walls[False])
    print(f"run wall, best of {args.pairs}: --catalog sqlite {with_catalog:.1f} s; Parquet only (baseline) "
          f"{base:.1f} s ({(with_catalog - base) / base:+.1%}); all: {walls[True]} / {walls[False]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
