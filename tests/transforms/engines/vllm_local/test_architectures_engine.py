"""Other architectures through the real vLLM engine: tiny random LLaVA-NeXT (CLIP + Llama, anyres tiles) and
InternVL (InternViT + Qwen2, dynamic 448 px tiles) and Idefics3 (granite-docling's: SigLIP + Llama, 364 px
tiles), `--schema markdown`, with the estimate's image tokens equal
to the engine's own prompt count."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import vllm_available
from tests.support import docmaker
from tests.support.extract_pages import config, odd_page, pages_of, tasks_for
from tests.support.feeding import extract_all
from transforms.engines.vllm_local.engine import VllmLocalEngine
from transforms.engines.vllm_local.settings import VllmLocalSettings
from transforms.model.markdown import MARKDOWN_FORMATS
from transforms.model.token_math import rule_for

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (scripts/setup_venv.sh)")]


@pytest.fixture(scope="module", params=["llava_next", "internvl", "idefics3"])
def model(request: pytest.FixtureRequest,
          tiny_model: Callable[[str], Path]) -> Iterator[tuple[VllmLocalEngine, VllmLocalSettings, Path]]:
    folder = tiny_model(request.param)
    settings = VllmLocalSettings(model=str(folder), model_revision="test", max_model_len=8192, max_num_seqs=8,
                              gpu_memory_utilization=0.9, tensor_parallel_size=1, limit_mm_per_prompt=1,
                              kv_cache_gib=0.25, enforce_eager=True)
    engine = VllmLocalEngine(settings)
    yield engine, settings, folder
    engine.shutdown()


def test_markdown_and_exact_image_tokens(model: tuple[VllmLocalEngine, VllmLocalSettings, Path]) -> None:
    engine, settings, folder = model
    fmt = MARKDOWN_FORMATS["markdown"]
    rule = rule_for("qwen2_vl", str(folder))  # the folder's config.json names its family
    assert rule.family in ("llava_next", "internvl2", "idefics3")
    cfg = config(schema=fmt.schema, markdown=fmt, model_family=rule, max_tokens=24, max_attempts=1)
    pages = [*pages_of(docmaker.invoice_pdf(), "inv.pdf"), odd_page(1000, 240, "wide.png"),
             odd_page(200, 900, "tall.png")]
    pages = [replace(p, hint="Invoice 2026-001 Total 12.50") if p.source_uri == "inv.pdf" else p for p in pages]
    results = extract_all(engine, tasks_for(pages, settings, cfg), cfg)
    assert [r.status for r in results] == ["ok"] * len(pages), [r.message for r in results]
    for r in results:
        # The engine's count of image tokens in the prompt, against the family's formula on the size sent.
        assert r.image_tokens == rule.tokens(r.sent_width, r.sent_height) >= 256
        assert r.markdown is not None and r.extraction == "{}"
        assert r.flags == (("truncated_output",) if r.output_tokens == 24 else ())
    assert len({r.image_tokens for r in results}) >= 2  # the tiles differ with the page's shape
