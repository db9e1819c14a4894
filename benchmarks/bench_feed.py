"""Feed efficiency: the whole pipeline feeding a simulated engine of fixed capacity.

The engine is transforms.engines.simulated.SimulatedEngine: C slots (continuous batching), S seconds a page,
no CPU use, so its capacity is C/S pages/s and everything else is the pipeline (listing, intake,
rendering, safety gate, hints/OCR, the extraction stage's lookups and feed, writing). For each kind of
page (born-digital text PDFs; scanned PNGs, which are OCR'd) and each size it runs, each in a fresh
subprocess (so peak RSS is that run's):

  1. a baseline with an instant engine (S = 0): the CPU stages' own rate, R pages/s;
  2. the capacity run: C slots, S chosen so that capacity = --load x R (below the CPU rate), and prints
     feed efficiency = achieved pages/s / capacity, time to the first result (from the run's start), the
     share of pages rendered by then, and peak RSS.
Rates are taken from the first page leaving the CPU stages, so that the fixed start-up of a run
(Beam, the NSFW classifier) does not count: R = pages / (last rendered - first rendered) and
achieved = pages / (last result - first rendered). A perfectly fed engine still needs S seconds for the
last page after it arrives, so small runs cannot reach 1.0: use hundreds of pages.

Prints figures; asserts nothing about time. Timings on a shared machine are noisy.

    .venv/bin/python benchmarks/bench_feed.py                       # 500 and 2,000 pages of each kind
    .venv/bin/python benchmarks/bench_feed.py --sizes 40 --kinds digital scanned --json
"""
from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

PAGES_PER_PDF = 50


def make_inputs(kind: str, pages: int, folder: Path) -> None:
    from tests.support import docmaker

    folder.mkdir(parents=True)
    if kind == "digital":  # distinct text PDFs of PAGES_PER_PDF pages: every page its own cache key
        for i in range(0, pages, PAGES_PER_PDF):
            n = min(PAGES_PER_PDF, pages - i)
            (folder / f"report-{i:05d}.pdf").write_bytes(docmaker.multipage_pdf(n, title=f"Report {i}"))
    else:  # one scanned receipt per file, each different
        for seed in range(pages):
            (folder / f"scan-{seed:05d}.png").write_bytes(docmaker.scanned_png(seed))


def one_run(kind: str, pages: int, slots: int, seconds: float) -> dict[str, Any]:
    """One pipeline run in this process; its figures from the written `pages` table."""
    import apache_beam as beam

    from pipelines.config.options import PagemillOptions
    from pipelines.run.graph import build_pipeline
    from pipelines.run.settings import run_settings
    from pipelines.tables import sql
    from transforms.engines.simulated import simulated

    with tempfile.TemporaryDirectory(prefix="bench-feed-") as tmp:
        inputs, output = Path(tmp) / "in", Path(tmp) / "out"
        make_inputs(kind, pages, inputs)
        options = PagemillOptions(["--input", str(inputs), "--output", str(output), "--run-id", "feed",
                                   "--schema", "page_text", "--model", "simulated", "--progress-every-s", "0",
                                   "--max-num-seqs", str(slots)])
        o = options.view_as(PagemillOptions)
        o.run_id = "feed"
        started = dt.datetime.now(dt.UTC)
        t0 = time.perf_counter()
        with beam.Pipeline(options=options) as p:
            build_pipeline(p, run_settings(o), {"run_id": "feed", "tenant": o.tenant, "created_at": started},
                           engine_factory=functools.partial(simulated, slots=slots, seconds=seconds))
        wall = time.perf_counter() - t0
        columns, values = sql.query(str(output), "SELECT rendered_at, extracted_at, status FROM pages")
    rows = [dict(zip(columns, v, strict=True)) for v in values]
    done = [r for r in rows if r["extracted_at"] is not None]
    first = min(r["extracted_at"] for r in done)
    last = max(r["extracted_at"] for r in done)
    rendered = [r["rendered_at"] for r in rows if r["rendered_at"] is not None]
    return {"kind": kind, "pages": len(rows), "extracted": len(done), "slots": slots, "seconds": seconds,
            "wall_s": round(wall, 2), "render_window_s": round((max(rendered) - min(rendered)).total_seconds(), 2),
            "window_s": round((last - min(rendered)).total_seconds(), 2),
            "first_result_s": round((first - started).total_seconds(), 2),
            "rendered_at_first_result": sum(1 for r in rows if r["rendered_at"] and r["rendered_at"] <= first),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def in_subprocess(kind: str, pages: int, slots: int, seconds: float) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--one", kind, str(pages), str(slots), str(seconds)]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:
        raise SystemExit(f"run failed ({kind}, {pages}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def measure(kind: str, pages: int, slots: int, load: float) -> dict[str, Any]:
    base = in_subprocess(kind, pages, slots, 0.0)
    cpu_rate = base["pages"] / base["render_window_s"]
    seconds = slots / (load * cpu_rate)  # capacity C/S = load x the CPU stages' rate
    run = in_subprocess(kind, pages, slots, round(seconds, 4))
    capacity = slots / run["seconds"]
    achieved = run["pages"] / run["window_s"]
    return {**run, "cpu_stage_pages_per_s": round(cpu_rate, 3), "baseline_rss_mib": base["peak_rss_mib"],
            "capacity_pages_per_s": round(capacity, 3), "achieved_pages_per_s": round(achieved, 3),
            "feed_efficiency": round(achieved / capacity, 3),
            # A perfect feed still waits S for the last page: the best this size can show.
            "best_efficiency": round((run["pages"] / capacity) / (run["pages"] / capacity + run["seconds"]), 3),
            "rendered_share_at_first_result": round(run["rendered_at_first_result"] / run["pages"], 3)}


def report(r: dict[str, Any]) -> str:
    return (f"{r['kind']:8s} {r['pages']:6d} pages | CPU stages {r['cpu_stage_pages_per_s']:7.2f} p/s | "
            f"engine {r['slots']} slots x {r['seconds']:.3f} s = {r['capacity_pages_per_s']:6.2f} p/s | "
            f"achieved {r['achieved_pages_per_s']:6.2f} p/s, feed efficiency {r['feed_efficiency']:.2f} "
            f"(at best {r['best_efficiency']:.2f}) | "
            f"first result {r['first_result_s']:6.1f} s ({100 * r['rendered_share_at_first_result']:.1f}% rendered) | "
            f"peak RSS {r['peak_rss_mib']:7.1f} MiB (instant engine {r['baseline_rss_mib']:.1f})")


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[500, 2000])
    p.add_argument("--kinds", nargs="+", default=["digital", "scanned"], choices=["digital", "scanned"])
    p.add_argument("--slots", type=int, default=16, help="the simulated engine's concurrent sequences (C)")
    p.add_argument("--load", type=float, default=0.8,
                   help="engine capacity as a share of the CPU stages' measured rate (below 1: the engine "
                        "is the bottleneck, and a good feed keeps it busy)")
    p.add_argument("--json", action="store_true", help="end with one JSON line of every figure")
    p.add_argument("--one", nargs=4, metavar=("KIND", "PAGES", "SLOTS", "SECONDS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        kind, pages, slots, seconds = args.one
        print(json.dumps(one_run(kind, int(pages), int(slots), float(seconds))))
        return []
    print("pagemill feed benchmark: the pipeline feeding a simulated engine of fixed capacity "
          f"(load {args.load} of the CPU stages' rate)")
    results = []
    for kind in args.kinds:
        for pages in args.sizes:
            results.append(measure(kind, pages, args.slots, args.load))
            print(report(results[-1]), flush=True)
    for kind in args.kinds:
        mine = [r for r in results if r["kind"] == kind]
        if len(mine) > 1:
            low, high = mine[0], mine[-1]
            print(f"{kind}: peak RSS {low['peak_rss_mib']:.0f} MiB at {low['pages']} pages, {high['peak_rss_mib']:.0f} "
                  f"MiB at {high['pages']} ({100 * (high['peak_rss_mib'] / low['peak_rss_mib'] - 1):+.1f}%)")
    if args.json:
        print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
