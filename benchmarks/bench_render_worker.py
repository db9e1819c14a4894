"""Cost of the render worker process (--document-timeout-s / --page-timeout-s on, the default) against
rendering in the Beam worker itself (both 0): a render-only run of the same folder, alternated, each
configuration `--repeats` times. Prints pages/s of each run and CPU seconds a page (the run's process and
every process under it: on a shared machine the steadier figure), and the ratio of the medians; asserts
nothing.

    .venv/bin/python benchmarks/bench_render_worker.py [--input ../shared/corpus/extraction_gt] [--repeats 2]
        [--beam-arg=--direct_running_mode=multi_processing]
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIGS = {"worker process (default)": [], "in process (timeouts 0)": ["--document-timeout-s=0",
                                                                        "--page-timeout-s=0"]}


def run_once(inputs: str, extra: list[str]) -> tuple[float, float, int]:
    with tempfile.TemporaryDirectory() as out:
        args = [sys.executable, "-m", "pipelines.cli", "run", "--input", inputs, "--output", out, "--run-id", "b",
                "--extract", "false", "--hints", "none", "--nsfw-classifier", "none", "--progress-every-s", "0",
                *extra]
        start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, check=False)
        wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if proc.returncode not in (0, 1):
            raise SystemExit(proc.stderr[-2000:])
        pages = json.loads((Path(out) / "runs" / "tenant=default" / "b.json").read_text())["totals"]["pages"]
    return wall, cpu, pages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--input", default=str(REPO.parent / "shared" / "corpus" / "extraction_gt"))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--beam-arg", action="append", default=[])
    args = parser.parse_args()
    rates: dict[str, list[float]] = {name: [] for name in CONFIGS}
    cpus: dict[str, list[float]] = {name: [] for name in CONFIGS}
    for i in range(args.repeats):
        for name, flags in CONFIGS.items():
            wall, cpu, pages = run_once(args.input, [*flags, *args.beam_arg])
            rates[name].append(pages / wall)
            cpus[name].append(cpu / pages)
            print(f"run {i + 1} {name:26s} {pages} pages in {wall:6.1f} s = {pages / wall:6.2f} pages/s, "
                  f"{1000 * cpu / pages:5.0f} CPU ms/page", flush=True)
    base = "in process (timeouts 0)"
    for name in CONFIGS:
        rate, cpu = statistics.median(rates[name]), statistics.median(cpus[name])
        print(f"median {name:26s} {rate:6.2f} pages/s ({rate / statistics.median(rates[base]):.2f}x), "
              f"{1000 * cpu:5.0f} CPU ms/page ({cpu / statistics.median(cpus[base]):.2f}x)")


if __name__ == "__main__":
    main()
