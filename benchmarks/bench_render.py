"""Render-stage throughput and memory: the whole pipeline (render-only, DirectRunner) against a bare loop.

Makes one N-page text PDF with docmaker (different text on every page), then
  1. runs `pagemill run --extract false` on it in a subprocess and reports wall time, pages/s, CPU time,
     the subprocess's peak RSS (getrusage of children) and the per-page stage means from its manifest;
  2. runs the same CPU stages as plain functions over the same bytes in a bare loop in this process, on one
     core, and reports each stage's CPU per page: render (transforms.pages.render.render_document: render + pixel
     hash + text layer + raster check + JPEG encode), gate (transforms.safety.gate.screen_page with the default
     classifier) and hints (transforms.hints.choose.choose_hint/apply_hint, no OCR as in a render-only run);
and prints the Beam overhead ratio (bare pages per CPU-second / pipeline pages per CPU-second), against the
bare render alone and against the bare render + gate + hints. Prints figures; asserts nothing about time.

    .venv/bin/python benchmarks/bench_render.py [--pages 400] [--slope-from 100] [--docs 1] [--repo ../main]
        [--beam-arg=--direct_running_mode=in_memory]
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import random
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from schemas.records import DocumentRecord, PageImage  # noqa: E402
from tests.support import docmaker  # noqa: E402
from transforms.hints.choose import HintSettings, apply_hint, choose_hint  # noqa: E402
from transforms.pages.render import RenderSettings, render_document  # noqa: E402
from transforms.safety.gate import SafetyConfig, holds_picture, load_checks, screen_page  # noqa: E402

WORDS = ("invoice total amount due payment net gross tax freight order quantity unit price supplier customer "
         "account reference period balance credit debit remittance shipment delivery carrier warehouse").split()


def make_pdf(pages: int, seed: int = 0) -> bytes:
    """`pages` A4 pages of 36 lines each; every page has its own title and its own random words."""
    rng = random.Random(seed)
    content = []
    for i in range(pages):
        lines = [f"Benchmark document, page {i + 1} of {pages}"]
        lines += [f"{j:02d} " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 11)))
                  + f" {rng.randint(1, 99_999) / 100:.2f}" for j in range(1, 36)]
        content.append(lines)
    return docmaker.text_pdf(content)


def become_subreaper() -> None:
    """Orphaned descendants of the pipeline (a render worker or SDK worker whose parent exited without
    waiting for it) are re-parented to this process, so that their CPU time is counted too."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER (Linux)
    except (OSError, AttributeError):
        pass


def reap_all() -> None:
    """Wait for every remaining descendant (getrusage counts only children that were waited for)."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def run_pipeline(inputs: Path, output: Path, beam_args: list[str], repo: Path = REPO) -> dict[str, float]:
    argv = [sys.executable, "-m", "pipelines.cli", "run", "--input", str(inputs), "--output", str(output),
            "--extract", "false", "--run-id", "bench", "--progress-every-s", "0", *beam_args]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(argv, cwd=repo, capture_output=True, text=True, check=False, env=env)
    wall = time.perf_counter() - started
    reap_all()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"pipeline failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}")
    match = re.search(r"(\d+) pages in ([\d.]+) s", proc.stdout)
    manifest = json.loads((output / "runs" / "tenant=default" / "bench.json").read_text())
    return {
        "pages": float(manifest["totals"]["pages"]),
        "rendered": float(manifest["pages"].get("rendered", 0)),
        "wall_s": wall,  # includes interpreter start and imports
        "pipeline_s": float(match.group(2)) if match else wall,  # pipeline.run() to finish, as the CLI reports
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "peak_rss_mib": after.ru_maxrss / 1024,  # Linux: KiB; the largest child so far (only this one)
        "stage_ms": {k: v["mean"] for k, v in manifest.get("stage_timings", {}).items()
                     if isinstance(v, dict) and "mean" in v},
    }


def run_bare(data: bytes, pages: int, settings: RenderSettings, classifier: str) -> dict[str, float]:
    """Render, gate and hint every page in one loop; CPU seconds per stage (process_time around each)."""
    doc = DocumentRecord(uri="bench.pdf", size=len(data), doc_sha256=hashlib.sha256(data).hexdigest(),
                         format="pdf", page_count=pages)
    checks = load_checks(SafetyConfig(nsfw_classifier=classifier))  # before the clock, as DoFn.setup is
    hints = HintSettings(allow_ocr=False)  # what a render-only run uses
    count = jpeg_bytes = classified = 0
    cpu = {"render": 0.0, "gate": 0.0, "hints": 0.0}
    wall0 = time.perf_counter()
    pages_iter = render_document(doc, data, settings)
    while True:
        t0 = time.process_time()
        page = next(pages_iter, None)
        t1 = time.process_time()
        cpu["render"] += t1 - t0
        if page is None:
            break
        if not isinstance(page, PageImage):
            continue
        count += 1
        jpeg_bytes += len(page.image)
        classified += holds_picture(page)
        checked, verdict = screen_page(page, checks, 0)
        t2 = time.process_time()
        cpu["gate"] += t2 - t1
        if verdict is None:
            apply_hint(checked, choose_hint(checked, hints), hints)
        cpu["hints"] += time.process_time() - t2
    wall = time.perf_counter() - wall0
    return {"pages": float(count), "wall_s": wall, "cpu_s": cpu["render"], "all_cpu_s": sum(cpu.values()),
            **{f"{k}_ms": v * 1000 / max(count, 1) for k, v in cpu.items()},
            "classified": float(classified), "kib_per_page": jpeg_bytes / max(count, 1) / 1024}


def write_inputs(folder: Path, docs: int, pages: int) -> None:
    folder.mkdir(parents=True)
    for d in range(docs):
        (folder / f"bench-{d:03d}.pdf").write_bytes(make_pdf(pages, seed=d))


def pipeline_run(docs: int, pages: int, beam_args: list[str], repo: Path) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-render-") as tmp:
        inputs = Path(tmp) / "in"
        write_inputs(inputs, docs, pages)
        return run_pipeline(inputs, Path(tmp) / "out", beam_args, repo)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=400, help="pages a document")
    parser.add_argument("--docs", type=int, default=1, help="documents (a folder of them when over 1)")
    parser.add_argument("--slope-from", type=int, default=100, help="also run this many pages a document and "
                        "report the CPU slope between the two sizes (start-up not counted); 0: off")
    parser.add_argument("--beam-arg", action="append", default=[], help="extra pipeline flag, e.g. "
                        "--beam-arg=--direct_running_mode=in_memory")
    parser.add_argument("--repo", type=Path, default=REPO, help="checkout whose pipeline runs (a baseline); "
                        "the bare loop always uses this one's functions")
    parser.add_argument("--nsfw-classifier", default="nudenet", help="for both halves (the pipeline's default)")
    args = parser.parse_args()
    # The pipeline's defaults (pipelines/config/options.py), so both halves do the same work per page.
    settings = RenderSettings(dpi=150.0, max_side=1288, jpeg_quality=90, max_text_chars=20_000,
                              max_page_points=14_400.0, max_image_pixels=89_478_485, max_bytes=50 * 2**20)
    become_subreaper()
    flags = [f"--nsfw-classifier={args.nsfw_classifier}", *args.beam_arg]
    beam = pipeline_run(args.docs, args.pages, flags, args.repo)
    small = pipeline_run(args.docs, args.slope_from, flags, args.repo) if args.slope_from else None
    data = make_pdf(args.pages)
    bare = run_bare(data, args.pages, settings, args.nsfw_classifier)

    beam_cores = beam["cpu_s"] / beam["wall_s"]
    beam_per_cpu = beam["pages"] / beam["cpu_s"]
    bare_per_cpu = bare["pages"] / bare["cpu_s"]
    print(f"pipeline ({args.repo}: pagemill run --extract false {' '.join(flags)}), "
          f"{args.docs} document(s) of {args.pages} pages:")
    print(f"  {beam['pages']:.0f} pages ({beam['rendered']:.0f} rendered); pipeline {beam['pipeline_s']:.1f} s, "
          f"process {beam['wall_s']:.1f} s wall, {beam['cpu_s']:.1f} s CPU of the whole process tree "
          f"({beam_cores:.2f} cores busy)")
    print(f"  {beam['pages'] / beam['pipeline_s']:.1f} pages/s (pipeline), "
          f"{beam['pages'] / beam['wall_s']:.1f} pages/s (whole process), "
          f"{beam_per_cpu:.1f} pages per CPU-second")
    print(f"  peak RSS {beam['peak_rss_mib']:.0f} MiB (the largest process)")
    stages = ", ".join(f"{k} {v:.1f}" for k, v in sorted(beam["stage_ms"].items()))
    print(f"  stage means, ms a page (wall, per worker thread): {stages or 'none reported'}")
    all_ms = bare["all_cpu_s"] * 1000 / bare["pages"]
    if small is not None:
        slope = (beam["cpu_s"] - small["cpu_s"]) * 1000 / (beam["pages"] - small["pages"])
        print(f"  {small['pages']:.0f} pages: {small['cpu_s']:.1f} s CPU ({small['cpu_s'] / small['wall_s']:.2f} "
              f"cores busy); slope {slope:.1f} ms of CPU a page between {small['pages']:.0f} and "
              f"{beam['pages']:.0f} pages (start-up not counted); {slope / all_ms:.2f}x the bare loop's "
              f"{all_ms:.1f} ms")
    print("\nbare loop (one core, same stages as plain functions, this checkout):")
    print(f"  {bare['pages']:.0f} pages in {bare['wall_s']:.1f} s wall; CPU ms a page: render {bare['render_ms']:.1f} "
          f"(render + hash + text layer + raster check + JPEG q90), gate {bare['gate_ms']:.1f} "
          f"({bare['classified']:.0f} pages classified by {args.nsfw_classifier}), hints {bare['hints_ms']:.1f}")
    all_per_cpu = bare["pages"] / bare["all_cpu_s"]
    print(f"  render only: {bare_per_cpu:.1f} pages/s/core; render + gate + hints: {all_per_cpu:.1f} pages/s/core; "
          f"{bare['kib_per_page']:.0f} KiB a page")
    print(f"\nBeam overhead ratio (bare pages/s/core / pipeline pages per CPU-second, start-up included): "
          f"{all_per_cpu / beam_per_cpu:.2f}x against the same stages, "
          f"{bare_per_cpu / beam_per_cpu:.2f}x against render alone")


if __name__ == "__main__":
    main()
