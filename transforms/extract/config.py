"""ExtractConfig: what the extraction stage (stage.py) and its feed (feed.py) are configured by, in its own module
so that both import it and neither imports the other's config."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from schemas.extraction import ExtractionSchema
from transforms.model import quotes
from transforms.model.markdown import MarkdownFormat
from transforms.model.prompt import SHARED_FIRST, DecodingParams, PromptText, config_key, json_prompt


@dataclass(frozen=True)
class ExtractConfig:
    schema: ExtractionSchema
    tenant: str
    model: str
    model_revision: str | None
    render_key: str  # the key of the render, gate, hints and engine settings: pipelines/run/settings.py
    model_family: Any  # a family name, or a transforms.model.token_math.ImageTokenRule (the model folder's settings)
    max_model_len: int
    max_tokens: int
    max_attempts: int
    gpu_hourly_usd: float
    api_price: str
    prices: dict[str, Any]
    max_in_flight: int = 0  # pages in flight per engine; 0: twice the engine's max_num_seqs
    route: str = "model"  # the ledger route of pages sent to the model: model, served or api:<provider>
    # Markdown output (transforms/model/markdown.py); `schema` is then its front matter's schema, named after it.
    markdown: MarkdownFormat | None = None
    prompt_layout: str = SHARED_FIRST  # transforms.model.prompt.PROMPT_LAYOUTS: keyed, it changes the prompt
    answer_timeout_s: float = 0.0  # wall-clock limit of one answer (transforms/extract/feed.py); 0: none
    # --evidence-quotes: the model answers the schema plus `_quotes` (transforms/model/quotes.py). Keyed: it
    # changes the prompt and the answer.
    evidence_quotes: bool = False

    @cached_property
    def answer_schema(self) -> ExtractionSchema:
        """The schema the model answers and its answer is validated against: the extraction schema, or with
        --evidence-quotes its sidecar (the stored extraction is the schema's own either way)."""
        return quotes.sidecar(self.schema) if self.evidence_quotes and self.markdown is None else self.schema

    @property
    def decoding(self) -> DecodingParams:
        return DecodingParams(max_tokens=self.max_tokens)

    @cached_property
    def prompt_words(self) -> PromptText:
        """The words of every page's prompt, made once: a markdown format's, else the JSON prompt of the schema."""
        if self.markdown is not None:
            return self.markdown.prompt_text(self.prompt_layout)
        return json_prompt(self.answer_schema.schema, self.prompt_layout)

    @cached_property
    def config_key(self) -> str:
        # Read twice per page; computed once (cache_key.py keys dataclasses.fields only, never this cache).
        return config_key(self)
