"""Token budget: image- and text-token estimates per model family, fitting, API cost.

Everything here is pure (no Beam, no model, no I/O except `load_prices`), so the budget stage can
decide *before* a page reaches the GPU how big it is, whether it has to be shrunk, and which
pages go into one engine call.

Only the Qwen2-VL figure is exact (it reproduces the processor's `smart_resize`, and the tests check it
against transformers). The hosted-API figures follow each vendor's published formula; vendors change
them without notice, so treat them as estimates for routing and cost reports, not for billing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from transforms.pages.sizes import capped_size

# Qwen2-VL / Qwen2.5-VL processor defaults (preprocessor_config.json of the released checkpoints).
QWEN_PATCH_SIZE: Final = 14
QWEN_MERGE_SIZE: Final = 2
QWEN_MIN_PIXELS: Final = 56 * 56  # 3136
QWEN_MAX_PIXELS: Final = 28 * 28 * 16384  # 12845056, i.e. at most 16384 image tokens
# smart_resize refuses extreme strips; mirroring it keeps our estimate and the engine in agreement.
QWEN_MAX_ASPECT_RATIO: Final = 200


def qwen2_vl_resized_size(
    width: int,
    height: int,
    *,
    patch_size: int = QWEN_PATCH_SIZE,
    merge_size: int = QWEN_MERGE_SIZE,
    min_pixels: int = QWEN_MIN_PIXELS,
    max_pixels: int = QWEN_MAX_PIXELS,
) -> tuple[int, int]:
    """(width, height) the Qwen2-VL processor resizes an image to (its `smart_resize`).

    Both sides become multiples of factor = patch_size * merge_size; the pixel count is then pulled
    into [min_pixels, max_pixels] keeping the aspect ratio. Python's `round` (banker's rounding) is
    used on purpose, because that is what the reference implementation does.
    """
    _check_size(width, height)
    ratio = max(width, height) / min(width, height)
    if ratio > QWEN_MAX_ASPECT_RATIO:
        raise ValueError(f"aspect ratio must be smaller than {QWEN_MAX_ASPECT_RATIO}, got {ratio}")
    factor = patch_size * merge_size
    # No max(factor, ...) here, unlike below: a side under factor/2 rounds to 0, which then takes the
    # min_pixels branch. Keeping that quirk is what keeps the count equal to the engine's.
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return w_bar, h_bar


def qwen2_vl_image_tokens(
    width: int,
    height: int,
    *,
    patch_size: int = QWEN_PATCH_SIZE,
    merge_size: int = QWEN_MERGE_SIZE,
    min_pixels: int = QWEN_MIN_PIXELS,
    max_pixels: int = QWEN_MAX_PIXELS,
) -> int:
    """Number of `<|image_pad|>` tokens Qwen2-VL / Qwen2.5-VL put in the prompt for one image.

    Exact: (h'/patch) * (w'/patch) / merge**2 with (w', h') from `qwen2_vl_resized_size`. The
    `<|vision_start|>` / `<|vision_end|>` pair around them is text and not counted here.
    """
    w, h = qwen2_vl_resized_size(
        width, height, patch_size=patch_size, merge_size=merge_size, min_pixels=min_pixels,
        max_pixels=max_pixels,
    )
    return (h // patch_size) * (w // patch_size) // (merge_size * merge_size)


def gpt4o_image_tokens(width: int, height: int, detail: str = "high") -> int:
    """OpenAI GPT-4o / GPT-4.1 image input tokens (OpenAI "Images and vision" guide, cost calculation).

    low: a flat 85. high: fit inside 2048x2048, then scale so the shortest side is at most 768,
    then 170 per 512x512 tile plus 85. (Neither step enlarges an image; the published examples
    1024x1024 -> 765 and 2048x4096 -> 1105 follow from this.)
    """
    _check_size(width, height)
    if detail == "low":
        return 85
    if detail not in ("high", "auto"):
        raise ValueError(f"detail must be 'low', 'high' or 'auto', got {detail!r}")
    # 'auto' lets OpenAI pick; estimating the high-detail cost is the safe upper bound.
    w, h = float(width), float(height)
    if max(w, h) > 2048:
        s = 2048 / max(w, h)
        w, h = w * s, h * s
    if min(w, h) > 768:
        s = 768 / min(w, h)
        w, h = w * s, h * s
    tiles = math.ceil(w / 512) * math.ceil(h / 512)
    return 170 * tiles + 85


def claude_resized_size(width: int, height: int) -> tuple[int, int]:
    """Size Anthropic's API scales an image to before counting (Claude "Vision" docs, image costs).

    The long edge is capped at 1568 px and the image at about 1600 tokens (1.2e6 px; the docs call it
    "~1.15 megapixels" and list 1092x1092 = 1.19e6 px as the largest square that is not resized).
    """
    _check_size(width, height)
    scale = min(1.0, 1568 / max(width, height), math.sqrt(1600 * 750 / (width * height)))
    if scale >= 1.0:
        return width, height
    return max(1, math.floor(width * scale)), max(1, math.floor(height * scale))


def claude_image_tokens(width: int, height: int) -> int:
    """Claude image tokens: ceil(w*h / 750) after `claude_resized_size` (1000x1000 -> 1334)."""
    w, h = claude_resized_size(width, height)
    return math.ceil(w * h / 750)


def gemini_image_tokens(width: int, height: int) -> int:
    """Gemini 2.x image tokens (Gemini API docs, "Image understanding" / token counting).

    258 when both sides are <= 384 px; otherwise the image is cut into 768x768 tiles of 258 tokens
    each. Gemini crops and scales before tiling, so this is an estimate on the high side for odd
    sizes. (Gemini 3 models bill by `media_resolution` instead; not covered here.)
    """
    _check_size(width, height)
    if width <= 384 and height <= 384:
        return 258
    return 258 * math.ceil(width / 768) * math.ceil(height / 768)


LLAMA32_TILE_SIZE: Final = 560
LLAMA32_MAX_TILES: Final = 4
# (560 / 14)**2 = 1600 patch embeddings + 1 CLS embedding per tile. Source: Meta's Llama 3.2 Vision
# config (vision_config: image_size 560, patch_size 14, max_num_tiles 4) as used by transformers'
# MllamaVisionModel. These embeddings feed the language model through cross-attention, so they cost
# vision-encoder compute and memory but do not take up context length (the prompt holds one <|image|>).
LLAMA32_TOKENS_PER_TILE: Final = (LLAMA32_TILE_SIZE // 14) ** 2 + 1


def llama32_vision_tiles(width: int, height: int, max_tiles: int = LLAMA32_MAX_TILES,
                        tile_size: int = LLAMA32_TILE_SIZE) -> tuple[int, int]:
    """(tiles across, tiles down) of the canvas Llama 3.2 Vision's processor picks for an image.

    Mirrors transformers' `get_optimal_tiled_canvas`: among all arrangements of at most `max_tiles`
    tiles, take the one needing the least upscaling; if every one needs downscaling, the least
    downscaling; ties go to the smaller canvas.
    """
    _check_size(width, height)
    options: list[tuple[float, int, int, int]] = []  # (scale, area, across, down)
    for across in range(1, max_tiles + 1):
        for down in range(1, max_tiles // across + 1):
            scale = min(across * tile_size / width, down * tile_size / height)
            options.append((scale, across * down, across, down))
    up = [o for o in options if o[0] >= 1]
    best = min(o[0] for o in up) if up else max(o[0] for o in options)
    _, _, across, down = min((o for o in options if o[0] == best), key=lambda o: o[1])
    return across, down


def llama32_vision_image_tokens(width: int, height: int) -> int:
    """Llama 3.2 Vision (11B/90B) vision embeddings for one image: tiles (at most 4) x 1601."""
    across, down = llama32_vision_tiles(width, height)
    return across * down * LLAMA32_TOKENS_PER_TILE


def _qwen_default(width: int, height: int) -> int:
    return qwen2_vl_image_tokens(width, height)


def _gpt4o_high(width: int, height: int) -> int:
    return gpt4o_image_tokens(width, height, "high")


# Read-only on purpose: the family table is configuration, not state anyone may change at run time.
IMAGE_TOKEN_FAMILIES: Final[Mapping[str, Callable[[int, int], int]]] = MappingProxyType(
    {
        "qwen2_vl": _qwen_default,
        # Qwen2.5-VL keeps patch 14, merge 2 and the same pixel bounds, hence the same count.
        "qwen2_5_vl": _qwen_default,
        "gpt-4o": _gpt4o_high,
        "claude": claude_image_tokens,
        "gemini": gemini_image_tokens,
        "llama-3.2-vision": llama32_vision_image_tokens,
    }
)


def estimate_image_tokens(family: Any, width: int, height: int) -> int:
    """Image tokens for one image of `width` x `height` px under a model family's rules. `family` is a
    name, or a `transforms.model.token_math.ImageTokenRule` (a family's formula with a model folder's settings)."""
    if hasattr(family, "tokens"):
        return int(family.tokens(width, height))
    fn = IMAGE_TOKEN_FAMILIES.get(family)
    if fn is None:
        from transforms.model.token_math import DEFAULT_RULES  # the open-weight families' published defaults

        if family not in DEFAULT_RULES:
            known = ", ".join([*IMAGE_TOKEN_FAMILIES, *(f for f in DEFAULT_RULES if f not in IMAGE_TOKEN_FAMILIES)])
            raise ValueError(f"unknown model family {family!r}; known: {known}")
        return DEFAULT_RULES[family].tokens(width, height)
    return fn(width, height)


def text_tokens_estimate(text: str) -> int:
    """Rough text-token count: ceil(characters / 4).

    A rule of thumb for English with BPE tokenizers, good enough to size batches and budgets; it is
    not a tokenizer. The exact count is what the engine reports after tokenising the prompt.
    """
    return math.ceil(len(text) / 4)


def fit_to_token_budget(
    width: int, height: int, max_image_tokens: int, family: Any = "qwen2_vl"
) -> tuple[int, int] | None:
    """Largest (width, height), same aspect ratio, whose image-token estimate is <= max_image_tokens.

    Never enlarges: if the image already fits it comes back unchanged (upscaling adds tokens, not
    information). Returns None if even a 1 px long side does not fit (e.g. a budget below the family's
    minimum). Binary search over the long side: the estimates grow with size, up to rounding steps that
    can only make the result a few pixels smaller than the true optimum, never over budget.
    Raises ValueError for an unknown family, or an image the family refuses at full size.
    """
    _check_size(width, height)
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
              family: Any) -> tuple[int, int] | None:
    """The size a page image goes to the model at, beside a prompt of text_tokens and max_tokens of output in
    max_model_len: as it is when its tokens fit the room left, else shrunk to fit (`fit_to_token_budget`), or
    None when nothing fits (the page fails as over_token_budget). The engine stage (`transforms.extract.feed.prepare`)
    and `pagemill estimate` both decide with this."""
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


def api_cost_usd(provider: str, input_tokens: float, output_tokens: float, prices: Mapping[str, Any]) -> float:
    """List-price cost in USD of one call (or a sum of calls) to a hosted API, from `load_prices()`."""
    if input_tokens < 0 or output_tokens < 0:
        raise ValueError("token counts must be >= 0")
    p = _provider(provider, prices)
    usd_in = input_tokens * float(p["input_usd_per_mtok"])
    usd_out = output_tokens * float(p["output_usd_per_mtok"])
    return (usd_in + usd_out) / 1e6


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


def _check_size(width: int, height: int) -> None:
    if width < 1 or height < 1:
        raise ValueError(f"image size must be positive, got {width}x{height}")
