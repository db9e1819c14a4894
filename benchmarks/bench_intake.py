"""Cost of intake's page count in a child process (--document-timeout-s on, the default) against counting in the
Beam worker itself (--document-timeout-s 0): the intake DoFn over every file of a folder, called as a runner
calls it (setup, process, teardown), alternated, each configuration `--repeats` times. Prints wall and CPU
milliseconds a document (this process and its children: the child's CPU is counted once it has exited) and the
ratio of the medians; the child's start (an interpreter importing pdfium and Pillow) is part of each run, as it
is of each DoFn instance in a pipeline. Asserts nothing.

    .venv/bin/python benchmarks/bench_intake.py [--input ../shared/corpus] [--repeats 3]
"""
from __future__ import annotations

import argparse
import logging
import resource
import statistics
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from schemas.records import ListedObject  # noqa: E402
from transforms.intake.accept import IntakeDoFn  # noqa: E402
from transforms.intake.inspection import IntakeLimits  # noqa: E402
from transforms.intake.timed import TimedIntakeDoFn  # noqa: E402

LIMITS = IntakeLimits(max_bytes=50 * 2**20, max_pages=5000, max_image_pixels=89_478_485)


def cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def run_once(dofn: IntakeDoFn, objs: list[ListedObject]) -> tuple[float, float]:
    start, before = time.perf_counter(), cpu_s()
    dofn.setup()
    for obj in objs:
        for _ in dofn.process(obj):
            pass
    dofn.teardown()  # the child exits here, so its CPU is in RUSAGE_CHILDREN below
    return time.perf_counter() - start, cpu_s() - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", default=str(REPO.parent / "shared" / "corpus"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # hostile files make Pillow warn; the child's own stderr still shows libtiff
    logging.disable(logging.ERROR)
    files = sorted(p for p in Path(args.input).rglob("*") if p.is_file() and p.stat().st_size <= LIMITS.max_bytes)
    objs = [ListedObject(uri=str(p), size=p.stat().st_size) for p in files]
    total = sum(o.size for o in objs)
    print(f"{len(objs)} files, {total / 2**20:.1f} MiB, under {args.input}")
    configs = {"in process (--document-timeout-s 0)": lambda: IntakeDoFn(LIMITS),
               "child process (default)": lambda: TimedIntakeDoFn(LIMITS, timeout_s=600)}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in configs}
    run_once(IntakeDoFn(LIMITS), objs)  # warm the page cache and the imports
    for _ in range(args.repeats):
        for name, make in configs.items():
            results[name].append(run_once(make(), objs))
    medians = {}
    for name, runs in results.items():
        walls = [w * 1000 / len(objs) for w, _ in runs]
        cpus = [c * 1000 / len(objs) for _, c in runs]
        medians[name] = (statistics.median(walls), statistics.median(cpus))
        print(f"{name:38s} wall ms/doc {' '.join(f'{w:.2f}' for w in walls):24s} "
              f"CPU ms/doc {' '.join(f'{c:.2f}' for c in cpus)}")
    (base_wall, base_cpu), (child_wall, child_cpu) = medians.values()
    print(f"child / in process (medians): wall {child_wall / base_wall:.2f}x, CPU {child_cpu / base_cpu:.2f}x")


if __name__ == "__main__":
    main()
