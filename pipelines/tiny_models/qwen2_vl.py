"""The tiny Qwen2-VL and Qwen2.5-VL (the architecture of olmOCR-2): the real Qwen2-VL chat template,
special tokens and image-processor settings (patch 14, merge 2, temporal patch 2, 3136..12845056 pixels),
so a page produces exactly as many image tokens as it would with the production model."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipelines.tiny_models.common import MAX_POSITION_EMBEDDINGS, build_tokenizer, save_seeded_model

# Names matter: the HF processor and vLLM look these tokens up by their text. The list is the real
# Qwen2-VL one, so prompts built for the production model tokenise to the same special-token layout.
QWEN2_VL_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)

# The chat template shipped with Qwen/Qwen2-VL-*-Instruct (content parts: image, video, text).
QWEN2_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}"
    "{% endif %}"
    "{% endfor %}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Real Qwen2-VL image-processor settings (from the released preprocessor_config.json).
PATCH_SIZE = 14
MERGE_SIZE = 2
TEMPORAL_PATCH_SIZE = 2
MIN_PIXELS = 56 * 56  # 3136
MAX_PIXELS = 28 * 28 * 16384  # 12845056
PROCESSORS = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor"}



def _build_config(vocab: dict[str, int], vocab_size: int, family: str = "qwen2_vl") -> Any:
    from transformers import Qwen2_5_VLConfig, Qwen2VLConfig

    text = {
        "vocab_size": vocab_size,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,  # head_dim 64: a head size vLLM's CPU attention supports
        "num_key_value_heads": 1,
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rms_norm_eps": 1e-6,
        # M-RoPE sections must add up to head_dim / 2 = 32.
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [8, 12, 12]},
        "bos_token_id": vocab["<|endoftext|>"],
        "eos_token_id": vocab["<|im_end|>"],
        "pad_token_id": vocab["<|endoftext|>"],
        "tie_word_embeddings": False,
    }
    vision = {
        "depth": 2,
        "embed_dim": 64,
        "hidden_size": 128,  # the merger's output width: must equal the text hidden size
        "num_heads": 2,
        "mlp_ratio": 2,
        "patch_size": PATCH_SIZE,
        "spatial_merge_size": MERGE_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "in_channels": 3,
    }
    cls = Qwen2VLConfig
    if family == "qwen2_5_vl":
        # Qwen2.5-VL's vision tower: window attention, an MLP with its own width, a merger to the text width.
        vision = {"depth": 2, "hidden_size": 64, "out_hidden_size": 128, "intermediate_size": 128, "num_heads": 2,
                  "patch_size": PATCH_SIZE, "spatial_merge_size": MERGE_SIZE,
                  "temporal_patch_size": TEMPORAL_PATCH_SIZE, "in_channels": 3, "window_size": 112,
                  "fullatt_block_indexes": [1]}
        cls = Qwen2_5_VLConfig
    return cls(
        text_config=text,
        vision_config=vision,
        image_token_id=vocab["<|image_pad|>"],
        video_token_id=vocab["<|video_pad|>"],
        vision_start_token_id=vocab["<|vision_start|>"],
        vision_end_token_id=vocab["<|vision_end|>"],
    )


def _write_processor_config(out: Path, family: str = "qwen2_vl") -> None:
    """Write preprocessor_config.json (+ video and processor configs) directly as JSON.

    Building a Qwen2VLProcessor object needs a working torchvision (its video processor), which the
    CPU environments do not reliably have; the JSON is all that vLLM and transformers read anyway.
    vLLM takes the pixel bounds from size.shortest_edge / size.longest_edge, so both spellings are set.
    """
    common = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "rescale_factor": 0.00392156862745098,
        "patch_size": PATCH_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "merge_size": MERGE_SIZE,
        "min_pixels": MIN_PIXELS,
        "max_pixels": MAX_PIXELS,
        "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
        "resample": 3,
        "processor_class": PROCESSORS[family],
    }
    files = {
        "preprocessor_config.json": {**common, "image_processor_type": "Qwen2VLImageProcessor"},
        "video_preprocessor_config.json": {**common, "video_processor_type": "Qwen2VLVideoProcessor"},
        "processor_config.json": {"processor_class": PROCESSORS[family]},
    }
    for name, cfg in files.items():
        (out / name).write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")




def make_qwen2_vl(out: Path, seed: int, family: str = "qwen2_vl") -> Path:
    """`family`: qwen2_vl or qwen2_5_vl."""
    from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2VLForConditionalGeneration

    tok = build_tokenizer(out, seed, QWEN2_VL_SPECIAL_TOKENS, QWEN2_VL_CHAT_TEMPLATE)
    vocab_size = ((len(tok) + 63) // 64) * 64  # pad embedding rows to a multiple of 64
    config = _build_config(tok.get_vocab(), vocab_size, family)
    model_cls = Qwen2_5_VLForConditionalGeneration if family == "qwen2_5_vl" else Qwen2VLForConditionalGeneration
    save_seeded_model(out, model_cls, config, tok, seed)
    _write_processor_config(out, family)
    return out
