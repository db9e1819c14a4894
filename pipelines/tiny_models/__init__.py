"""Tiny, randomly initialised vision-language models built from nothing, for tests, CI and the demo
(`pagemill make-test-model DIR`).

Families (`FAMILIES`): qwen2_vl (the default) and qwen2_5_vl (qwen2_vl.py), llava_next (llava.py),
internvl (internvl.py) and idefics3 (idefics3.py); what they share is in common.py.

No network and no hub: the tokenizer is trained locally with `tokenizers`, the config comes from
`transformers`, the weights are random (seeded), and the folder loads offline in `vllm.LLM(model=...)`
and in `transformers`. The output is meaningless text, but every piece of plumbing is the real one: the
architecture, chat template, special tokens and, above all, the real image-processor settings of the
family's released checkpoints, so a page produces exactly as many image tokens as it would with the
production model.
"""
from __future__ import annotations

import os
from pathlib import Path

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "llava_next", "internvl", "idefics3")


def make_test_model(out_dir: Path, seed: int = 0, family: str = "qwen2_vl") -> Path:
    """Write a tiny random-weight model of `family` (~2 MB, bf16) into `out_dir` and return it.

    Deterministic: the same seed gives byte-identical files. The global torch RNG is left as it was,
    so calling this from a test does not change other tests' random numbers.
    """
    # Everything is built locally; make sure nothing reaches for the hub even if a name looks remote.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if family == "llava_next":
        from pipelines.tiny_models.llava import make_llava_next

        return make_llava_next(out, seed)
    if family == "internvl":
        from pipelines.tiny_models.internvl import make_internvl

        return make_internvl(out, seed)
    if family == "idefics3":
        from pipelines.tiny_models.idefics3 import make_idefics3

        return make_idefics3(out, seed)
    from pipelines.tiny_models.qwen2_vl import make_qwen2_vl

    return make_qwen2_vl(out, seed, family)
