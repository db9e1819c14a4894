"""The host path of a page on the engine side, step by step: CPU ms a page of each step that the engine process
runs besides the model, timed on the pages and requests of a bench_extract run (imported by bench_extract.py).

Each step is the function the engine calls, timed again on the run's own inputs once the extraction is over
(the engine idle, so the process's CPU time is the step's alone; torch keeps the engine's thread count):
  decode           transforms.engines.vllm_shared.templated.page_pixels: the JPEG decode (and the detail cap)
  prompt           the chat template and the prompt's token count (what Templated.prepare does besides the image)
  image_processor  the model's Hugging Face image processor (vLLM's cached_get_processor), on the image the engine
                   was given; also on the same image resized first to the processor's grid (smart_resize), which
                   shows what its own resize costs, and on one torch thread (`_1_thread`: vLLM leaves the
                   process that runs it at torch's default, a thread a core)
  engine_input     vLLM's input processing of the request (LLM._preprocess_cmpl_one, what the engine's admission
                   calls): the image processor again, the prompt's tokenisation and the placeholder expansion
  grammar_compile  xgrammar's compile of the schema, cold (vLLM compiles it once a run: its compiler caches)
  grammar_matcher  one xgrammar GrammarMatcher, the per-request state of structured output
  grammar_masks    the answer's token masks: a bitmask filled and the token accepted, for each output token
  detokenise       tokenizers' DecodeStream over the answer's tokens, one step a token (vLLM's fast detokeniser)
"""
from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from transforms.engines.base import PageRequest, Prepared
from transforms.engines.vllm_shared.templated import page_pixels
from transforms.model.prompt import prompt_messages

STEPS = ("decode", "prompt", "image_processor", "image_processor_on_grid", "image_processor_1_thread", "engine_input",
         "engine_input_1_thread", "grammar_matcher", "grammar_masks", "detokenise")


def cpu_ms(fn: Callable[[Any], Any], items: Sequence[Any], passes: int = 2) -> float:
    """CPU ms of the whole process an item (process_time: torch's own threads are counted): the median over
    `passes` passes of every item (a busy machine inflates some calls; the median keeps the step's own cost),
    the first item also run once before the clock (lazy imports and caches)."""
    if not items:
        return 0.0
    fn(items[0])
    times = []
    for _ in range(passes):
        for item in items:
            t0 = time.process_time()
            fn(item)
            times.append(time.process_time() - t0)
    return statistics.median(times) * 1000


def grid_size(processor: Any, width: int, height: int) -> tuple[int, int]:
    """The size the Qwen2-VL family's processor resizes an image to (its own smart_resize); as it is otherwise."""
    try:
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize
    except ImportError:
        return width, height
    ip = processor.image_processor
    factor = getattr(ip, "patch_size", 14) * getattr(ip, "merge_size", 2)
    size = getattr(ip, "size", None) or {}
    lo = size.get("shortest_edge", getattr(ip, "min_pixels", 56 * 56))
    hi = size.get("longest_edge", getattr(ip, "max_pixels", 28 * 28 * 1280))
    h, w = smart_resize(height, width, factor, lo, hi)
    return w, h


def host_steps(engine: Any, requests: Sequence[PageRequest], prepared: Sequence[Prepared], answers: Sequence[str],
               schema: dict[str, Any]) -> dict[str, Any]:
    """CPU ms a page of each host step (STEPS), the grammar's cold compile in ms (once a run), and what the
    image processor was given: its class, the image sizes, and whether its resize had anything to do."""
    import torch
    from PIL import Image

    tok = engine.tokenizer()
    templated = engine._templated  # the engine's own (made at its first prepare), with its control tokens
    images = [p.request["multi_modal_data"]["image"] for p in prepared]
    try:
        from vllm.transformers_utils.processor import cached_get_processor

        processor = cached_get_processor(engine.settings.model)
    except Exception:  # noqa: BLE001 - another vLLM layout: the model's processor as transformers loads it
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(engine.settings.model)
    grids = [grid_size(processor, im.width, im.height) for im in images]
    on_grid = [im if im.size == g else im.resize(g, Image.Resampling.BICUBIC)
               for im, g in zip(images, grids, strict=True)]

    def prompt(request: PageRequest) -> int:
        messages = prompt_messages(request.prompt.text, request.prompt.hint, templated.controls)
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return len(tok.encode(text, add_special_tokens=False))

    llm = engine.llm
    vllm_requests = [{k: v for k, v in p.request.items() if k != "page"} for p in prepared]
    ms = {
        "decode": cpu_ms(lambda r: page_pixels(r.page.data, r.page.detail_side), requests),
        "prompt": cpu_ms(prompt, requests),
        "image_processor": cpu_ms(lambda im: processor.image_processor(images=[im], return_tensors="pt"), images),
        "image_processor_on_grid": cpu_ms(lambda im: processor.image_processor(images=[im], return_tensors="pt"),
                                          on_grid),
        "engine_input": cpu_ms(llm._preprocess_cmpl_one, vllm_requests),
    }
    threads = torch.get_num_threads()
    if threads > 1:  # the same calls on one torch thread (vLLM's CPU worker replaces torch.set_num_threads)
        torch._C.set_num_threads(1)
        try:
            ms["image_processor_1_thread"] = cpu_ms(
                lambda im: processor.image_processor(images=[im], return_tensors="pt"), images)
            ms["engine_input_1_thread"] = cpu_ms(llm._preprocess_cmpl_one, vllm_requests)
        finally:
            torch._C.set_num_threads(threads)
    answer_ids = [tok.encode(a, add_special_tokens=False) for a in answers]  # the answers' tokens, again
    ms.update(grammar(tok, llm, schema, answer_ids))
    ms["detokenise"] = cpu_ms(lambda ids: detokenise(tok, ids), answer_ids)
    return {"host_ms": {k: round(v, 2) for k, v in ms.items()},
            "host_image_processor": type(processor.image_processor).__name__,
            "host_image_sizes": sorted({f"{im.width}x{im.height}" for im in images}),
            "host_grid_sizes": sorted({f"{w}x{h}" for w, h in grids}),
            "host_resize_noop": all(im.size == g for im, g in zip(images, grids, strict=True)),
            "host_torch_threads": threads}


def grammar(tok: Any, llm: Any, schema: dict[str, Any], answer_ids: Sequence[Sequence[int]]) -> dict[str, float]:
    """xgrammar as vLLM's backend uses it (engine-level disable_any_whitespace: compact separators): the schema's
    cold compile (ms, once a run), one matcher and a page's token masks (CPU ms a page: a bitmask filled and the
    token accepted for each token of the answer, up to the first the grammar refuses, as re-tokenised text may)."""
    try:
        import xgrammar as xgr
    except ImportError:
        return {}
    try:
        vocab = llm.llm_engine.model_config.get_vocab_size()
    except Exception:  # noqa: BLE001 - the tokenizer's own size
        vocab = None
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab)
    text = json.dumps(schema)
    t0 = time.perf_counter()
    compiler = xgr.GrammarCompiler(info, max_threads=8, cache_enabled=False)
    ctx = compiler.compile_json_schema(text, any_whitespace=False, separators=(",", ":"))
    compile_ms = (time.perf_counter() - t0) * 1000
    bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)

    def masks(ids: Sequence[int]) -> None:  # what the engine does for every output token of a page
        matcher = xgr.GrammarMatcher(ctx)
        for token in ids:
            matcher.fill_next_token_bitmask(bitmask)
            if not matcher.accept_token(token):
                break

    return {"grammar_compile_once": compile_ms, "grammar_matcher": cpu_ms(lambda _: xgr.GrammarMatcher(ctx),
                                                                          range(16)),
            "grammar_masks": cpu_ms(masks, answer_ids)}


def detokenise(tok: Any, ids: Sequence[int]) -> str:
    from tokenizers.decoders import DecodeStream

    stream = DecodeStream(skip_special_tokens=True)
    backend = tok._tokenizer if hasattr(tok, "_tokenizer") else tok.backend_tokenizer
    return "".join(stream.step(backend, i) or "" for i in ids)


def report_lines(r: dict[str, Any]) -> list[str]:
    ms = r.get("host_ms") or {}
    if not ms:
        return []
    steps = ", ".join(f"{k} {ms[k]:.1f}" for k in STEPS if k in ms)
    grid = "a no-op" if r["host_resize_noop"] else (f"not a no-op: {', '.join(r['host_image_sizes'])} -> "
                                                    f"{', '.join(r['host_grid_sizes'])}")
    return [f"  host path      CPU ms a page: {steps}; grammar compile {ms.get('grammar_compile_once', 0):.0f} ms "
            f"once a run",
            f"                 image processor {r['host_image_processor']} (torch threads "
            f"{r['host_torch_threads']}); its resize is {grid}"]
