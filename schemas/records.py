"""Records that flow between pipeline stages. Frozen so that a stage can never mutate what
another stage still holds (Beam may reuse an element across fused steps)."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from schemas.evidence import EvidenceRow

# Page statuses and document outcomes: schemas/statuses.py.
# Ledger routes: why a page cost what it cost. A page sent to a model has `model` (the in-process
# engine), `served` (a self-hosted OpenAI-compatible server) or `api:<provider>` (a hosted API priced at
# schemas/prices.json's list price); is_model_route / model_routes_sql pick all three.
ROUTES = ("model", "served", "cache", "duplicate", "quarantined", "failed", "none")
API_ROUTE_PREFIX = "api:"


def is_model_route(route: str) -> bool:
    """The rule of model_routes_sql, in Python."""
    return route in ("model", "served") or route.startswith(API_ROUTE_PREFIX)


def model_routes_sql(column: str = "route") -> str:
    """A SQL condition true for the routes of pages sent to a model (the one home of that rule)."""
    return f"({column} IN ('model', 'served') OR starts_with({column}, '{API_ROUTE_PREFIX}'))"


# The failure vocabulary (reason codes): schemas/reasons.py.

# Page flags (the `pages.flags` column): facts about a page that do not stop it. Stable strings too;
# `pages.flag_detail` says why each was raised.
FLAGS = {
    "invisible_text": "the text layer holds text the rendered page does not show (white-on-white, tiny fonts)",
    "hidden_text_truncated": "the hidden-text check stopped at its per-page bound: the text layer is not a hint",
    "prompt_injection": "the page's text hint (or its invisible text) reads like instructions to a model",
    "ocr_timeout": "Tesseract ran past --ocr-timeout-s on this page",
    "ocr_failed": "Tesseract failed or is not installed (with the --ocr-lang language)",
    "injection_success": "the output shows signs that an injection worked (prompt or role text leaked)",
    "pii": "the output holds personal data that the schema did not ask for (see the pii_* flags)",
    "pii_email": "an e-mail address in a field that does not ask for one",
    "pii_phone": "a phone number in a field that does not ask for one",
    "pii_card": "a payment card number (Luhn-valid) in a field that does not ask for one",
    "pii_iban": "an IBAN (mod-97 valid) in a field that does not ask for one",
    "pii_national_id": "a national id (US SSN, UK NINO, Spanish DNI/NIE) in a field that does not ask for one",
    "refusal": "the output reads like a refusal rather than data",
    "truncated_output": "markdown output hit --max-tokens: the page's text is cut short",
    "repetition": "markdown output kept repeating a short pattern and was stopped there: the text is cut short",
    "ungrounded_values": "a value of the extraction is not found on its page (pages.ungrounded_values counts them; "
                         "the evidence table says which)",
}

# Why a model's answer ended (the `ledger.stop_reason` column; null on pages no model answered). Stable strings.
STOP_REASONS = {
    "stop": "the model ended its answer itself (end of sequence or a stop token)",
    "length": "the answer hit --max-tokens (or the context length)",
    "repetition": "the answer kept repeating a short pattern and was stopped (engines/vllm_shared/repetition.py)",
    "deadline": "the answer ran past --answer-timeout-s and was aborted",
}


@dataclass(frozen=True)
class ListedObject:
    """One object from the listing: what we know before reading a byte."""

    uri: str
    size: int
    last_modified: float | None = None


@dataclass(frozen=True)
class DocumentRecord:
    """A document that passed intake: readable, supported, within limits."""

    uri: str
    size: int
    doc_sha256: str
    format: str
    page_count: int
    # A render unit (transforms/pages/ranges.py): pages [first_page, end_page) of the document; the
    # whole document when end_page is 0. Its `documents` row is still built once, from every unit's pages.
    first_page: int = 0
    end_page: int = 0

    @property
    def page_indices(self) -> range:
        """The pages this record asks to be rendered."""
        return range(self.first_page, self.end_page or self.page_count)


@dataclass(frozen=True)
class DocumentRow:
    """One row of the `documents` table (run_id and tenant are added by the writer)."""

    source_uri: str
    bytes: int
    outcome: str
    doc_sha256: str | None = None
    format: str | None = None
    page_count: int | None = None
    reason_code: str | None = None
    message: str | None = None
    duplicate_of: str | None = None
    quarantine_detail: str | None = None  # JSON, for outcome `quarantined`


@dataclass(frozen=True)
class PageImage:
    """A rendered page in flight: encoded bytes (never pixels or PIL objects) plus its text layer."""

    doc_sha256: str
    source_uri: str
    page_index: int
    page_hash: str
    image: bytes
    width: int
    height: int
    text_layer: str = ""
    hint_source: str = "none"
    # Set by the page stage: how much of the page's ink the text layer explains, and the text-layer
    # runs that the rendered pixels do not show (see transforms/pages/textlayer.py).
    text_coverage: float = 0.0
    invisible_text: tuple[str, ...] = ()
    # Set by the page stage: the page may show a picture (an image input, or a PDF page that draws a
    # raster image). False only where pdfium listed the page's objects and found no image among them;
    # the safety gate then skips its picture checks (the NSFW classifier) unless unexplained ink remains.
    has_raster: bool = True
    # Set by the safety gate and the hints stage.
    pdq_hash: str | None = None
    pdq_hash_low: str | None = None  # of the low-detail rendition, where the page has one (--detail auto)
    hint: str = ""
    hint_coverage: float = 0.0
    detail: str = "high"  # "low": sent at most `detail_side` px on the longest side
    detail_side: int = 0
    flags: tuple[str, ...] = ()
    flag_detail: tuple[str, ...] = ()
    # When the page left the CPU stages (rendered, gated, hinted); stamped by the extraction stage.
    rendered_at: dt.datetime | None = None
    # The page's words with their boxes (schemas/evidence.py's encoding): the text layer's, set by the page stage,
    # or Tesseract's, set by the hints stage when it ran. What the extraction's values are looked for in.
    words: bytes = b""


@dataclass(frozen=True)
class PageRow:
    """One row of the `pages` table, and the ledger figures that belong to it."""

    doc_sha256: str
    source_uri: str
    page_index: int
    status: str
    page_hash: str | None = None
    cache_key: str | None = None
    config_key: str | None = None
    reason_code: str | None = None
    message: str | None = None
    width: int | None = None
    height: int | None = None
    schema_id: str | None = None
    schema_hash: str | None = None
    model: str | None = None
    model_revision: str | None = None
    extraction: str | None = None
    validation_errors: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    hint_source: str = "none"
    route: str = "none"
    image_tokens: int = 0
    text_tokens: int = 0
    output_tokens: int = 0
    attempts: int = 0
    gpu_seconds: float = 0.0
    cost_usd: float = 0.0
    api_equivalent_usd: float = 0.0
    hint: str | None = None
    hint_coverage: float | None = None
    detail: str | None = None
    flag_detail: tuple[str, ...] = ()
    quarantine_detail: str | None = None  # JSON: which check, list and distance, or classifier and score
    pdq_hash: str | None = None
    pdq_hash_low: str | None = None  # of the low-detail rendition: reuse re-checks it as the gate did
    image_tokens_saved: int = 0  # image tokens that sending the page at full detail would have cost more
    cached_prompt_tokens: int = 0  # prompt tokens the engine took from its prefix cache (not prefilled again)
    stop_reason: str | None = None  # STOP_REASONS: why the last answer ended; None when no model answered
    rendered_at: dt.datetime | None = None  # the page left the CPU stages
    extracted_at: dt.datetime | None = None  # its result came back (cached, duplicate: was available)
    # Markdown output (--schema markdown / olmocr, transforms/model/markdown.py): the page text, and the front
    # matter's fields where the format has them. None on JSON rows.
    markdown: str | None = None
    primary_language: str | None = None
    is_rotation_valid: bool | None = None
    rotation_correction: int | None = None
    is_table: bool | None = None
    is_diagram: bool | None = None
    # Evidence (transforms/model/evidence.py): one row per non-empty leaf value, written to the `evidence` table;
    # how many values were looked for, and how many were not found (None: not checked).
    evidence: tuple[EvidenceRow, ...] = ()
    evidence_values: int | None = None
    ungrounded_values: int | None = None

    @classmethod
    def of_page(cls, page: PageImage, status: str, *, hinted: bool = True, **fields: Any) -> PageRow:
        """The row of a rendered page: what the page carries to the `pages` table (the one list of it),
        then `fields` (the result's columns, route, merged flags...) over it. `hinted=False`: a page
        stopped at the safety gate, before the hints stage: its identity and hashes only."""
        carried: dict[str, Any] = {"page_hash": page.page_hash, "width": page.width, "height": page.height,
                                   "pdq_hash": page.pdq_hash, "pdq_hash_low": page.pdq_hash_low}
        if hinted:
            carried.update(hint_source=page.hint_source, hint=page.hint or None, hint_coverage=page.hint_coverage,
                           detail=page.detail, flags=page.flags, flag_detail=page.flag_detail,
                           rendered_at=page.rendered_at)
        return cls.of_index(page.doc_sha256, page.source_uri, page.page_index, status, **{**carried, **fields})

    @classmethod
    def of_index(cls, doc_sha256: str, source_uri: str, page_index: int, status: str, **fields: Any) -> PageRow:
        """The row of a page known by its document and index only, with no PageImage in hand: one that
        never rendered, or one rebuilt from an earlier run's stored row."""
        return cls(doc_sha256=doc_sha256, source_uri=source_uri, page_index=page_index, status=status, **fields)


@dataclass(frozen=True)
class PageTask:
    """One extraction request: a representative page, its prompt hint, and the pages that share its key."""

    page: PageImage
    cache_key: str
    hint: str


@dataclass(frozen=True)
class ExtractionResult:
    """What the engine made of one PageTask, with the usage the ledger needs."""

    status: str
    reason_code: str | None = None
    message: str | None = None
    extraction: str | None = None
    validation_errors: tuple[str, ...] = ()
    image_tokens: int = 0
    text_tokens: int = 0
    output_tokens: int = 0
    attempts: int = 0
    gpu_seconds: float = 0.0
    sent_width: int = 0
    sent_height: int = 0
    finished_at: dt.datetime | None = None
    markdown: str | None = None  # markdown output: the page text (`extraction` holds the front matter)
    flags: tuple[str, ...] = ()  # page flags the result raises (markdown: truncated_output)
    cached_prompt_tokens: int = 0  # of the last attempt's prompt tokens, those the engine's prefix cache held
    stop_reason: str | None = None  # STOP_REASONS of the last attempt
    # --evidence-quotes: (field path, the page text the model says it read the value from), taken out of the
    # answer (transforms/model/quotes.py); for the evidence of the row, never stored as such.
    quotes: tuple[tuple[str, str], ...] = ()
