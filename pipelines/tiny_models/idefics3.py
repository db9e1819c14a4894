"""A tiny random Idefics3 (the architecture of granite-docling and SmolVLM: SigLIP + Llama, pixel shuffle).

The processor settings are Idefics3-8B's: the long side scaled to 1456 px, 364 px tiles plus a global image,
patch 14 and scale factor 2, so 169 `<image>` tokens a tile: a page gets as many image tokens as with the
production model. Built like every tiny model (common.py): local tokenizer, seeded random weights,
no hub.
"""
from __future__ import annotations

from pathlib import Path

from pipelines.tiny_models.common import MAX_POSITION_EMBEDDINGS, build_tokenizer, save_seeded_model
from pipelines.tiny_models.llava import chat_template

# The tokens Idefics3Processor puts around each tile (`<row_r_col_c>` for a grid of up to 6 x 6).
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<fake_token_around_image>",
                  "<global-img>", "<end_of_utterance>",
                  *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)))


def make_idefics3(out: Path, seed: int) -> Path:
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    tok = build_tokenizer(out, seed, SPECIAL_TOKENS, chat_template())
    vocab = tok.get_vocab()
    text = {"model_type": "llama", "vocab_size": ((len(tok) + 63) // 64) * 64, "hidden_size": 128,
            "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 64, "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
            "bos_token_id": vocab["<|endoftext|>"], "eos_token_id": vocab["<|im_end|>"],
            "pad_token_id": vocab["<|endoftext|>"], "tie_word_embeddings": False}
    vision = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
              "image_size": 364, "patch_size": 14}
    config = Idefics3Config(vision_config=vision, text_config=text, image_token_id=vocab["<image>"], scale_factor=2,
                            tie_word_embeddings=False)
    save_seeded_model(out, Idefics3ForConditionalGeneration, config, tok, seed)
    Idefics3Processor(image_processor=Idefics3ImageProcessorPil(), tokenizer=tok, image_seq_len=169,
                      chat_template=chat_template()).save_pretrained(out)
    return out
