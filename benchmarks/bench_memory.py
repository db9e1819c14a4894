"""Peak RSS of a whole `pagemill run` with the real engine, against the number of pages.

Issue 17's figure: a CLI extraction run with the tiny test model (the real vLLM engine on this CPU),
over born-digital PDFs of distinct pages, at two sizes; each run in its own process, so its peak RSS
(the largest process of the run: the Beam worker, which holds the in-process engine) is that run's.
Prints peak RSS at each size and the growth per page between them; the main branch before streaming
grew ~3.6 MiB a page (2,492 MiB at 60 pages, 3,724 MiB at 400). Asserts nothing.

    .venv/bin/python benchmarks/bench_memory.py                 # 60 and 400 pages
    .venv/bin/python benchmarks/bench_memory.py --sizes 60 200 --model .cache/test-model
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
    from tests import docmaker

    folder.mkdir(parents=True)
    for i in range(0, pages, PAGES_PER_PDF):  # every page its own text: its own cache key
        n = min(PAGES_PER_PDF, pages - i)
        (folder / f"report-{i:05d}.pdf").write_bytes(docmaker.multipage_pdf(n, title=f"Report {i}"))


def one_run(pages: int, model: str, root: Path) -> tuple[float, float]:
    """(peak RSS in MiB, wall seconds) of one `pagemill run` over `pages` pages."""
    inputs, output = root / f"in-{pages}", root / f"out-{pages}"
    make_inputs(pages, inputs)
    cmd = [sys.executable, "-m", "pipelines.cli", "run", "--input", str(inputs), "--output", str(output),
           "--model", model, "--schema", "invoice", "--max-tokens", "64", "--max-attempts", "1",
           "--kv-cache-gib", "0.25", "--progress-every-s", "0", "--hints", "text_layer"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"run of {pages} pages failed:\n{err[-2000:]}")
    return usage.ru_maxrss / 1024, wall  # Linux reports KiB


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--sizes", type=int, nargs=2, default=[60, 400])
    p.add_argument("--model", default=None, help="model folder (default: a tiny test model built here)")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = a.model
        if model is None:
            from pipelines.test_model import make_test_model

            model = str(make_test_model(root / "tiny-model"))
        figures = [(n, *one_run(n, model, root)) for n in a.sizes]
    for n, rss, wall in figures:
        print(f"{n:5d} pages: peak RSS {rss:7.0f} MiB, {wall:6.1f} s, {n / wall:5.2f} pages/s")
    (n0, r0, _), (n1, r1, _) = figures
    print(f"growth: {(r1 - r0) / (n1 - n0):.3f} MiB a page between {n0} and {n1} pages "
          f"(main before streaming: ~3.6 MiB a page; target <= 0.3)")


if __name__ == "__main__":
    main()
