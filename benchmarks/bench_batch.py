"""A run through hosted batches at scale (issue 44's figures): N one-page documents through `pagemill run --engine
openai-batch --batch-max-requests M` against the fake Batch API (tests/support/fake_batch_server.py, a real HTTP
server on the loopback; no model). It prints, beside a render-only run of the same inputs (the baseline: the
pipeline without the model), each invocation's exit code and wall time and the figures the issue asks for:
batches made, exit 75 while they work, a second invocation that submits nothing, a `--wait` launcher killed -9
mid-poll, one batch expired with half its results (kept, the rest resubmitted once), every page `ok` in one row,
each custom_id received once (the resubmitted ones twice), and the ledger's cost beside the billed tokens at the
batch price.

    .venv/bin/python benchmarks/bench_batch.py [--pages 2000] [--max-requests 500]
"""
from __future__ import annotations

import argparse
import io
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipelines import cli  # noqa: E402
from tests.support.fake_batch_server import FakeBatches, batch_server  # noqa: E402
from tests.support.raw import one_row_per, raw_rows  # noqa: E402
from transforms.model.budget import load_prices  # noqa: E402

FLAGS = ["--schema", "invoice", "--model", "gpt-4o", "--api-price", "gpt-4o", "--max-tokens", "256",
         "--progress-every-s", "0", "--nsfw-classifier", "none", "--hints", "none"]


def page(i: int) -> bytes:
    """A small image of its own (no two documents alike: dedup would merge them)."""
    img = Image.new("RGB", (96, 64), (250, 250, 250))
    for bit in range(16):
        if i >> bit & 1:
            img.putpixel((4 + 5 * bit, 30), (0, 0, 0))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def timed(argv: list[str]) -> tuple[int, float]:
    t0 = time.perf_counter()
    code = cli.main(argv)
    return code, time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pages", type=int, default=2000)
    parser.add_argument("--max-requests", type=int, default=500)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-batch-"))
    inputs = base / "in"
    inputs.mkdir()
    for i in range(args.pages):
        (inputs / f"page-{i:05d}.png").write_bytes(page(i))
    code, baseline = timed(["run", "--input", str(inputs), "--output", str(base / "render"), "--run-id", "r0",
                            "--extract", "false", *FLAGS])
    print(f"baseline: render-only run of {args.pages} pages: exit {code}, {baseline:.1f} s")
    out = base / "out"
    fake = FakeBatches()
    with batch_server(fake) as url:
        argv = ["run", "--input", str(inputs), "--output", str(out), "--run-id", "b1", "--engine", "openai-batch",
                "--endpoint", url, "--batch-max-requests", str(args.max_requests), *FLAGS]
        code, wall = timed(argv)
        batches = sorted(fake.batches)
        print(f"invocation 1 (pass 1, submit): exit {code}, {wall:.1f} s; {len(batches)} batches, "
              f"{sum(fake.received.values())} requests")
        code, wall = timed(argv)
        print(f"invocation 2 (batches working): exit {code}, {wall:.1f} s; batches now {len(fake.batches)}, "
              f"requests {sum(fake.received.values())}")
        polls = fake.calls["GET v1/batches"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        child = subprocess.Popen([sys.executable, "-m", "pipelines.cli", *argv, "--wait", "--batch-poll-s", "1"],
                                 cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
        while fake.calls["GET v1/batches"] < polls + 2 * len(batches) and child.poll() is None:
            time.sleep(0.1)
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        print(f"invocation 3 (--wait, killed -9 after {fake.calls['GET v1/batches'] - polls} polls): batches now "
              f"{len(fake.batches)}, requests {sum(fake.received.values())}")
        for n, batch in enumerate(batches):
            fake.run(batch, share=0.5, status="expired") if n == 1 else fake.run(batch)
        code, wall = timed(argv)
        resubmitted = fake.working()
        print(f"invocation 4 (collect, resubmit): exit {code}, {wall:.1f} s; resubmitted "
              f"{sum(len(fake.requests(b)) for b in resubmitted)} requests in {len(resubmitted)} batches")
        for batch in resubmitted:
            fake.run(batch)
        code, wall = timed(argv)
        print(f"invocation 5 (pass 2, collect): exit {code}, {wall:.1f} s")
    times = Counter(fake.received.values())
    pages = one_row_per(raw_rows(out, "pages", "b1"), "doc_sha256", "page_index")
    ledger = one_row_per(raw_rows(out, "ledger", "b1"), "doc_sha256", "page_index")
    price = load_prices()["providers"]["gpt-4o"]
    billed = fake.billed_usd(price["input_usd_per_mtok"], price["output_usd_per_mtok"], price["batch_rate"])
    cost = sum(r["cost_usd"] for r in ledger.values())
    print(f"custom_ids received: {dict(sorted(times.items()))} (times: ids); pages {len(pages)}: "
          f"{dict(Counter(p['status'] for p in pages.values()))}")
    print(f"ledger cost ${cost:.6f}, billed tokens x batch price ${billed:.6f}: "
          f"{100 * abs(cost - billed) / billed:.4f}% apart")
    return 0


if __name__ == "__main__":
    sys.exit(main())
