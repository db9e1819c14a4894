"""Image tokens per model family, with the numbers read from the model folder's own processor config.

An `ImageTokenRule` is a family's formula plus its parameters (patch size, merge size, pixel bounds, tile
size, grid pinpoints, tile counts). `rule_for(family, model)` reads them from `model`'s config.json and
preprocessor_config.json (processor_config.json's nested `image_processor` for transformers 5 folders)
when `model` is a local folder, else takes the published defaults of the family's released checkpoints.
Pure apart from reading those two files; no transformers, no torch.

Formulas (each mirrors the reference processor; tests/transforms/model/test_token_math.py checks each against
transformers' or vLLM's own code, and against the engine's prompt where a tiny model of the family runs):
- qwen2_vl / qwen2_5_vl: `smart_resize` then (h/patch)*(w/patch)/merge**2 (transforms/model/budget.py);
- llava: one fixed crop, (crop/patch)**2 ("default" feature selection drops the CLS embedding);
- llava_next: anyres: the grid pinpoint that keeps the most resolution, the base tile's features, the
  unpadded grid features and one newline feature per grid row (LlavaNextProcessor._get_number_of_features);
- internvl2: dynamic tiles of image_size px (the closest aspect ratio with min..max tiles), a thumbnail tile
  when there is more than one, (image_size/patch)**2 * downsample_ratio**2 tokens each;
- llama-3.2-vision: at most max_image_tiles tiles of 560 px (transforms/model/budget.py), (560/14)**2 + 1 each;
- idefics3 (granite-docling, SmolVLM): the long side scaled to `size.longest_edge`, both sides rounded up to
  tiles of `max_image_size`, one image per tile plus a global one when there is more than one tile,
  image_seq_len = (image_size/patch)**2 / scale_factor**2 tokens each.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transforms.model import budget

# config.json `model_type` -> family name.
MODEL_TYPES = {"qwen2_vl": "qwen2_vl", "qwen2_5_vl": "qwen2_5_vl", "llava": "llava", "llava_next": "llava_next",
               "internvl_chat": "internvl2", "internvl": "internvl2", "mllama": "llama-3.2-vision",
               "idefics3": "idefics3"}
LLAVA_NEXT_PINPOINTS = ((336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008))


@dataclass(frozen=True)
class ImageTokenRule:
    """One family's image-token formula and its parameters. `source` says where they were read."""

    family: str
    patch_size: int = 14
    merge_size: int = 2
    min_pixels: int = budget.QWEN_MIN_PIXELS
    max_pixels: int = budget.QWEN_MAX_PIXELS
    tile_size: int = 0
    grid_pinpoints: tuple[tuple[int, int], ...] = ()
    min_tiles: int = 1
    max_tiles: int = 0
    thumbnail: bool = False
    downsample_ratio: float = 0.5
    longest_edge: int = 0  # idefics3: the long side an image is scaled to before tiling
    seq_len: int = 0  # idefics3: tokens per tile
    source: str = "published defaults"

    def tokens(self, width: int, height: int) -> int:
        f = self.family
        if f in ("qwen2_vl", "qwen2_5_vl"):
            return budget.qwen2_vl_image_tokens(width, height, patch_size=self.patch_size, merge_size=self.merge_size,
                                                min_pixels=self.min_pixels, max_pixels=self.max_pixels)
        if f == "llava":
            _check(width, height)
            return (self.tile_size // self.patch_size) ** 2
        if f == "llava_next":
            return llava_next_image_tokens(width, height, self.tile_size, self.patch_size, self.grid_pinpoints)
        if f == "internvl2":
            tiles = internvl_tiles(width, height, self.tile_size, self.min_tiles, self.max_tiles)
            tiles += 1 if self.thumbnail and tiles != 1 else 0
            return tiles * int((self.tile_size // self.patch_size) ** 2 * self.downsample_ratio ** 2)
        if f == "llama-3.2-vision":
            across, down = budget.llama32_vision_tiles(width, height, self.max_tiles, self.tile_size)
            return across * down * ((self.tile_size // self.patch_size) ** 2 + 1)
        if f == "idefics3":
            return idefics3_images(width, height, self.longest_edge, self.tile_size) * self.seq_len
        raise ValueError(f"no image-token rule for family {f!r}")


DEFAULT_RULES = {
    "qwen2_vl": ImageTokenRule("qwen2_vl"),
    "qwen2_5_vl": ImageTokenRule("qwen2_5_vl"),
    "llava": ImageTokenRule("llava", tile_size=336),
    "llava_next": ImageTokenRule("llava_next", tile_size=336, grid_pinpoints=LLAVA_NEXT_PINPOINTS),
    "internvl2": ImageTokenRule("internvl2", tile_size=448, min_tiles=1, max_tiles=12, thumbnail=True),
    # HuggingFaceM4/Idefics3-8B-Llama3: 364 px tiles of 169 tokens, the long side at 4 x 364.
    "idefics3": ImageTokenRule("idefics3", tile_size=364, longest_edge=4 * 364, seq_len=169),
    "llama-3.2-vision": ImageTokenRule("llama-3.2-vision", tile_size=budget.LLAMA32_TILE_SIZE,
                                       max_tiles=budget.LLAMA32_MAX_TILES),
}


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
    _check(width, height)
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
    _check(width, height)
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
    _check(width, height)
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


def _read(folder: Path, name: str) -> dict[str, Any]:
    path = folder / name
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _side(value: Any, default: int) -> int:
    if isinstance(value, dict):
        return int(value.get("height") or value.get("shortest_edge") or default)
    return int(value) if value else default


def _first(value: Any, default: int) -> int:
    """A size that configs write as a number or as [height, width]."""
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return int(value) if value else default


def rule_for(family: str, model: str | None = None) -> ImageTokenRule:
    """The family's rule, with its parameters read from `model` when it is a local folder (its config.json
    `model_type` also names the family there). A hub id or a missing folder: the published defaults."""
    folder = Path(model).expanduser() if model else None
    if folder is None or not (folder / "config.json").is_file():
        if family not in DEFAULT_RULES:
            raise ValueError(f"unknown model family {family!r}; known: {', '.join(DEFAULT_RULES)}")
        return DEFAULT_RULES[family]
    config = _read(folder, "config.json")
    if family not in DEFAULT_RULES and str(config.get("model_type")) not in MODEL_TYPES:
        raise ValueError(f"unknown model family {family!r}; known: {', '.join(DEFAULT_RULES)}")
    if str(config.get("model_type")) not in MODEL_TYPES:
        # An architecture without a rule here: its processor's keys mean other things (a `size.longest_edge`
        # may be a side, not a pixel count), so --model-family's published defaults apply.
        return DEFAULT_RULES[family]
    family = MODEL_TYPES[str(config.get("model_type"))]
    pre = _read(folder, "preprocessor_config.json") or _read(folder, "processor_config.json").get("image_processor", {})
    vision = config.get("vision_config") or {}
    base = DEFAULT_RULES[family]
    source = f"{folder.name}/preprocessor_config.json + config.json"
    if family in ("qwen2_vl", "qwen2_5_vl"):
        size = pre.get("size") or {}
        return ImageTokenRule(family, patch_size=int(pre.get("patch_size") or vision.get("patch_size") or 14),
                              merge_size=int(pre.get("merge_size") or vision.get("spatial_merge_size") or 2),
                              min_pixels=int(size.get("shortest_edge") or pre.get("min_pixels") or base.min_pixels),
                              max_pixels=int(size.get("longest_edge") or pre.get("max_pixels") or base.max_pixels),
                              source=source)
    patch = _first(vision.get("patch_size"), 14)
    if family == "llava":
        return ImageTokenRule(family, patch_size=patch, tile_size=_side(pre.get("crop_size"), base.tile_size),
                              source=source)
    if family == "llava_next":
        points = config.get("image_grid_pinpoints") or pre.get("image_grid_pinpoints") or base.grid_pinpoints
        return ImageTokenRule(family, patch_size=patch, tile_size=_side(pre.get("crop_size"), base.tile_size),
                              grid_pinpoints=tuple((int(h), int(w)) for h, w in points), source=source)
    if family == "internvl2":
        # InternVL's own layout (config.json: force_image_size, *_dynamic_patch) or transformers' native one
        # (the processor's size, min_patches / max_patches; a thumbnail whenever a page is cut into tiles).
        return ImageTokenRule(family, patch_size=patch,
                              tile_size=int(config.get("force_image_size") or _side(pre.get("size"), 0)
                                            or _first(vision.get("image_size"), 448)),
                              min_tiles=int(config.get("min_dynamic_patch") or pre.get("min_patches") or 1),
                              max_tiles=int(config.get("max_dynamic_patch") or pre.get("max_patches") or 12),
                              thumbnail=bool(config.get("use_thumbnail", True)),
                              downsample_ratio=float(config.get("downsample_ratio") or 0.5), source=source)
    if family == "idefics3":
        size, tile = pre.get("size") or {}, pre.get("max_image_size") or {}
        image_size, scale = _first(vision.get("image_size"), 364), int(config.get("scale_factor") or 2)
        return ImageTokenRule(family, patch_size=patch, tile_size=int(tile.get("longest_edge") or base.tile_size),
                              longest_edge=int(size.get("longest_edge") or base.longest_edge),
                              seq_len=int((image_size // patch) ** 2 / scale ** 2), source=source)
    return ImageTokenRule(family, patch_size=patch, tile_size=_side(pre.get("size"), base.tile_size),
                          max_tiles=int(pre.get("max_image_tiles") or base.max_tiles), source=source)


def _check(width: int, height: int) -> None:
    if width < 1 or height < 1:
        raise ValueError(f"image size must be positive, got {width}x{height}")
