"""The stage's pure parts (mutants of each survived `make mutate`; docs/development.md "Mutation score"): a page's
flags from its answer (JSON, or a markdown page's front matter and text), `--max-in-flight 1`, a hosted API's
price of a page, the image tokens a low-detail page saved, and the row's engine time and stop reason. No engine."""
from __future__ import annotations

from dataclasses import replace

import pytest

from schemas.records import ExtractionResult, PageImage, PageTask
from transforms.extract.stage import ExtractConfig, in_flight_limit, page_cost_usd, result_flags, to_rows
from transforms.model import token_math
from transforms.model.budget import load_prices
from transforms.model.markdown import load_output

EMAIL = "Call me at jane.doe@example.com."


def config(output: str) -> ExtractConfig:
    schema, markdown = load_output(output)
    return ExtractConfig(schema=schema, markdown=markdown, tenant="t", model="m", model_revision=None,
                         render_key="r", model_family="qwen2_vl", max_model_len=8192, max_tokens=256,
                         max_attempts=1, gpu_hourly_usd=0.0, api_price="gpt-4o", prices=load_prices())


def test_a_markdown_pages_text_raises_its_flags() -> None:
    flags = result_flags(ExtractionResult("ok", extraction="{}", markdown=f"# Page\n\n{EMAIL}"), config("markdown"))
    assert {"pii", "pii_email"} <= set(flags.flags)
    assert any(n.startswith("pii_email: /markdown") for n in flags.notes)


def test_a_markdown_page_without_findings_has_no_flags() -> None:
    flags = result_flags(ExtractionResult("ok", extraction="{}", markdown="# Invoice\n\nTotal 12.50"),
                         config("markdown"))
    assert (flags.flags, flags.notes) == ((), ())


def test_a_json_answer_raises_its_flags() -> None:
    flags = result_flags(ExtractionResult("ok", extraction='{"vendor_name": "jane.doe@example.com"}'),
                         config("invoice"))
    assert {"pii", "pii_email"} <= set(flags.flags)


def test_max_in_flight_one_is_kept() -> None:
    assert in_flight_limit(replace(config("invoice"), max_in_flight=1), 16) == 1


def test_a_hosted_api_page_costs_its_tokens_at_the_list_price() -> None:
    prices = {"providers": {"acme": {"input_usd_per_mtok": 2.0, "output_usd_per_mtok": 10.0,
                                     "image_family": "gpt-4o"}}}
    cfg = replace(config("invoice"), route="api:acme", prices=prices)
    r = ExtractionResult("ok", image_tokens=1000, text_tokens=200, output_tokens=300, attempts=1)
    # (1000 + 200) input tokens at $2 and 300 output tokens at $10 a million: $0.0024 + $0.003.
    assert page_cost_usd(r, cfg) == pytest.approx(0.0054)


def test_a_low_detail_page_records_the_tokens_it_saved() -> None:
    page = PageImage("d", "u", 0, "h", b"", 1600, 1200, detail="low", detail_side=512)
    r = ExtractionResult("ok", extraction="{}", image_tokens=100, attempts=1, gpu_seconds=2.5, stop_reason="stop")
    (row,) = to_rows((PageTask(page=page, cache_key="k", hint=""), r), config("invoice"))
    full = token_math.estimate_image_tokens("qwen2_vl", 1600, 1200)  # what high detail would have sent
    assert full > 100 and row.image_tokens_saved == full - 100
    assert (row.gpu_seconds, row.stop_reason, row.image_tokens) == (2.5, "stop", 100)
    # The same answer for the page sent at full detail saved nothing, whatever the engine counted.
    (row,) = to_rows((PageTask(page=replace(page, detail="high", detail_side=0), cache_key="k", hint=""), r),
                     config("invoice"))
    assert row.image_tokens_saved == 0
