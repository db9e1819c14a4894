"""Listing + result-cache check: `pagemill run` over N objects that an earlier run already extracted.

Makes N small distinct PNGs (one different pixel each, so every sha256 differs) in a temp folder, writes a
synthetic earlier run under OUTPUT/pages/tenant=default/run_id=seed/part-0.parquet (schemas.tables.PAGES,
one `ok` row per file: page 0, tenant `default`, the config key that the timed run computes), then times
  (a) the listing alone: apache_beam FileSystems.match over the folder, as the pipeline's ListObjects globs it;
  (b) `pagemill run --input DIR --output OUTPUT --model M --schema invoice --run-id bench` end to end in a
      subprocess (interpreter start and imports included): listing, intake (read, sha256, sniff, open),
      dedup, the document-level cache join, and writing the three tables and the manifest.
Every document must come out `cached` with no model call: the run's manifest is checked (outcomes.cached == N,
totals.model_calls == 0, every page `cached`), and the subprocess reports whether vLLM was ever imported (the
engine starts lazily; a start would import it). M is a model that does not exist, so an engine start would
also fail its pages. Prints seconds, objects/s, the run's peak RSS, and the time extrapolated linearly to
10,000 and 1,000,000 objects. Asserts nothing about time.

    .venv/bin/python benchmarks/bench_cache.py [--objects 10000] [--keep] [--beam-arg=FLAG]
"""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from apache_beam.io.filesystems import FileSystems  # noqa: E402
from PIL import Image  # noqa: E402

from pipelines.config.options import PagemillOptions  # noqa: E402
from pipelines.run.settings import run_settings  # noqa: E402
from schemas import tables  # noqa: E402
from schemas.layout import partition  # noqa: E402
from transforms.store.write import write_rows  # noqa: E402

# A hub-id-shaped name that does not exist. A missing *local* path ("/nonexistent/model") is refused by the
# CLI's pre-flight (pipelines/run/option_checks.py) before the pipeline starts, even when every document is
# cached; a name shaped like org/name passes pre-flight and would only fail if the engine ever started.
MODEL = "nonexistent-org/nonexistent-model"
SCHEMA = "invoice"
SIDE = 8  # px: PNGs of a few dozen bytes
# Runs `pagemill run` exactly as the console script does, then says whether vLLM was imported.
WRAPPER = """
import logging, sys
from pipelines import cli
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
rc = cli.main(sys.argv[1:])
print("BENCH_VLLM_IMPORTED=" + str("vllm" in sys.modules), file=sys.stderr)
sys.exit(rc)
"""


def make_files(folder: Path, n: int) -> list[bytes]:
    """n distinct SIDE x SIDE PNGs; file i has pixel (0, 0) set to i in base 256 (distinct up to 16.7 M)."""
    folder.mkdir(parents=True, exist_ok=True)
    contents = []
    for i in range(n):
        img = Image.new("RGB", (SIDE, SIDE), (255, 255, 255))
        img.putpixel((0, 0), (i % 256, (i // 256) % 256, (i // 65536) % 256))
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        data = buf.getvalue()
        # 1,000 files per subfolder, as an object store's prefixes would hold them.
        path = folder / f"{i // 1000:04d}" / f"doc-{i:07d}.png"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        contents.append(data)
    return contents


def config_key(flags: list[str]) -> str:
    """The config key that `pagemill run` computes from the same flags."""
    return run_settings(PagemillOptions(flags).view_as(PagemillOptions)).extract.config_key


def write_earlier_run(output: Path, contents: list[bytes], config: str) -> str:
    created = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    rows = []
    for data in contents:
        sha = hashlib.sha256(data).hexdigest()
        rows.append({
            "run_id": "seed", "tenant": "default", "doc_sha256": sha, "source_uri": f"seed://{sha}",
            "page_index": 0, "page_hash": sha, "cache_key": f"seed-{sha}", "config_key": config, "status": "ok",
            "width": SIDE, "height": SIDE, "schema_id": SCHEMA, "schema_hash": "seed", "model": MODEL,
            "model_revision": None, "extraction": "{}", "validation_errors": [], "flags": [],
            "hint_source": "none", "flag_detail": [], "created_at": created,
        })
    return write_rows(partition(str(output), "pages", "default", "seed"), tables.PAGES, rows, name="part-0.parquet")


def time_listing(folder: Path, n: int) -> float:
    t0 = time.perf_counter()
    found = FileSystems.match([str(folder) + "/**"])[0].metadata_list
    seconds = time.perf_counter() - t0
    if len(found) != n:
        sys.exit(f"listing found {len(found)} objects, expected {n}")
    return seconds


def time_run(folder: Path, output: Path, n: int, flags: list[str], beam_args: list[str]) -> dict[str, float]:
    argv = [sys.executable, "-c", WRAPPER, "run", "--input", str(folder), "--output", str(output), *flags,
            "--run-id", "bench", "--progress-every-s", "0", *beam_args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # never reach for a hub, whatever happens
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False, env=env)
    wall = time.perf_counter() - t0
    peak_rss_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # Linux: KiB; the only child
    if proc.returncode != 0:
        sys.exit(f"pagemill run failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}")
    manifest = json.loads((output / "runs" / "tenant=default" / "bench.json").read_text())
    problems = []
    if manifest["outcomes"] != {"cached": n}:
        problems.append(f"outcomes {manifest['outcomes']}, expected cached {n}")
    if manifest["pages"] != {"cached": n} or manifest["routes"] != {"cache": n}:
        problems.append(f"pages {manifest['pages']}, routes {manifest['routes']}")
    if manifest["totals"]["model_calls"] != 0:
        problems.append(f"model_calls {manifest['totals']['model_calls']}")
    if "BENCH_VLLM_IMPORTED=False" not in proc.stderr:
        problems.append("vLLM was imported: something started (or reached for) the engine")
    if problems:
        sys.exit("the run did not come out all cached:\n  " + "\n  ".join(problems) + "\n" + proc.stderr[-4000:])
    return {"wall_s": wall, "pipeline_s": float(manifest["wall_seconds"]), "peak_rss_mib": peak_rss_mib}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=10_000, help="how many objects (default 10,000)")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder and print where it is")
    parser.add_argument("--beam-arg", action="append", default=[], help="a Beam flag for the run; repeatable")
    args = parser.parse_args()
    n = args.objects
    flags = ["--model", MODEL, "--schema", SCHEMA]
    work = Path(tempfile.mkdtemp(prefix="bench-cache-"))
    try:
        folder, output = work / "in", work / "out"
        t0 = time.perf_counter()
        contents = make_files(folder, n)
        if len({hashlib.sha256(c).digest() for c in contents}) != n:
            sys.exit("the generated files are not all distinct")
        write_earlier_run(output, contents, config_key(flags))
        print(f"setup: {n:,} PNGs ({sum(map(len, contents)) / n:.0f} bytes each) and the seed run in "
              f"{time.perf_counter() - t0:.1f} s  [{work}]")
        listing = time_listing(folder, n)
        run = time_run(folder, output, n, flags, args.beam_arg)
        print(f"checked: {n:,} documents cached, 0 model calls, vLLM never imported")
        print(f"{'stage':<44} {'seconds':>9} {'objects/s':>10} {'per 10,000':>11} {'per 1,000,000':>14}")
        for name, seconds in (("(a) listing (FileSystems.match)", listing),
                              ("(b) pagemill run, whole subprocess", run["wall_s"]),
                              ("    of which start to manifest (manifest)", run["pipeline_s"])):
            per = seconds / n
            print(f"{name:<44} {seconds:>9.2f} {n / max(seconds, 1e-9):>10,.0f} {per * 1e4:>10.1f}s "
                  f"{per * 1e6 / 60:>11.1f} min")
        print(f"peak RSS of the run: {run['peak_rss_mib']:,.0f} MiB")
        print(f"cores: {os.cpu_count()}, load average: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    finally:
        if args.keep:
            print(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
