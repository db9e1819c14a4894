"""Hints: the cheapest good text to give the model with each page, scanned before it is used.

Per page (`--hints`):
- `auto` (default): the text layer when it explains at least `--min-text-coverage` of the page's ink
  (`hint_source=text_layer`), else Tesseract on the rendered page (`hint_source=ocr`). If Tesseract
  fails or times out, a non-empty text layer is used instead (flag `ocr_timeout` / `ocr_failed`).
  In a render-only run (`--extract false`) `auto` never runs Tesseract: no model needs the hint.
- `text_layer`: the text layer only, never OCR. `ocr`: Tesseract on every page. `none`: no hint.

The text layer's invisible runs (white-on-white, zero-size fonts: see transforms/pages/textlayer.py) are
never part of the hint: the model cannot see them in the image either. They raise `invisible_text`.
A page whose hidden-text check stopped at its bound (`hidden_text_truncated`) gets no text-layer hint.

Every hint, and the invisible text, is scanned (transforms/safety/injection.py). A match raises
`prompt_injection`; `--injection-policy drop` (default) leaves the hint out of the prompt entirely,
`neutralise` replaces each match with `[removed]`.

Detail (`--detail`): `auto` sends a page at `--low-detail-side` when its hint covers it well (coverage
at least LOW_DETAIL_COVERAGE, the hint not cut by `--max-hint-chars`, OCR confidence at least
LOW_DETAIL_OCR_CONF), since the model then reads the characters from the hint and only needs the
layout from the image; `low` / `high` force one for every page.
"""
from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from PIL import Image

from schemas.evidence import PageWords, encode_words
from schemas.records import PageImage
from transforms.hints.ocr import (
    MIN_WORD_CONF,
    OCR_TIMED_OUT,
    OcrResult,
    OcrSettings,
    available_languages,
    run_tesseract,
)
from transforms.model.prompt import clean_hint
from transforms.pages import textlayer
from transforms.safety import injection

LOW_DETAIL_COVERAGE = 0.9
LOW_DETAIL_OCR_CONF = 80.0
MAX_DETAIL_CHARS = 200  # per flag_detail line
Ocr = Callable[[bytes, OcrSettings], OcrResult]


@dataclass(frozen=True)
class HintSettings:
    mode: str = "auto"  # auto | text_layer | ocr | none
    ocr: OcrSettings = field(default_factory=OcrSettings)
    min_text_coverage: float = 0.6
    detail: str = "auto"  # auto | low | high
    low_detail_side: int = 640
    injection_policy: str = "drop"  # drop | neutralise
    max_hint_chars: int = 4000
    allow_ocr: bool = True  # False in render-only runs: `auto` then never runs Tesseract


@dataclass(frozen=True)
class HintChoice:
    hint: str
    source: str  # text_layer | ocr | none
    coverage: float
    detail: str
    flags: tuple[str, ...]
    notes: tuple[str, ...]
    ocr: OcrResult | None = None


def ocr_coverage(image: bytes, result: OcrResult) -> float:
    """Share of the page's ink inside the boxes of words Tesseract read with some confidence."""
    gray = textlayer.gray_array(Image.open(io.BytesIO(image)))
    boxes = [w.box for w in result.words if w.conf >= MIN_WORD_CONF]
    return textlayer.coverage(textlayer.ink_mask(gray), boxes)


def _note(flag: str, text: str) -> str:
    return f"{flag}: {text}"[:MAX_DETAIL_CHARS]


def _source_text(page: PageImage, s: HintSettings, ocr: Ocr, notes: list[str],
                 flags: list[str]) -> tuple[str, str, float, OcrResult | None]:
    """(text, source, coverage, OCR result) before scanning."""
    visible = textlayer.remove_runs(page.text_layer, page.invisible_text)
    if textlayer.TRUNCATED_FLAG in page.flags:
        visible = ""  # its hidden text was not all read, so it may still hide some: never a hint
    has_layer = bool(visible.strip())
    if s.mode == "none":
        return "", "none", 0.0, None
    if s.mode == "text_layer" or (s.mode == "auto" and (page.text_coverage >= s.min_text_coverage
                                                         or not s.allow_ocr)):
        return (visible, "text_layer", page.text_coverage, None) if has_layer else ("", "none", 0.0, None)
    result = ocr(page.image, s.ocr)
    if result.status == "ok" and result.text.strip():
        return result.text, "ocr", ocr_coverage(page.image, result), result
    if result.status != "ok":
        flag = "ocr_timeout" if result.status == OCR_TIMED_OUT else "ocr_failed"
        flags.append(flag)
        notes.append(_note(flag, result.error or result.status))
    if s.mode == "auto" and has_layer:
        return visible, "text_layer", page.text_coverage, result
    return "", "none", 0.0, result


def choose_hint(page: PageImage, s: HintSettings, ocr: Ocr = run_tesseract) -> HintChoice:
    """The page's hint, its source and coverage, its detail, and the flags raised on the way. Pure
    apart from running `ocr`."""
    flags: list[str] = []
    notes: list[str] = []
    if page.invisible_text:
        flags.append("invisible_text")
        notes.append(_note("invisible_text", " | ".join(page.invisible_text)))
    text, source, cover, result = _source_text(page, s, ocr, notes, flags)
    # Normalised once, before scanning and cleaning, so both see the same characters (NFKC, no
    # zero-width or other format characters): a look-alike cannot pass one and not the other.
    text = injection.normalise(text)
    hits = injection.scan(text) if text else ()
    hidden_hits = tuple(m for run in page.invisible_text for m in injection.scan(run))
    if hits or hidden_hits:
        flags.append("prompt_injection")
        where = [f"{source}: {m.describe()}" for m in hits] + [f"invisible text: {m.describe()}" for m in hidden_hits]
        notes.extend(_note("prompt_injection", w) for w in where[:10])
    if hits and s.injection_policy == "drop":
        notes.append(_note("prompt_injection", f"{source} hint left out of the prompt (--injection-policy drop)"))
        text, source, cover = "", "none", 0.0
    elif hits:
        text = injection.neutralise(text, hits)
    hint = clean_hint(text, s.max_hint_chars) if text.strip() else ""
    return HintChoice(hint=hint, source=source if hint else "none", coverage=round(cover, 4),
                      detail=choose_detail(s, source if hint else "none", cover, hint, text, result),
                      flags=tuple(dict.fromkeys(flags)), notes=tuple(notes), ocr=result)


def choose_detail(s: HintSettings, source: str, cover: float, hint: str, text: str, result: OcrResult | None) -> str:
    if s.detail != "auto":
        return s.detail
    if source == "none" or cover < LOW_DETAIL_COVERAGE or len(text.strip()) > s.max_hint_chars:
        return "high"
    if source == "ocr" and (result is None or result.mean_conf < LOW_DETAIL_OCR_CONF):
        return "high"
    return "low" if hint else "high"


def apply_hint(page: PageImage, choice: HintChoice, s: HintSettings) -> PageImage:
    low = choice.detail == "low" and max(page.width, page.height) > s.low_detail_side
    return replace(page, hint=choice.hint, hint_source=choice.source, hint_coverage=choice.coverage,
                   detail="low" if low else "high", detail_side=s.low_detail_side if low else 0,
                   flags=tuple(dict.fromkeys(page.flags + choice.flags)), flag_detail=page.flag_detail + choice.notes,
                   words=ocr_words(choice.ocr, page.width, page.height) or page.words)


def ocr_words(result: OcrResult | None, width: int, height: int) -> bytes:
    """Tesseract's words with their boxes (0-1 of the page it read), encoded (schemas/evidence.py): where OCR ran,
    the words the extraction's values are looked for in, whatever became of the hint. b"" when there are none."""
    if result is None or result.status != "ok" or not result.words or width <= 0 or height <= 0:
        return b""
    boxes = tuple((max(0.0, w.box[0] / width), max(0.0, w.box[1] / height), min(1.0, w.box[2] / width),
                   min(1.0, w.box[3] / height)) for w in result.words)
    return encode_words(PageWords("ocr", tuple(w.text for w in result.words), boxes))


def ocr_for(settings: HintSettings, ocr: Ocr | None = None) -> Ocr:
    """The OCR to use: `ocr` if given, else Tesseract, whose configuration is checked once per process: a
    missing binary or language gives every OCR'd page an `ocr_failed` flag (and no OCR hint), never a
    failed bundle."""
    if ocr is not None:
        return ocr
    if settings.mode in ("auto", "ocr") and settings.allow_ocr:
        installed = set(available_languages())
        missing = [lang for lang in settings.ocr.lang.split("+") if lang not in installed]
        if missing:
            return _unavailable("tesseract is not installed" if not installed else f"no Tesseract language {missing}")
    return run_tesseract


def _unavailable(reason: str) -> Ocr:
    def ocr(image: bytes, s: OcrSettings) -> OcrResult:
        return OcrResult("failed", error=reason)

    return ocr

