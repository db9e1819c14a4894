"""One home for a page's hosted-API price (transforms/model/budget.py hosted_cost): the ledger's api_equivalent_usd
and `pagemill estimate` price the same page the same way under every --api-price, each provider with its own
image-token rule (issue 26's bug: the ledger counted every image with GPT-4o's rule)."""
from __future__ import annotations

import pytest

from pipelines.estimate.estimate import PagePlan, hosted_prices
from schemas.records import ExtractionResult, PageImage, PageTask
from tests.support.extract_configs import extract_config
from transforms.extract.stage import to_rows
from transforms.model import budget

WIDTH, HEIGHT, TEXT, OUTPUT = 911, 1288, 1800, 150  # the demo invoice's page as sent; its prompt and answer
# Hand-derived from each vendor's published rule (budget.py cites them), then the list prices of prices.json:
# gpt-4o: shortest side 911 -> 768, 768 x 1086: 2 x 3 tiles of 512 -> 170 * 6 + 85 = 1105 tokens;
#   (1105 + 1800) * 2.50 + 150 * 10.00 = 8762.5 USD per 1e6
# claude-sonnet: 911 x 1288 = 1,173,368 px, under the ~1.2 MP and 1568 px caps: ceil(1173368 / 750) = 1565;
#   (1565 + 1800) * 3.00 + 150 * 15.00 = 12345.0
# gemini-2.5-flash: 2 x 2 tiles of 768 -> 4 * 258 = 1032; (1032 + 1800) * 0.30 + 150 * 2.50 = 1224.6
EXPECTED = {"gpt-4o": 8762.5e-6, "claude-sonnet": 12345.0e-6, "gemini-2.5-flash": 1224.6e-6}


def ledger_usd(provider: str) -> float:
    page = PageImage(doc_sha256="d" * 64, source_uri="inv.pdf", page_index=0, page_hash="h" * 64, image=b"",
                     width=WIDTH, height=HEIGHT)
    result = ExtractionResult(status="ok", text_tokens=TEXT, output_tokens=OUTPUT, image_tokens=1600, attempts=1,
                              sent_width=WIDTH, sent_height=HEIGHT)
    cfg = extract_config(api_price=provider, prices=budget.load_prices())
    (row,) = to_rows((PageTask(page=page, cache_key="k", hint=""), result), cfg)
    return row.api_equivalent_usd


def estimate_usd(provider: str) -> float:
    plan = PagePlan(source_uri="inv.pdf", page_index=0, width=WIDTH, height=HEIGHT, sent_width=WIDTH,
                    sent_height=HEIGHT, image_tokens=1600, text_tokens=TEXT, status="model")
    hosted = hosted_prices([plan], {"text": TEXT, "output": OUTPUT}, budget.load_prices())
    return next(h["usd"] for h in hosted if h["provider"] == provider)


@pytest.mark.parametrize("provider", sorted(EXPECTED))
def test_the_ledger_and_the_estimate_price_a_page_alike(provider: str) -> None:
    assert ledger_usd(provider) == pytest.approx(EXPECTED[provider], rel=1e-12)
    assert estimate_usd(provider) == pytest.approx(EXPECTED[provider], rel=1e-12)


def test_hosted_cost_names_the_provider() -> None:
    prices = budget.load_prices()
    assert budget.hosted_image_tokens("claude-sonnet", WIDTH, HEIGHT, prices) == 1565
    with pytest.raises(ValueError, match="unknown provider"):
        budget.hosted_cost("nobody", WIDTH, HEIGHT, TEXT, OUTPUT, prices)
