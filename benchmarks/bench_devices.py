"""One engine per device: the whole pipeline feeding N simulated engines, one per device, through the machine's
engine service (transforms/engines/devices/, transforms/engines/vllm_machine/).

Each device's engine is transforms.engines.simulated.SimulatedEngine in its own service process: C slots of
continuous batching, S seconds a page from when it gets a slot, no CPU of its own, so a device's capacity is C/S
pages/s. The pipeline runs on the DirectRunner with two worker processes (both cores); every worker feeds every
engine, a page to the one with the least work in flight. Runs, each in a fresh subprocess:

  1. a baseline with one instant engine (S = 0): the CPU stages' rate R = pages / (last rendered - first rendered);
  2. for each device count N of --devices: N engines of capacity c = --load x R / max(N) each (so the largest
     count stays below the CPU stages' rate: the devices are the bottleneck), over --pages-per-device x N pages
     (every run lasts about as long, so the last page's S weighs the same in each).

Printed per count: pages/s = pages / (last result - first page rendered) (the run's fixed start-up left out), its
ratio to one device, and each engine's busy fraction (its answers' busy seconds over the seconds from its first
request to its last answer, from the engine service's figures). The last stdout line is JSON:
{"pages_per_s": {"1": x, ...}, "busy": {"8": [...]}, ...}. Prints figures; asserts nothing about time.

    nice .venv/bin/python benchmarks/bench_devices.py --devices 1,2,4,8 --json
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.bench_memory import make_inputs  # noqa: E402 - after the path is set


def one_run(devices: int, pages: int, slots: int, seconds: float, workers: int) -> dict[str, Any]:
    """One pipeline run in this process (its workers are subprocesses); figures from the written `pages` table
    and the engines' own (stats.json of each device's service)."""
    import apache_beam as beam

    from pipelines.config.engine import vllm_settings
    from pipelines.config.options import PagemillOptions
    from pipelines.run.graph import build_pipeline
    from pipelines.run.settings import run_settings
    from pipelines.tables import sql
    from transforms.engines.simulated import SimulatedSettings
    from transforms.engines.vllm_machine.settings import VllmMachineSettings
    from transforms.engines.vllm_machine.stats import engine_figures

    with tempfile.TemporaryDirectory(prefix="bench-devices-") as tmp:
        inputs, output, service = Path(tmp) / "in", Path(tmp) / "out", Path(tmp) / "engine"
        make_inputs(pages, inputs)
        service.mkdir(mode=0o700)
        options = PagemillOptions(["--input", str(inputs), "--output", str(output), "--run-id", "devices",
                                   "--schema", "page_text", "--model", "simulated", "--progress-every-s", "0",
                                   "--nsfw-classifier", "none", "--hints", "text_layer", "--max-side", "800",
                                   # one worker: in this process (the smoke test's cheap run)
                                   "--direct_running_mode", "multi_processing" if workers > 1 else "in_memory",
                                   "--direct_num_workers", str(workers)])
        o = options.view_as(PagemillOptions)
        o.run_id = "devices"
        engine = VllmMachineSettings(vllm=vllm_settings(o), service_dir=str(service / "engines"),
                                     devices=str(devices), simulated=SimulatedSettings(slots=slots, seconds=seconds))
        started = dt.datetime.now(dt.UTC)
        t0 = time.perf_counter()
        with beam.Pipeline(options=options) as p:
            build_pipeline(p, replace(run_settings(o), engine=engine),
                           {"run_id": "devices", "tenant": o.tenant, "created_at": started})
        wall = time.perf_counter() - t0
        columns, values = sql.query(str(output), "SELECT rendered_at, extracted_at, status FROM pages")
        engines = engine_figures(service / "engines")
    rows = [dict(zip(columns, v, strict=True)) for v in values]
    done = [r for r in rows if r["extracted_at"] is not None]
    rendered = [r["rendered_at"] for r in rows if r["rendered_at"] is not None]
    return {"devices": devices, "pages": len(rows), "ok": sum(1 for r in rows if r["status"] == "ok"),
            "slots": slots, "seconds": seconds, "wall_s": round(wall, 2),
            "render_window_s": round((max(rendered) - min(rendered)).total_seconds(), 2),
            "window_s": round((max(r["extracted_at"] for r in done) - min(rendered)).total_seconds(), 2),
            "engines": engines}


def in_subprocess(devices: int, pages: int, slots: int, seconds: float, workers: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--one", str(devices), str(pages), str(slots), str(seconds), str(workers)]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:
        raise SystemExit(f"run failed ({devices} devices, {pages} pages):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--devices", default="1,2,4,8", help="device counts to run, comma-separated")
    p.add_argument("--pages-per-device", type=int, default=40, help="pages of a run = this x its device count")
    p.add_argument("--slots", type=int, default=2, help="each simulated engine's concurrent sequences (C)")
    p.add_argument("--load", type=float, default=0.6,
                   help="the largest count's capacity as a share of the CPU stages' measured rate")
    p.add_argument("--workers", type=int, default=2, help="the DirectRunner's worker processes")
    p.add_argument("--baseline-pages", type=int, default=160, help="pages of the instant-engine run")
    p.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    p.add_argument("--one", nargs=5, metavar=("DEVICES", "PAGES", "SLOTS", "SECONDS", "WORKERS"),
                   help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        devices, pages, slots, seconds, workers = args.one
        print(json.dumps(one_run(int(devices), int(pages), int(slots), float(seconds), int(workers))))
        return {}
    counts = [int(c) for c in args.devices.split(",")]
    base = in_subprocess(1, args.baseline_pages, args.slots, 0.0, args.workers)
    cpu_rate = base["pages"] / base["render_window_s"]
    per_device = args.load * cpu_rate / max(counts)  # pages/s of one device: c = C/S
    seconds = round(args.slots / per_device, 4)
    print(f"pagemill devices benchmark: CPU stages {cpu_rate:.2f} pages/s (instant engine, {base['pages']} pages, "
          f"{args.workers} workers); each device {args.slots} slots x {seconds:.3f} s = {per_device:.3f} pages/s",
          flush=True)
    rates: dict[str, float] = {}
    busy: dict[str, list[float | None]] = {}
    runs = []
    for n in counts:
        run = in_subprocess(n, args.pages_per_device * n, args.slots, seconds, args.workers)
        rate = run["pages"] / run["window_s"]
        rates[str(n)] = round(rate, 3)
        busy[str(n)] = [e["busy_fraction"] for e in run["engines"]]
        runs.append(run)
        shown = ", ".join(f"{e['device']} {e['busy_fraction']} ({e['pages']} p)" for e in run["engines"])
        print(f"{n} device(s): {run['pages']} pages ({run['ok']} ok), {rate:.3f} pages/s = "
              f"{rate / rates[str(counts[0])] * counts[0]:.2f}x one device (capacity {n * per_device:.3f}); "
              f"busy: {shown}", flush=True)
    result = {"pages_per_s": rates, "busy": busy, "cpu_stage_pages_per_s": round(cpu_rate, 3),
              "device_pages_per_s": round(per_device, 4), "slots": args.slots, "seconds": seconds, "runs": runs}
    if args.json:
        print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
