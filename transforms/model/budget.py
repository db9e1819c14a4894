"""Token budget: text-token estimates, fitting a page image to the room left in the context, hosted-API prices.

Everything here is pure (no Beam, no model, no I/O except `load_prices`), so the engine stage and the estimate
can decide *before* a page reaches the GPU how big it is and whether it has to be shrunk, and price it at a
hosted API. Image tokens are counted by `transforms.model.token_math.estimate_image_tokens` (every family's
formula is in transforms/model/image_tokens.py); this module only builds on them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from transforms.model.image_tokens import check_size
from transforms.model.token_math import ImageTokenRule, estimate_image_tokens
from transforms.pages.sizes import capped_size


def text_tokens_estimate(text: str) -> int:
    """Rough text-token count: ceil(characters / 4).

    A rule of thumb for English with BPE tokenizers, good enough to size batches and budgets; it is
    not a tokenizer. The exact count is what the engine reports after tokenising the prompt.
    """
    return math.ceil(len(text) / 4)


def fit_to_token_budget(
    width: int, height: int, max_image_tokens: int, family: str | ImageTokenRule = "qwen2_vl"
) -> tuple[int, int] | None:
    """Largest (width, height), same aspect ratio, whose image-token estimate is <= max_image_tokens.

    Never enlarges: if the image already fits it comes back unchanged (upscaling adds tokens, not
    information). Returns None if even a 1 px long side does not fit (e.g. a budget below the family's
    minimum). Binary search over the long side: the estimates grow with size, up to rounding steps that
    can only make the result a few pixels smaller than the true optimum, never over budget.
    Raises ValueError for an unknown family, or an image the family refuses at full size.
    """
    check_size(width, height)
    long_side = max(width, height)

    def size_at(side: int) -> tuple[int, int]:
        return capped_size(width, height, side)  # the page stage's own cap, at a smaller side

    def fits(side: int) -> bool:
        try:
            return estimate_image_tokens(family, *size_at(side)) <= max_image_tokens
        except ValueError:
            # Rounding a thin strip down can push it past Qwen's 200:1 limit, which the engine would
            # refuse too: such a size does not fit. At full size (or for an unknown family) it is an error.
            if side == long_side:
                raise
            return False

    if fits(long_side):
        return width, height
    if not fits(1):
        return None
    lo, hi = 1, long_side  # invariant: fits(lo), not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return size_at(lo)


def fit_image(width: int, height: int, text_tokens: int, max_tokens: int, max_model_len: int,
              family: str | ImageTokenRule) -> tuple[int, int] | None:
    """The size a page image goes to the model at, beside a prompt of text_tokens and max_tokens of output in
    max_model_len: as it is when its tokens fit the room left, else shrunk to fit (`fit_to_token_budget`), or
    None when nothing fits (the page fails as over_token_budget). The engines' prompt
    (`transforms.engines.vllm_shared.templated.Templated.prepare`) and `pagemill estimate` both decide with this."""
    room = max_model_len - max_tokens - text_tokens
    if estimate_image_tokens(family, width, height) <= room:
        return width, height
    return fit_to_token_budget(width, height, room, family) if room > 0 else None


def load_prices(path: Path | str | None = None) -> dict[str, Any]:
    """Load the API price table (default: the `schemas/prices.json` shipped with the package)."""
    if path is None:
        text = resources.files("schemas").joinpath("prices.json").read_text(encoding="utf-8")
    else:
        text = Path(path).read_text(encoding="utf-8")
    prices: dict[str, Any] = json.loads(text)
    if not isinstance(prices.get("providers"), dict):
        raise ValueError("price table has no 'providers' object")
    return prices


BATCH_TIER = "@batch"  # `<provider>@batch`: the provider's batch endpoint, at its `batch_rate` of the list price


def api_cost_usd(provider: str, input_tokens: float, output_tokens: float, prices: Mapping[str, Any]) -> float:
    """List-price cost in USD of one call (or a sum of calls) to a hosted API, from `load_prices()`; for
    `<provider>@batch` (the ledger route of `--engine openai_batch`), that times the provider's `batch_rate`
    (prices.json). The one home of the price rule: the ledger and `pagemill estimate` both call it."""
    if input_tokens < 0 or output_tokens < 0:
        raise ValueError("token counts must be >= 0")
    batch = provider.endswith(BATCH_TIER)
    p = _provider(provider.removesuffix(BATCH_TIER), prices)
    usd_in = input_tokens * float(p["input_usd_per_mtok"])
    usd_out = output_tokens * float(p["output_usd_per_mtok"])
    return (usd_in + usd_out) / 1e6 * (float(p["batch_rate"]) if batch else 1.0)


def hosted_image_tokens(provider: str, width: int, height: int, prices: Mapping[str, Any]) -> int:
    """A page image's tokens at a hosted API: the provider's own rule (its `image_family` in prices.json)."""
    return estimate_image_tokens(_provider(provider, prices)["image_family"], width, height)


def hosted_cost(provider: str, width: int, height: int, text_tokens: float, output_tokens: float,
                prices: Mapping[str, Any]) -> float:
    """List price in USD of one page at a hosted API: the image as sent (`width` x `height`) under the provider's
    image rule, plus the prompt's text and the output tokens. The one home of that rule: the ledger's
    api_equivalent_usd (transforms/extract/stage.py) and `pagemill estimate`'s hosted prices both call it."""
    image = hosted_image_tokens(provider, width, height, prices)
    return api_cost_usd(provider, image + text_tokens, output_tokens, prices)


def _provider(provider: str, prices: Mapping[str, Any]) -> Mapping[str, Any]:
    providers = prices["providers"]
    try:
        return providers[provider]
    except KeyError:
        raise ValueError(f"unknown provider {provider!r}; known: {', '.join(providers)}") from None

