"""Which image-token rule a model follows, with the numbers read from the model folder's own processor config.

An `ImageTokenRule` is a family's formula plus its parameters (patch size, merge size, pixel bounds, tile
size, grid pinpoints, tile counts). `rule_for(family, model)` reads them from `model`'s config.json and
preprocessor_config.json (processor_config.json's nested `image_processor` for transformers 5 folders)
when `model` is a local folder, else takes the published defaults of the family's released checkpoints.
Pure apart from reading those two files; no transformers, no torch. `estimate_image_tokens(family, w, h)` is
the one entry every caller counts an image with. The formulas themselves are in transforms/model/image_tokens.py.

Formulas (each mirrors the reference processor; tests/transforms/model/test_token_math.py checks each against
transformers' or vLLM's own code, and against the engine's prompt where a tiny model of the family runs):
- qwen2_vl / qwen2_5_vl: `smart_resize` then (h/patch)*(w/patch)/merge**2;
- llava: one fixed crop, (crop/patch)**2 ("default" feature selection drops the CLS embedding);
- llava_next: anyres: the grid pinpoint that keeps the most resolution, the base tile's features, the
  unpadded grid features and one newline feature per grid row (LlavaNextProcessor._get_number_of_features);
- internvl2: dynamic tiles of image_size px (the closest aspect ratio with min..max tiles), a thumbnail tile
  when there is more than one, (image_size/patch)**2 * downsample_ratio**2 tokens each;
- llama-3.2-vision: at most max_image_tiles tiles of 560 px, (560/14)**2 + 1 each;
- idefics3 (granite-docling, SmolVLM): the long side scaled to `size.longest_edge`, both sides rounded up to
  tiles of `max_image_size`, one image per tile plus a global one when there is more than one tile,
  image_seq_len = (image_size/patch)**2 / scale_factor**2 tokens each.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transforms.model import image_tokens

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
    min_pixels: int = image_tokens.QWEN_MIN_PIXELS
    max_pixels: int = image_tokens.QWEN_MAX_PIXELS
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
            return image_tokens.qwen2_vl_image_tokens(width, height, patch_size=self.patch_size,
                                                      merge_size=self.merge_size, min_pixels=self.min_pixels,
                                                      max_pixels=self.max_pixels)
        if f == "llava":
            image_tokens.check_size(width, height)
            return (self.tile_size // self.patch_size) ** 2
        if f == "llava_next":
            return image_tokens.llava_next_image_tokens(width, height, self.tile_size, self.patch_size,
                                                        self.grid_pinpoints)
        if f == "internvl2":
            tiles = image_tokens.internvl_tiles(width, height, self.tile_size, self.min_tiles, self.max_tiles)
            tiles += 1 if self.thumbnail and tiles != 1 else 0
            return tiles * int((self.tile_size // self.patch_size) ** 2 * self.downsample_ratio ** 2)
        if f == "llama-3.2-vision":
            across, down = image_tokens.llama32_vision_tiles(width, height, self.max_tiles, self.tile_size)
            return across * down * ((self.tile_size // self.patch_size) ** 2 + 1)
        if f == "idefics3":
            return image_tokens.idefics3_images(width, height, self.longest_edge, self.tile_size) * self.seq_len
        raise ValueError(f"no image-token rule for family {f!r}")


DEFAULT_RULES = {
    "qwen2_vl": ImageTokenRule("qwen2_vl"),
    "qwen2_5_vl": ImageTokenRule("qwen2_5_vl"),
    "llava": ImageTokenRule("llava", tile_size=336),
    "llava_next": ImageTokenRule("llava_next", tile_size=336, grid_pinpoints=LLAVA_NEXT_PINPOINTS),
    "internvl2": ImageTokenRule("internvl2", tile_size=448, min_tiles=1, max_tiles=12, thumbnail=True),
    # HuggingFaceM4/Idefics3-8B-Llama3: 364 px tiles of 169 tokens, the long side at 4 x 364.
    "idefics3": ImageTokenRule("idefics3", tile_size=364, longest_edge=4 * 364, seq_len=169),
    "llama-3.2-vision": ImageTokenRule("llama-3.2-vision", tile_size=image_tokens.LLAMA32_TILE_SIZE,
                                       max_tiles=image_tokens.LLAMA32_MAX_TILES),
}


def estimate_image_tokens(family: str | ImageTokenRule, width: int, height: int) -> int:
    """Image tokens for one image of `width` x `height` px under a model family's rules. `family` is a name (a
    hosted API's or an open-weight family's, at its published defaults) or an `ImageTokenRule` (a family's
    formula with a model folder's settings, from `rule_for`)."""
    if isinstance(family, ImageTokenRule):
        return family.tokens(width, height)
    fn = image_tokens.IMAGE_TOKEN_FAMILIES.get(family)
    if fn is not None:
        return fn(width, height)
    if family not in DEFAULT_RULES:
        named = image_tokens.IMAGE_TOKEN_FAMILIES
        known = ", ".join([*named, *(f for f in DEFAULT_RULES if f not in named)])
        raise ValueError(f"unknown model family {family!r}; known: {known}")
    return DEFAULT_RULES[family].tokens(width, height)


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

