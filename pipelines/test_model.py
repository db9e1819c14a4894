"""Tiny, randomly initialised vision-language models built from nothing, for tests and CI.

Families (`FAMILIES`): qwen2_vl (the default), qwen2_5_vl (the architecture of olmOCR-2), llava_next
(pipelines/test_model_llava.py), internvl (pipelines/test_model_internvl.py) and idefics3
(pipelines/test_model_idefics3.py).

No network and no hub: the tokenizer is trained locally with `tokenizers`, the config comes from
`transformers`, the weights are random (seeded), and the folder loads offline in `vllm.LLM(model=...)`
and in `transformers`. The output is meaningless text, but every piece of plumbing is the real one:
the Qwen2-VL architecture, chat template, special tokens and, above all, the real image-processor
settings (patch 14, merge 2, temporal patch 2, 3136..12845056 pixels), so a page produces exactly as
many image tokens as it would with the production model.

Adapted from shared/reference/vllm-cpu/make_tiny_vlm.py (qwen2_vl only); see its REPORT.md for why
the processor JSON is written by hand and why head_dim is 64.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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

VOCAB_SIZE = 1024  # BPE vocabulary incl. special tokens; the embedding is padded to a multiple of 64
# Long enough for a max_model_len of 8192+ with a full-size page (1288x1000 px is 1656 image tokens).
MAX_POSITION_EMBEDDINGS = 32768


def _corpus(seed: int, n_lines: int = 4000) -> Iterator[str]:
    """Synthetic training text: English-ish words, JSON snippets, numbers, dates, printable noise.

    JSON and digits in the corpus give the BPE merges for what structured output emits.
    """
    rnd = random.Random(seed)
    words = [
        "invoice", "total", "amount", "date", "due", "vendor", "customer", "page", "document", "table",
        "field", "value", "name", "address", "number", "price", "quantity", "tax", "net", "gross",
        "currency", "eur", "usd", "line", "item", "the", "of", "and", "to", "in", "is", "for", "on", "with",
        "as", "by", "at", "from", "this", "that", "be", "are", "or", "an", "it", "title", "summary", "text",
        "header", "footer", "signature", "order", "id", "account", "bank", "iban", "true", "false", "null",
        "yes", "no", "report", "form", "section", "paragraph", "figure", "caption",
    ]
    for _ in range(n_lines):
        kind = rnd.random()
        if kind < 0.4:
            yield " ".join(rnd.choice(words) for _ in range(rnd.randint(3, 15)))
        elif kind < 0.7:
            k = rnd.sample(words, 3)
            yield json.dumps(
                {
                    k[0]: rnd.choice(words),
                    k[1]: rnd.randint(0, 10**6),
                    k[2]: [rnd.random() < 0.5, None, round(rnd.uniform(0, 999), 2)],
                }
            )
        elif kind < 0.85:
            yield (
                f"{rnd.randint(1, 28):02d}.{rnd.randint(1, 12):02d}.{rnd.randint(1990, 2030)} "
                f"{rnd.uniform(0, 1e5):.2f} {rnd.choice(['EUR', 'USD', 'GBP'])}"
            )
        else:
            yield "".join(rnd.choice(string.printable) for _ in range(rnd.randint(5, 40)))


def _build_tokenizer(out: Path, seed: int, specials: tuple[str, ...] = QWEN2_VL_SPECIAL_TOKENS,
                     chat_template: str = QWEN2_VL_CHAT_TEMPLATE) -> Any:
    """Train a byte-level BPE (like Qwen2's: every string is encodable) and save it HF-style."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        model_max_length=MAX_POSITION_EMBEDDINGS,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
    )
    hf_tok.chat_template = chat_template
    hf_tok.save_pretrained(out)
    return hf_tok


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


PROCESSORS = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor"}
FAMILIES = ("qwen2_vl", "qwen2_5_vl", "llava_next", "internvl", "idefics3")

CLOSERS = {'"': 2.0, "]": 2.0, "}": 2.0, ",": 1.0}
CLOSING_BIAS = 4.0


def _prefer_closing_json(model: Any, tok: Any) -> None:
    """Make the random model close JSON strings, arrays and objects as soon as the grammar allows.

    Pure random weights never choose a closing quote inside a schema-constrained string: every
    output would run to its pattern's maximum length and to max_tokens, making each test page cost
    seconds. So one hidden dimension is made constant (a large embedding component that no layer
    writes to) and the output head reads it only for closing tokens. Every other weight stays
    random, so outputs still depend on the page image and the prompt.
    """
    import torch

    lm = getattr(model.model, "language_model", None) or model.model.text_model  # Idefics3: text_model
    with torch.no_grad():
        lm.embed_tokens.weight[:, 0] = CLOSING_BIAS
        for layer in lm.layers:
            layer.self_attn.o_proj.weight[0, :] = 0.0  # nothing writes into dimension 0 ...
            layer.mlp.down_proj.weight[0, :] = 0.0  # ... so it stays constant to the last layer
        head = model.lm_head.weight
        head[:, 0] = 0.0
        for token_id in range(min(len(tok), head.shape[0])):
            text = tok.decode([token_id])
            if text and set(text) <= set(CLOSERS):
                # '"', ']' and '}' outrank ',' so that a string closes instead of filling with commas.
                head[token_id, 0] = max(CLOSERS[c] for c in text)



def save_seeded_model(out: Path, model_cls: Any, config: Any, tok: Any, seed: int) -> None:
    """`model_cls(config)` in bf16 with weights drawn from `seed`, nudged to close its JSON, its
    generation ids taken from the text config, saved to `out` (every family's test model)."""
    import torch

    config.dtype = torch.bfloat16
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config).to(torch.bfloat16).eval()
        _prefer_closing_json(model, tok)
    text, gen = config.text_config, model.generation_config
    gen.eos_token_id, gen.pad_token_id, gen.bos_token_id = text.eos_token_id, text.pad_token_id, text.bos_token_id
    model.save_pretrained(out, safe_serialization=True)

def make_test_model(out_dir: Path, seed: int = 0, family: str = "qwen2_vl") -> Path:
    """Write a tiny random-weight model of `family` (~2 MB, bf16) into `out_dir` and return it.

    Deterministic: the same seed gives byte-identical files. The global torch RNG is left as it was,
    so calling this from a test does not change other tests' random numbers.
    """
    import os

    # Everything is built locally; make sure nothing reaches for the hub even if a name looks remote.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

    from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2VLForConditionalGeneration

    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if family == "llava_next":
        from pipelines.test_model_llava import make_llava_next

        return make_llava_next(out, seed)
    if family == "internvl":
        from pipelines.test_model_internvl import make_internvl

        return make_internvl(out, seed)
    if family == "idefics3":
        from pipelines.test_model_idefics3 import make_idefics3

        return make_idefics3(out, seed)
    tok = _build_tokenizer(out, seed)
    vocab_size = ((len(tok) + 63) // 64) * 64  # pad embedding rows to a multiple of 64
    config = _build_config(tok.get_vocab(), vocab_size, family)
    model_cls = Qwen2_5_VLForConditionalGeneration if family == "qwen2_5_vl" else Qwen2VLForConditionalGeneration
    save_seeded_model(out, model_cls, config, tok, seed)
    _write_processor_config(out, family)
    return out
