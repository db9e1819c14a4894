"""transforms/model/token_math.py: each family's image tokens against the reference implementation (transformers'
processors, vLLM's own InternVL code), with the parameters read from a model folder."""
from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from transforms.model import budget
from transforms.model.token_math import DEFAULT_RULES, ImageTokenRule, estimate_image_tokens, rule_for

SIZES = [(595, 842), (1288, 910), (300, 200), (1288, 1288), (64, 1288), (1288, 40), (1000, 999), (2480, 3508)]
random.seed(7)
SIZES += [(random.randint(28, 3000), random.randint(28, 3000)) for _ in range(40)]


@pytest.fixture(scope="module",
                params=[("llava_next", "<image>"), ("internvl", "<IMG_CONTEXT>"), ("idefics3", "<image>")])
def tiny(request: pytest.FixtureRequest, tiny_model: Callable[[str], Path]) -> tuple[Path, str]:
    family, token = request.param
    return tiny_model(family), token


def test_qwen_parameters_come_from_the_folder(tmp_path: Path) -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    # A folder whose processor allows fewer pixels than the published default: the rule must follow it.
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl", "vision_config": {}}))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(
        {"patch_size": 14, "merge_size": 2, "min_pixels": 200704, "max_pixels": 1003520}))
    rule = rule_for("qwen2_vl", str(tmp_path))
    assert rule.family == "qwen2_5_vl" and (rule.min_pixels, rule.max_pixels) == (200704, 1003520)
    for w, h in SIZES[:20]:
        rh, rw = smart_resize(h, w, factor=28, min_pixels=200704, max_pixels=1003520)
        assert rule.tokens(w, h) == (rh // 14) * (rw // 14) // 4, (w, h)
    assert rule.tokens(2480, 3508) < DEFAULT_RULES["qwen2_5_vl"].tokens(2480, 3508)


def test_a_folder_of_another_architecture_keeps_the_family_defaults(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "pixtral"}))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"size": {"longest_edge": 1024}}))
    assert rule_for("qwen2_vl", str(tmp_path)) == DEFAULT_RULES["qwen2_vl"]
    with pytest.raises(ValueError, match="unknown model family"):
        rule_for("pixtral", str(tmp_path))


def test_hub_ids_and_missing_folders_take_the_published_defaults() -> None:
    assert rule_for("qwen2_5_vl", "allenai/olmOCR-2-7B-1025") == DEFAULT_RULES["qwen2_5_vl"]
    assert rule_for("llava_next", None).grid_pinpoints == DEFAULT_RULES["llava_next"].grid_pinpoints
    with pytest.raises(ValueError, match="unknown model family"):
        rule_for("pixtral", None)


def test_tiled_families_match_the_transformers_processor(tiny: tuple[Path, str]) -> None:
    from PIL import Image
    from transformers import AutoProcessor

    folder, token = tiny
    processor = AutoProcessor.from_pretrained(str(folder))
    image_id = processor.tokenizer.convert_tokens_to_ids(token)
    rule = rule_for("qwen2_vl", str(folder))  # the folder's model_type names the family
    assert (rule.family, rule.tile_size) in (("llava_next", 336), ("internvl2", 448), ("idefics3", 364))
    for w, h in SIZES[:12]:
        ids = processor(text=token, images=Image.new("RGB", (w, h)), return_tensors="np")["input_ids"][0]
        assert rule.tokens(w, h) == int((ids == image_id).sum()), (w, h)


def test_internvl2_matches_vllm_internvl_code() -> None:
    from vllm.transformers_utils.processors.internvl import calculate_internvl_targets, get_internvl_target_ratios

    rule = DEFAULT_RULES["internvl2"]
    ratios = get_internvl_target_ratios(1, 12)
    for w, h in SIZES:
        blocks, _, _ = calculate_internvl_targets(orig_width=w, orig_height=h, target_ratios=ratios, image_size=448,
                                                  use_thumbnail=True)
        assert rule.tokens(w, h) == blocks * 256, (w, h)


def test_internvl2_parameters_from_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "internvl_chat", "force_image_size": 448, "downsample_ratio": 0.5, "max_dynamic_patch": 6,
        "min_dynamic_patch": 1, "use_thumbnail": False, "vision_config": {"patch_size": 14}}))
    rule = rule_for("internvl2", str(tmp_path))
    assert (rule.max_tiles, rule.thumbnail) == (6, False)
    assert max(rule.tokens(w, h) for w, h in SIZES) <= 6 * 256 < max(DEFAULT_RULES["internvl2"].tokens(w, h)
                                                                     for w, h in SIZES)


def test_llama32_rule_matches_transformers_canvas() -> None:
    from transformers.models.mllama.image_processing_pil_mllama import get_optimal_tiled_canvas

    rule = DEFAULT_RULES["llama-3.2-vision"]
    for w, h in SIZES:
        ch, cw = get_optimal_tiled_canvas(image_height=h, image_width=w, max_image_tiles=4, tile_size=560)
        assert rule.tokens(w, h) == (ch // 560) * (cw // 560) * 1601, (w, h)


def test_budget_takes_a_rule_or_a_name() -> None:
    rule = ImageTokenRule("qwen2_vl", min_pixels=3136, max_pixels=256 * 28 * 28)
    assert estimate_image_tokens(rule, 2480, 3508) <= 256
    # 336 x 336 by hand: the 336x672 pinpoint keeps all pixels and wastes least; its 24 x 48 grid is unpadded to
    # 24 x 24 (square image), so 576 (base tile) + 576 (grid) + 24 (one newline a row) = 1176.
    assert estimate_image_tokens("llava_next", 336, 336) == 1176
    size = budget.fit_to_token_budget(2480, 3508, 100, rule)
    assert size is not None and rule.tokens(*size) <= 100


def test_idefics3_tiles_match_the_transformers_image_processor() -> None:
    import numpy as np
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    rule = DEFAULT_RULES["idefics3"]
    processor = Idefics3ImageProcessorPil()  # Idefics3-8B's defaults: long side 1456, 364 px tiles
    for w, h in [*SIZES[:16], (364, 364), (100, 80), (1456, 365)]:
        out = processor(np.zeros((h, w, 3), dtype=np.uint8), return_row_col_info=True)
        rows, cols = out["rows"][0][0], out["cols"][0][0]
        images = rows * cols + 1 if rows * cols else 1  # the tiles and the global image, or one image
        assert rule.tokens(w, h) == images * 169, (w, h, rows, cols)


def test_idefics3_parameters_from_config(tmp_path: Path) -> None:
    # granite-docling's layout: 512 px tiles of SigLIP patch 16, scale factor 4: 64 tokens a tile.
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "idefics3", "scale_factor": 4,
                                                      "vision_config": {"image_size": 512, "patch_size": 16}}))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(
        {"size": {"longest_edge": 2048}, "max_image_size": {"longest_edge": 512}}))
    rule = rule_for("qwen2_vl", str(tmp_path))
    assert (rule.family, rule.tile_size, rule.longest_edge, rule.seq_len) == ("idefics3", 512, 2048, 64)
    assert rule.tokens(2048, 2048) == (4 * 4 + 1) * 64
