"""An ExtractConfig of the invoice schema: extract_config.
Moved from tests/transforms/model/test_prompt.py, which other test files imported."""
from __future__ import annotations

from dataclasses import replace

from schemas.extraction import load_schema
from transforms.extract.stage import ExtractConfig


def extract_config(**changes: object) -> ExtractConfig:
    base = ExtractConfig(schema=load_schema("invoice"), tenant="acme", model="m", model_revision="r",
                         render_key="k", model_family="qwen2_vl", max_model_len=8192, max_tokens=384,
                         max_attempts=2, gpu_hourly_usd=2.5, api_price="gpt-4o", prices={})
    return replace(base, **changes)
