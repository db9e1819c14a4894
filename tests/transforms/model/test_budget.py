"""Tests for transforms/model/budget.py: text-token estimates, fitting a page to its token budget, prices; and
the dispatch of transforms/model/token_math.py's `estimate_image_tokens` that they build on."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from transforms.model.budget import api_cost_usd, fit_image, fit_to_token_budget, load_prices, text_tokens_estimate
from transforms.model.image_tokens import (
    IMAGE_TOKEN_FAMILIES,
    gemini_image_tokens,
    gpt4o_image_tokens,
    qwen2_vl_image_tokens,
)
from transforms.model.token_math import estimate_image_tokens


def test_estimate_dispatch() -> None:
    families = {"qwen2_vl", "qwen2_5_vl", "gpt-4o", "claude", "gemini", "llama-3.2-vision"}
    assert set(IMAGE_TOKEN_FAMILIES) == families
    assert estimate_image_tokens("qwen2_vl", 1288, 1000) == 1656
    assert estimate_image_tokens("qwen2_5_vl", 1288, 1000) == 1656
    assert estimate_image_tokens("gpt-4o", 1024, 1024) == 765
    assert estimate_image_tokens("claude", 1000, 1000) == 1334
    assert estimate_image_tokens("gemini", 300, 300) == 258
    assert estimate_image_tokens("llama-3.2-vision", 560, 560) == 1601
    with pytest.raises(ValueError, match="unknown model family"):
        estimate_image_tokens("gpt-5", 10, 10)
    with pytest.raises(TypeError):
        IMAGE_TOKEN_FAMILIES["x"] = gemini_image_tokens  # type: ignore[index]


def test_text_tokens_estimate() -> None:
    assert text_tokens_estimate("") == 0
    assert text_tokens_estimate("abcd") == 1
    assert text_tokens_estimate("abcde") == 2
    assert text_tokens_estimate("x" * 4000) == 1000


@pytest.mark.parametrize("family", sorted(IMAGE_TOKEN_FAMILIES))
@pytest.mark.parametrize("budget", [300, 1024, 1656, 3000])
def test_fit_to_token_budget(family: str, budget: int) -> None:
    w0, h0 = 1288, 1000
    fitted = fit_to_token_budget(w0, h0, budget, family)
    if fitted is None:
        assert estimate_image_tokens(family, 1, 1) > budget
        return
    w, h = fitted
    assert estimate_image_tokens(family, w, h) <= budget
    assert w <= w0 and h <= h0
    assert abs(w / h - w0 / h0) < 0.01 * (w0 / h0) + 1 / h
    if (w, h) != (w0, h0):
        # Maximal: one pixel more on the long side is over budget.
        bigger = (w + 1, round(h0 * (w + 1) / w0))
        assert estimate_image_tokens(family, *bigger) > budget


def test_fit_to_token_budget_edges() -> None:
    assert fit_to_token_budget(1288, 1000, 1656) == (1288, 1000)  # fits already: unchanged
    assert fit_to_token_budget(1288, 1000, 10**6) == (1288, 1000)  # never enlarged
    assert fit_to_token_budget(1288, 1000, 3) is None  # Qwen never goes below 4 tokens
    assert fit_to_token_budget(1288, 1000, 200, "gpt-4o") is None  # one tile costs 255
    w, h = fit_to_token_budget(1000, 1288, 1024)  # type: ignore[misc]
    assert qwen2_vl_image_tokens(w, h) <= 1024 and h > w
    with pytest.raises(ValueError):
        fit_to_token_budget(100, 100, 100, "nope")
    with pytest.raises(ValueError, match="aspect ratio"):
        fit_to_token_budget(300, 1, 100)  # Qwen refuses > 200:1 at any size
    # A 200:1 strip: shrinking it rounds the short side to 1 px (past 200:1); those sizes are skipped.
    for budget in (10, 30, 100, 140):
        w, h = fit_to_token_budget(8000, 40, budget)  # type: ignore[misc]
        assert qwen2_vl_image_tokens(w, h) <= budget


def test_fit_image_leaves_room_for_the_prompt_and_the_answer() -> None:
    """The rule `prepare` and `pagemill estimate` share: the image gets what the context has left after the
    text tokens and --max-tokens; the token counts are Qwen2-VL's grid (28x28 px a token), by hand."""
    # 1288x1000 -> 1288x1008 -> 46x36 = 1656 tokens: fits exactly in 4000 - 1000 - 1344.
    assert fit_image(1288, 1000, 1344, 1000, 4000, "qwen2_vl") == (1288, 1000)
    w, h = fit_image(1288, 1000, 1345, 1000, 4000, "qwen2_vl")  # type: ignore[misc]  # one token short
    assert (w, h) < (1288, 1000) and qwen2_vl_image_tokens(w, h) <= 1655
    assert fit_image(1288, 1000, 3000, 1000, 4000, "qwen2_vl") is None  # no room left at all
    assert fit_image(1288, 1000, 2997, 1000, 4000, "qwen2_vl") is None  # 3 tokens: under Qwen's 4


def test_prices_table() -> None:
    prices = load_prices()
    assert prices["read_on"] == "2026-11-29"
    assert "list price" in prices["note"]
    providers = prices["providers"]
    assert set(providers) >= {"gpt-4o", "claude-sonnet", "gemini-2.5-flash"}
    for p in providers.values():
        assert p["image_family"] in IMAGE_TOKEN_FAMILIES
    assert api_cost_usd("gpt-4o", 1_000_000, 1_000_000, prices) == pytest.approx(12.50)
    assert api_cost_usd("claude-sonnet", 1_000_000, 0, prices) == pytest.approx(3.00)
    assert api_cost_usd("gemini-2.5-flash", 0, 1_000_000, prices) == pytest.approx(2.50)
    # One Qwen-sized page through GPT-4o: 765 image tokens + 200 text in, 300 out, at $2.50 / $10.00 per 1M
    # tokens: 965 x 2.5e-6 = $0.0024125 in, 300 x 1e-5 = $0.003 out, $0.0054125 in all.
    assert api_cost_usd("gpt-4o", 965, 300, prices) == pytest.approx(0.0054125)
    with pytest.raises(ValueError, match="unknown provider"):
        api_cost_usd("gpt-9", 1, 1, prices)
    with pytest.raises(ValueError):
        api_cost_usd("gpt-4o", -1, 1, prices)


def test_load_prices_from_path(tmp_path: Path) -> None:
    f = tmp_path / "p.json"
    table = {"read_on": "x", "providers": {"a": {"input_usd_per_mtok": 1, "output_usd_per_mtok": 2}}}
    f.write_text(json.dumps(table))
    prices = load_prices(f)
    assert math.isclose(api_cost_usd("a", 2_000_000, 500_000, prices), 3.0)
    f.write_text("{}")
    with pytest.raises(ValueError, match=r"^price table has no 'providers' object$"):
        load_prices(f)
    f.write_text('{"providers": []}')
    with pytest.raises(ValueError, match="no 'providers' object"):
        load_prices(f)
    f.write_text(json.dumps(table))
    assert load_prices(str(f))["read_on"] == "x"  # a str path as well as a Path


def test_errors_name_the_choices() -> None:
    prices = load_prices()
    with pytest.raises(ValueError, match=r"^unknown model family 'gpt-5'; known: qwen2_vl, qwen2_5_vl, gpt-4o, "
                                         r"claude, gemini, llama-3\.2-vision, llava, llava_next, internvl2, idefics3$"):
        estimate_image_tokens("gpt-5", 10, 10)
    with pytest.raises(ValueError, match=r"^unknown provider 'gpt-9'; known: gpt-4o, claude-sonnet, "
                                         r"gemini-2\.5-flash$"):
        api_cost_usd("gpt-9", 1, 1, prices)
    with pytest.raises(ValueError, match=r"^token counts must be >= 0$"):
        api_cost_usd("gpt-4o", 1, -1, prices)
    with pytest.raises(ValueError, match=r"^image size must be positive, got 0x5$"):
        gpt4o_image_tokens(0, 5)
    with pytest.raises(ValueError, match=r"^detail must be 'low', 'high' or 'auto', got 'medium'$"):
        gpt4o_image_tokens(10, 10, detail="medium")
    # List prices are exact: $2.50 + $10.00 for a million tokens each way.
    assert api_cost_usd("gpt-4o", 1_000_000, 1_000_000, prices) == 12.5
    assert api_cost_usd("gpt-4o", 0, 0, prices) == 0

