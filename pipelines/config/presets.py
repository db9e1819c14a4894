"""Model presets: the settings that go with a document model, under one name (`--preset NAME`).

A preset names the model, its prompt builder and parser (through its output: a JSON Schema, or a markdown
format of transforms/model/markdown.py), its image size rule (the longest side pages are rendered at, and whether
they may go at low detail), its output kind and its image-token estimator (a transforms/model/token_math.py
family, whose numbers come from the model folder when --model is a local one). A preset is a set of
default flags: put before the command line's (and a job file's), so any flag given explicitly wins.
`PRESETS` is read-only; `qwen2.5-vl` is exactly pagemill's defaults.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from transforms.model.markdown import MARKDOWN_FORMATS


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    extracts: str  # what a page's row holds, for `pagemill presets` and the README
    model: str  # hub id (or a local folder given with --model)
    model_family: str  # image-token estimator (transforms/model/token_math.py)
    schema: str  # a JSON Schema name (JSON output) or a markdown format name
    max_side: int  # image size rule: longest side of a rendered page, px
    detail: str = "auto"  # auto | low | high: whether pages whose text layer covers them go at low detail
    hints: str = "auto"  # text hints in the prompt (olmOCR reads the image alone)
    max_tokens: int = 1024
    max_model_len: int = 8192
    # transforms/model/prompt.py PROMPT_LAYOUTS: every preset's chat template takes the shared text before the page
    # image (prefix-cached once a run); a model trained on the image first would pin "image_first" here.
    prompt_layout: str = "shared_first"
    # --evidence-quotes: the model also quotes the page text of each value (transforms/model/quotes.py).
    evidence_quotes: bool = False

    @property
    def output_kind(self) -> str:
        return "markdown" if self.schema in MARKDOWN_FORMATS else "json"

    @property
    def prompt(self) -> str:
        fmt = MARKDOWN_FORMATS.get(self.schema)
        return fmt.prompt if fmt is not None else "extract_json"

    @property
    def parser(self) -> str:
        fmt = MARKDOWN_FORMATS.get(self.schema)
        if fmt is None:
            return "json_schema"
        return "front_matter+markdown" if fmt.front_matter else "markdown"

    def options(self) -> dict[str, Any]:
        return {"model": self.model, "model_family": self.model_family, "schema": self.schema,
                "max_side": self.max_side, "detail": self.detail, "hints": self.hints,
                "max_tokens": self.max_tokens, "max_model_len": self.max_model_len, "prompt_layout": self.prompt_layout,
                "evidence_quotes": self.evidence_quotes}

    def flags(self) -> list[str]:
        return [f"--{k}={v}" for k, v in self.options().items()]


PRESETS: Final[Mapping[str, Preset]] = MappingProxyType({p.name: p for p in (
    Preset("qwen2.5-vl", "Qwen2.5-VL-7B-Instruct, JSON fields by schema (pagemill's defaults)",
           "the --schema fields (invoice by default) as JSON in `extraction`",
           "Qwen/Qwen2.5-VL-7B-Instruct", "qwen2_vl", "invoice", 1288),
    Preset("olmocr", "olmOCR-2-7B (a Qwen2.5-VL fine-tune): olmOCR's prompt, front matter + markdown",
           "page text as markdown in `markdown`; primary_language, is_rotation_valid, rotation_correction, "
           "is_table, is_diagram in their own columns",
           # olmOCR renders the longest side at 1288 px, sends no text hint, and allows 8000 output tokens.
           "allenai/olmOCR-2-7B-1025", "qwen2_5_vl", "olmocr", 1288, detail="high", hints="none",
           max_tokens=8000, max_model_len=16384),
    Preset("llava-next", "LLaVA-NeXT (LLaVA-1.6, anyres tiles; another architecture): page text as markdown",
           "page text as markdown in `markdown` (pagemill's markdown prompt, the text hint fenced)",
           "llava-hf/llava-v1.6-mistral-7b-hf", "llava_next", "markdown", 1288, max_tokens=2048),
)})


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}") from None


def preset_name(flags: Sequence[str]) -> str | None:
    """The last --preset in `flags` (either spelling, `--preset X` or `--preset=X`)."""
    name = None
    for i, arg in enumerate(flags):
        head, eq, value = arg.partition("=")
        if head in ("--preset",):
            name = value if eq else (flags[i + 1] if i + 1 < len(flags) else None)
    return name


def with_preset(flags: Sequence[str]) -> list[str]:
    """`flags` with the preset's own flags in front, so that every flag given explicitly overrides them.
    Raises ValueError for an unknown preset."""
    name = preset_name(flags)
    return list(flags) if not name else get_preset(name).flags() + list(flags)


def listing() -> str:
    """`pagemill presets`: one block per preset."""
    lines = []
    for p in PRESETS.values():
        lines += [f"{p.name:<12} {p.description}",
                  f"{'':<12} model {p.model}; output {p.output_kind} (--schema {p.schema}); prompt {p.prompt} "
                  f"({p.prompt_layout}); "
                  f"parser {p.parser}; image tokens {p.model_family}; pages at --max-side {p.max_side}, "
                  f"--detail {p.detail}; --max-tokens {p.max_tokens}",
                  f"{'':<12} extracts: {p.extracts}"]
    return "\n".join(lines)
