"""What every tiny test model shares: a byte-level BPE tokenizer trained locally on synthetic text, and
seeded random weights nudged to close their JSON, saved like a hub checkpoint."""
from __future__ import annotations

import json
import random
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def build_tokenizer(out: Path, seed: int, specials: tuple[str, ...], chat_template: str) -> Any:
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
