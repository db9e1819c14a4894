"""A tiny random InternVL (transformers' native layout: InternViT + Qwen2, pixel-shuffle projector).

The processor settings are InternVL's: 448 px tiles, 1 to 12 tiles by aspect ratio plus a thumbnail, patch
14 and downsample ratio 0.5, so 256 `<IMG_CONTEXT>` tokens a tile: a page gets as many image tokens as with
the production model. Built like every tiny model (common.py): local tokenizer, seeded random
weights, no hub.
"""
from __future__ import annotations

from pathlib import Path

from pipelines.tiny_models.common import MAX_POSITION_EMBEDDINGS, build_tokenizer, save_seeded_model
from pipelines.tiny_models.qwen2_vl import QWEN2_VL_CHAT_TEMPLATE

TILE = 448
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<img>", "</img>", "<IMG_CONTEXT>", "<video>")
# The tokenizer attributes InternVLProcessor reads.
EXTRA_TOKENS = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
                "video_token": "<video>"}


def _chat_template() -> str:
    return (QWEN2_VL_CHAT_TEMPLATE.replace("<|vision_start|><|image_pad|><|vision_end|>", "<IMG_CONTEXT>")
            .replace("<|vision_start|><|video_pad|><|vision_end|>", "<video>"))


def make_internvl(out: Path, seed: int) -> Path:
    from transformers import (
        InternVLConfig,
        InternVLForConditionalGeneration,
        InternVLProcessor,
        InternVLVideoProcessor,
        PreTrainedTokenizerFast,
    )
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

    build_tokenizer(out, seed, SPECIAL_TOKENS, _chat_template())
    tok = PreTrainedTokenizerFast.from_pretrained(out, extra_special_tokens=EXTRA_TOKENS)
    tok.save_pretrained(out)
    vocab = tok.get_vocab()
    text = {"model_type": "qwen2", "vocab_size": ((len(tok) + 63) // 64) * 64, "hidden_size": 128,
            "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
            "max_position_embeddings": MAX_POSITION_EMBEDDINGS, "bos_token_id": vocab["<|endoftext|>"],
            "eos_token_id": vocab["<|im_end|>"], "pad_token_id": vocab["<|endoftext|>"], "tie_word_embeddings": False}
    vision = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128,
              "image_size": [TILE, TILE], "patch_size": [14, 14]}
    config = InternVLConfig(vision_config=vision, text_config=text, image_token_id=vocab["<IMG_CONTEXT>"],
                            downsample_ratio=0.5, image_seq_length=256, tie_word_embeddings=False)
    save_seeded_model(out, InternVLForConditionalGeneration, config, tok, seed)
    image = GotOcr2ImageProcessorPil(size={"height": TILE, "width": TILE}, crop_to_patches=True, min_patches=1,
                                     max_patches=12)
    InternVLProcessor(image_processor=image, tokenizer=tok, video_processor=InternVLVideoProcessor(),
                      image_seq_length=256, chat_template=_chat_template()).save_pretrained(out)
    return out
