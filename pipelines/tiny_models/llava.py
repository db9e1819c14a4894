"""A tiny random LLaVA-NeXT (LLaVA-1.6) model: CLIP vision tower + Llama text model, anyres tiling.

The processor settings are those of llava-hf/llava-v1.6-*: 336 px tiles, patch 14, the five grid
pinpoints, "default" feature selection (the CLS embedding dropped), so a page gets as many `<image>`
tokens as it would with the production model. Built like every tiny model (common.py): locally trained
tokenizer, seeded random weights, no hub.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipelines.tiny_models.common import MAX_POSITION_EMBEDDINGS, build_tokenizer, save_seeded_model
from pipelines.tiny_models.qwen2_vl import QWEN2_VL_CHAT_TEMPLATE

TILE = 336
PATCH = 14
GRID_PINPOINTS = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>")


def chat_template() -> str:
    """Qwen2-VL's template with LLaVA's single `<image>` placeholder."""
    return QWEN2_VL_CHAT_TEMPLATE.replace("<|vision_start|><|image_pad|><|vision_end|>", "<image>")


def _canonical_weights(out: Path) -> None:
    """transformers 5 saves the CLIP tower as `vision_tower.embeddings...`; hub checkpoints (and vLLM's
    loader) say `vision_tower.vision_model.embeddings...`."""
    from safetensors.torch import load_file, save_file

    f = out / "model.safetensors"
    fixed = {}
    for key, value in load_file(f).items():
        for prefix in ("vision_tower.", "model.vision_tower."):
            if key.startswith(prefix) and not key.startswith(prefix + "vision_model."):
                key = prefix + "vision_model." + key[len(prefix):]
        fixed[key] = value.contiguous()
    save_file(fixed, f, metadata={"format": "pt"})


def _processor(out: Path, tok: Any) -> None:
    from transformers import LlavaNextProcessor
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil

    image = LlavaNextImageProcessorPil(size={"shortest_edge": TILE}, crop_size={"height": TILE, "width": TILE},
                                       image_grid_pinpoints=GRID_PINPOINTS)
    proc = LlavaNextProcessor(image_processor=image, tokenizer=tok, patch_size=PATCH,
                              vision_feature_select_strategy="default", num_additional_image_tokens=1,
                              chat_template=chat_template())
    proc.save_pretrained(out)
    # The generic class name: the torchvision backend where it works, PIL elsewhere. transformers 5 nests
    # the image processor in processor_config.json; a flat preprocessor_config.json is written as well,
    # so that token math (transforms/model/token_math.py) and older readers find the settings in one place.
    image_cfg: dict[str, Any] = {}
    for name in ("processor_config.json", "preprocessor_config.json"):
        path = out / name
        if path.exists():
            cfg = json.loads(path.read_text())
            target = cfg.get("image_processor", cfg)
            if "image_processor_type" in target:
                target["image_processor_type"] = "LlavaNextImageProcessor"
            image_cfg = image_cfg or dict(target)
            path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    if not (out / "preprocessor_config.json").exists():
        (out / "preprocessor_config.json").write_text(json.dumps(image_cfg, indent=2, sort_keys=True) + "\n")


def make_llava_next(out: Path, seed: int) -> Path:
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaNextConfig, LlavaNextForConditionalGeneration

    tok = build_tokenizer(out, seed, SPECIAL_TOKENS, chat_template())
    vocab = tok.get_vocab()
    vocab_size = ((len(tok) + 63) // 64) * 64
    text = LlamaConfig(vocab_size=vocab_size, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                       max_position_embeddings=MAX_POSITION_EMBEDDINGS, rms_norm_eps=1e-6,
                       bos_token_id=vocab["<|endoftext|>"], eos_token_id=vocab["<|im_end|>"],
                       pad_token_id=vocab["<|endoftext|>"], tie_word_embeddings=False)
    vision = CLIPVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                              image_size=TILE, patch_size=PATCH, projection_dim=64)
    config = LlavaNextConfig(vision_config=vision, text_config=text, image_token_index=vocab["<image>"],
                             image_grid_pinpoints=GRID_PINPOINTS, image_seq_length=(TILE // PATCH) ** 2,
                             projector_hidden_act="gelu", vision_feature_select_strategy="default",
                             vision_feature_layer=-2, tie_word_embeddings=False)
    save_seeded_model(out, LlavaNextForConditionalGeneration, config, tok, seed)
    _canonical_weights(out)
    _processor(out, tok)
    return out
