"""Peak RSS of a whole `pagemill run` with the real engine, against the number of pages.

Issue 17's figure: a CLI extraction run with the tiny test model (the real vLLM engine on this CPU),
over born-digital PDFs of distinct pages, at two sizes; each run in its own process, so its peak RSS
(the largest process of the run: the Beam worker, which holds the in-process engine) is that run's.
Prints peak RSS at each size and the growth per page between them; the main branch before streaming
grew ~3.6 MiB a page (2,492 MiB at 60 pages, 3,724 MiB at 400). Asserts nothing.

A run's processes are followed through /proc (this process is their subreaper, so the machine's
engine service, started in its own session, stays in view): "largest" is the highest peak (VmHWM) of
any one process, "all" the highest sum of the processes' resident memory seen at one time (sampled
every 0.2 s; shared pages count once per process). `--workers 1` runs the engine in the run's own
process, as main did; the default (one worker a core) feeds one engine service from every worker.

    .venv/bin/python benchmarks/bench_memory.py                 # 60 and 400 pages
    .venv/bin/python benchmarks/bench_memory.py --sizes 60 200 --model .cache/test-model --workers 1
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

PAGES_PER_PDF = 20


def make_inputs(pages: int, folder: Path) -> None:
    from tests.support import docmaker

    folder.mkdir(parents=True)
    for i in range(0, pages, PAGES_PER_PDF):  # every page its own text: its own cache key
        n = min(PAGES_PER_PDF, pages - i)
        (folder / f"report-{i:05d}.pdf").write_bytes(docmaker.multipage_pdf(n, title=f"Report {i}"))


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def memory_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of one process in KiB; zeros once it is gone."""
    rss = hwm = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith("VmHWM:"):
                    hwm = int(line.split()[1])
    except OSError:
        pass
    return rss, hwm


def tree_memory_kib(root: int) -> tuple[list[int], int, int]:
    """The processes below `root`, their summed RSS now and the largest one's peak RSS (KiB)."""
    pids = [p for p in descendants(root) if p != root]
    sizes = [memory_kib(p) for p in pids]
    return pids, sum(r for r, _ in sizes), max([0] + [h for _, h in sizes])


def reap_children(run_pid: int, code: int | None) -> int | None:
    """Reap every finished child (orphans of a subreaper land here too); the run's exit code once it is reaped."""
    try:
        while True:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if not pid:
                break
            if pid == run_pid:
                code = os.waitstatus_to_exitcode(status)
    except ChildProcessError:
        pass
    return code


def one_run(pages: int, model: str, root: Path, workers: int | None) -> tuple[float, float, float]:
    """(largest process's peak RSS, the run's peak summed RSS, both MiB; wall seconds) of one run."""
    inputs, output = root / f"in-{pages}", root / f"out-{pages}"
    make_inputs(pages, inputs)
    cmd = [sys.executable, "-m", "pipelines.cli", "run", "--input", str(inputs), "--output", str(output),
           "--model", model, "--schema", "invoice", "--max-tokens", "64", "--max-attempts", "1",
           "--kv-cache-gib", "0.25", "--progress-every-s", "0", "--hints", "text_layer"]
    cmd += ["--workers", str(workers)] if workers is not None else []
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
        largest = total = 0
        code: int | None = None  # the run's exit status, taken where it is reaped
        me = os.getpid()
        while True:
            pids, tree_rss, tree_hwm = tree_memory_kib(me)
            if not pids:
                break
            total, largest = max(total, tree_rss), max(largest, tree_hwm)
            if code is not None:  # the run is over; what it left (an idle engine service) is stopped
                for p in pids:
                    if p != proc.pid:
                        try:
                            os.kill(p, 15)
                        except OSError:
                            pass
            code = reap_children(proc.pid, code)
            time.sleep(0.2)
        wall = time.perf_counter() - t0
        if code != 0:
            err.seek(0)
            raise SystemExit(f"run of {pages} pages failed:\n{err.read().decode(errors='replace')[-2000:]}")
    return largest / 1024, total / 1024, wall


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--sizes", type=int, nargs=2, default=[60, 400])
    p.add_argument("--model", default=None, help="model folder (default: a tiny test model built here)")
    p.add_argument("--workers", type=int, default=None, help="pagemill run --workers (default: its own default)")
    a = p.parse_args(argv)
    from benchmarks.bench_render import become_subreaper

    become_subreaper()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = a.model
        if model is None:
            from pipelines.tiny_models import make_test_model

            model = str(make_test_model(root / "tiny-model"))
        figures = [(n, *one_run(n, model, root, a.workers)) for n in a.sizes]
    for n, largest, total, wall in figures:
        print(f"{n:5d} pages: peak RSS largest process {largest:7.0f} MiB, all processes {total:7.0f} MiB, "
              f"{wall:6.1f} s, {n / wall:5.2f} pages/s")
    (n0, l0, t0, _), (n1, l1, t1, _) = figures
    print(f"growth: {(l1 - l0) / (n1 - n0):.3f} MiB a page (largest process), {(t1 - t0) / (n1 - n0):.3f} (all) "
          f"between {n0} and {n1} pages (main before streaming: ~3.6 MiB a page; target <= 0.3)")


if __name__ == "__main__":
    main()
