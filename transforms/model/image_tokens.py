"""Image tokens: every model family's rule for how many tokens one image of width x height px costs.

Pure functions, no I/O; `transforms/model/token_math.py` picks a family's rule (and reads its parameters from a
model folder), `transforms/model/budget.py` fits pages and prices them with it.

Only the Qwen2-VL figure is exact (it reproduces the processor's `smart_resize`, and the tests check it
against transformers). The hosted-API figures follow each vendor's published formula; vendors change
them without notice, so treat them as estimates for routing and cost reports, not for billing. The open-weight
families' tiling rules (LLaVA-NeXT, InternVL2, Idefics3, Llama 3.2 Vision) mirror their reference processors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Final

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
    check_size(width, height)
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
    check_size(width, height)
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
    check_size(width, height)
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
    check_size(width, height)
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
    check_size(width, height)
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


def select_best_resolution(height: int, width: int, pinpoints: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    """(height, width) of the grid pinpoint that keeps the most of the image's resolution, then wastes least."""
    best, best_effective, best_waste = pinpoints[0], 0, math.inf
    for h, w in pinpoints:
        scale = min(w / width, h / height)
        effective = min(int(width * scale) * int(height * scale), width * height)
        waste = w * h - effective
        if effective > best_effective or (effective == best_effective and waste < best_waste):
            best, best_effective, best_waste = (h, w), effective, waste
    return best


def llava_next_image_tokens(width: int, height: int, tile: int, patch: int,
                            pinpoints: tuple[tuple[int, int], ...]) -> int:
    """LLaVA-NeXT anyres: base tile features + the grid's features without padding + one newline a row."""
    check_size(width, height)
    best_h, best_w = select_best_resolution(height, width, pinpoints)
    side = tile // patch
    cur_h, cur_w = side * (best_h // tile), side * (best_w // tile)
    if width / height > cur_w / cur_h:
        new_h = int(round(height * (cur_w / width), 7))
        cur_h -= 2 * ((cur_h - new_h) // 2)
    else:
        new_w = int(round(width * (cur_h / height), 7))
        cur_w -= 2 * ((cur_w - new_w) // 2)
    return side * side + cur_h * cur_w + cur_h


def internvl_tiles(width: int, height: int, tile: int, min_tiles: int, max_tiles: int) -> int:
    """InternVL2 `dynamic_preprocess`: tiles of the grid (i x j, min..max tiles) closest in aspect ratio;
    on a tie, the larger grid when the image has over half its pixels."""
    check_size(width, height)
    ratios = sorted({(i, j) for n in range(min_tiles, max_tiles + 1) for i in range(1, n + 1)
                     for j in range(1, n + 1) if min_tiles <= i * j <= max_tiles}, key=lambda r: r[0] * r[1])
    aspect, best, best_diff = width / height, (1, 1), math.inf
    for i, j in ratios:
        diff = abs(aspect - i / j)
        if diff < best_diff:
            best, best_diff = (i, j), diff
        elif diff == best_diff and width * height > 0.5 * tile * tile * i * j:
            best = (i, j)
    return best[0] * best[1]


def idefics3_images(width: int, height: int, longest_edge: int, tile: int) -> int:
    """Images (tiles + the global one) Idefics3's processor makes of a page: its resize to `longest_edge`
    (long side exact, short side by the aspect ratio, rounded up to even), then to whole tiles of `tile` px
    (the short side from the resized image's own aspect ratio, as `resize_for_vision_encoder` does)."""
    check_size(width, height)
    if width >= height:
        w, h = longest_edge, int(longest_edge / (width / height))
        h += h % 2
    else:
        h, w = longest_edge, int(longest_edge * (width / height))
        w += w % 2
    h, w = max(h, 1), max(w, 1)
    if w >= h:
        tiled_w = math.ceil(w / tile) * tile
        tiled_h = math.ceil(int(tiled_w / (w / h)) / tile) * tile
    else:
        tiled_h = math.ceil(h / tile) * tile
        tiled_w = math.ceil(int(tiled_h * (w / h)) / tile) * tile
    if tiled_h > tile or tiled_w > tile:
        return (tiled_h // tile) * (tiled_w // tile) + 1
    return 1


def check_size(width: int, height: int) -> None:
    """The one size check every rule starts with (a 0 px side is a caller's error, not 0 tokens)."""
    if width < 1 or height < 1:
        raise ValueError(f"image size must be positive, got {width}x{height}")
