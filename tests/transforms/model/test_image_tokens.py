"""Tests for transforms/model/image_tokens.py: each family's image-token rule against the vendors' published
examples, hand-derived boundaries and (Qwen2-VL, Llama 3.2 Vision) transformers' own processors."""

from __future__ import annotations

import random

import pytest

from transforms.model.image_tokens import (
    claude_image_tokens,
    claude_resized_size,
    gemini_image_tokens,
    gpt4o_image_tokens,
    llama32_vision_image_tokens,
    llama32_vision_tiles,
    qwen2_vl_image_tokens,
    qwen2_vl_resized_size,
)

# Sizes that hit every branch of smart_resize: tiny (min_pixels), sides under factor/2 (round to 0),
# typical pages and screenshots, .5 rounding ties (banker's rounding), and huge (max_pixels).
QWEN_SIZES: list[tuple[int, int]] = [
    (1, 1), (10, 10), (13, 200), (14, 14), (27, 27), (28, 28), (42, 42), (70, 98), (56, 56),
    (100, 300), (5, 1000), (224, 224), (595, 842), (612, 792), (1000, 1288), (1288, 1000),
    (1240, 1754), (1920, 1080), (2480, 3508), (4000, 3000), (5000, 5000), (8000, 200),
    (20000, 100), (12000, 9000),
]


def _qwen_sizes() -> list[tuple[int, int]]:
    rnd = random.Random(1234)
    sizes = list(QWEN_SIZES)
    for _ in range(300):
        w, h = rnd.randint(1, 6000), rnd.randint(1, 6000)
        if max(w, h) / min(w, h) <= 200:
            sizes.append((w, h))
    return sizes


def test_qwen_matches_transformers_smart_resize() -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    for w, h in _qwen_sizes():
        for min_px, max_px in ((3136, 12845056), (3136, 50176), (256 * 28 * 28, 1280 * 28 * 28)):
            rh, rw = smart_resize(h, w, factor=28, min_pixels=min_px, max_pixels=max_px)
            assert qwen2_vl_resized_size(w, h, min_pixels=min_px, max_pixels=max_px) == (rw, rh), (w, h)
            assert qwen2_vl_image_tokens(w, h, min_pixels=min_px, max_pixels=max_px) == rh * rw // (28 * 28)


def _grid_tokens(processor: object, w: int, h: int) -> int:
    from PIL import Image

    out = processor(images=[Image.new("RGB", (w, h), "white")], return_tensors="np")  # type: ignore[operator]
    t, gh, gw = (int(x) for x in out["image_grid_thw"][0])
    return t * gh * gw // 4


PROCESSOR_SIZES = [(1, 1), (13, 200), (595, 842), (1288, 1000), (1000, 1288), (1920, 1080), (300, 4000)]


def test_qwen_matches_pil_image_processor() -> None:
    """The real processor (PIL backend, no torchvision) yields the grid the estimate predicts."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    proc = Qwen2VLImageProcessorPil(
        min_pixels=3136, max_pixels=12845056, patch_size=14, merge_size=2, temporal_patch_size=2
    )
    for w, h in PROCESSOR_SIZES:
        assert _grid_tokens(proc, w, h) == qwen2_vl_image_tokens(w, h), (w, h)


def test_qwen_matches_torchvision_image_processor() -> None:
    """Same check against `Qwen2VLImageProcessor`, the class vLLM imports (torchvision backend)."""
    try:
        # Imported through transformers, as vLLM does; a CUDA-only torchvision wheel on a CPU machine
        # fails with RuntimeError ("operator torchvision::nms does not exist"), not ImportError.
        from transformers import Qwen2VLImageProcessor

        proc = Qwen2VLImageProcessor(
            min_pixels=3136, max_pixels=12845056, patch_size=14, merge_size=2, temporal_patch_size=2
        )
    except (ImportError, RuntimeError, OSError) as e:
        pytest.skip(f"torchvision-backed Qwen2VLImageProcessor unavailable ({type(e).__name__}: {e})")
    for w, h in PROCESSOR_SIZES:
        assert _grid_tokens(proc, w, h) == qwen2_vl_image_tokens(w, h), (w, h)


def test_qwen_known_values() -> None:
    # 1288x1000 -> 1288x1008 -> 92x72 patches -> 1656 tokens (also measured in vLLM with the test model).
    assert qwen2_vl_resized_size(1288, 1000) == (1288, 1008)
    assert qwen2_vl_image_tokens(1288, 1000) == 1656
    assert qwen2_vl_image_tokens(1, 1) == 4  # min_pixels 3136 = 56x56 -> 2x2 merged tokens
    assert qwen2_vl_image_tokens(100_000, 1000) <= 16384  # max_pixels caps it at 16384
    with pytest.raises(ValueError, match="aspect ratio"):
        qwen2_vl_image_tokens(201, 1)
    with pytest.raises(ValueError):
        qwen2_vl_image_tokens(0, 10)


def test_gpt4o_published_examples() -> None:
    # OpenAI vision guide: 1024x1024 high -> 765; 2048x4096 high -> 1105; any image in low -> 85.
    assert gpt4o_image_tokens(1024, 1024) == 765
    assert gpt4o_image_tokens(2048, 4096) == 1105
    assert gpt4o_image_tokens(4096, 8192, detail="low") == 85
    assert gpt4o_image_tokens(512, 512) == 255  # one tile, not enlarged to 768
    assert gpt4o_image_tokens(100, 100) == 255
    assert gpt4o_image_tokens(1024, 1024, detail="auto") == 765
    with pytest.raises(ValueError):
        gpt4o_image_tokens(10, 10, detail="medium")


def test_claude_published_examples() -> None:
    # Anthropic vision docs: tokens = w*h/750; 200x200 ~54, 1000x1000 ~1334, 1092x1092 ~1590.
    assert claude_image_tokens(200, 200) == 54
    assert claude_image_tokens(1000, 1000) == 1334
    assert claude_image_tokens(1092, 1092) == 1590
    assert claude_resized_size(1092, 1092) == (1092, 1092)  # the largest square that is not resized
    w, h = claude_resized_size(4000, 3000)
    assert max(w, h) <= 1568 and abs(w / h - 4 / 3) < 0.01
    assert claude_image_tokens(4000, 3000) <= 1600
    w, h = claude_resized_size(8000, 1000)  # long-edge cap binds first
    assert w == 1568 and h == 196


def test_gemini() -> None:
    assert gemini_image_tokens(384, 384) == 258
    assert gemini_image_tokens(100, 384) == 258
    assert gemini_image_tokens(385, 100) == 258  # larger than 384 but still one 768 tile
    assert gemini_image_tokens(1024, 1024) == 4 * 258
    assert gemini_image_tokens(1288, 1000) == 4 * 258
    assert gemini_image_tokens(2480, 3508) == 4 * 5 * 258


def test_llama32_vision() -> None:
    assert llama32_vision_image_tokens(560, 560) == 1601
    assert llama32_vision_image_tokens(100, 100) == 1601
    assert llama32_vision_tiles(1120, 560) == (2, 1)
    assert llama32_vision_image_tokens(1120, 1120) == 4 * 1601
    assert llama32_vision_image_tokens(5000, 5000) == 4 * 1601  # never more than 4 tiles
    assert llama32_vision_tiles(5000, 200) == (4, 1)


def test_llama32_tiles_match_transformers() -> None:
    from transformers.models.mllama.image_processing_pil_mllama import get_optimal_tiled_canvas

    rnd = random.Random(7)
    sizes = [(rnd.randint(1, 4000), rnd.randint(1, 4000)) for _ in range(300)] + [(560, 560), (1120, 560)]
    for w, h in sizes:
        canvas_h, canvas_w = get_optimal_tiled_canvas(h, w, 4, 560)
        assert llama32_vision_tiles(w, h) == (canvas_w // 560, canvas_h // 560), (w, h)


def test_boundaries_by_hand() -> None:
    """Sizes at the edges of each published rule, derived by hand."""
    # GPT-4o: 513x100 is not scaled (long side under 2048, short side under 768): 2x1 tiles of 512 -> 2*170+85.
    assert gpt4o_image_tokens(513, 100) == 425
    assert gpt4o_image_tokens(512, 100) == 255
    # Gemini tiles only when a side is over 384: 1000x100 -> ceil(1000/768)=2 x 1 tiles of 258; 769 px -> 2 tiles.
    assert gemini_image_tokens(1000, 100) == 516
    assert gemini_image_tokens(769, 100) == 516
    assert gemini_image_tokens(768, 385) == 258
    # Claude: 15680x5 scales by 1568/15680 = 0.1 -> 1568 x 0.5, and no side goes below 1 px.
    assert claude_resized_size(15680, 5) == (1568, 1)
    assert claude_image_tokens(15680, 5) == 3  # ceil(1568 / 750)
