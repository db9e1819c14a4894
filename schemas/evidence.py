"""Evidence: where on its page each extracted value stands (the `evidence` table), and the page's words with their
boxes, which a page carries from the page and hints stages to the extraction stage in a compact encoding.

A box is (x0, y0, x1, y1) in 0-1 of the page's width and height, origin top left. Pure.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

# How a value was looked for: in the PDF's text layer, in Tesseract's words, or (a model's quote) in either.
# `none`: the page had no words to look in (no text layer, no OCR): the value is not checked (`grounded` null).
METHODS = ("text_layer", "ocr", "model_quote", "none")
Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class EvidenceRow:
    """One non-empty leaf value of a page's extraction and where the page shows it (run, tenant and the page's
    identity are added by the writer from the page's row)."""

    field_path: str  # `total`, `line_items[2].amount`
    value: str  # the value as text (a number as JSON writes it)
    method: str
    score: float  # 1.0: every token found as printed; less: the best near match (OCR misreads); 0: nothing
    grounded: bool | None  # None: not checked (the page had no words)
    quote: str | None = None  # the page's words that matched, as the page spells them
    box: Box | None = None  # the union of the matched words' boxes


@dataclass(frozen=True)
class PageWords:
    """A page's words in reading order, each with its box (0-1 of the page, origin top left)."""

    source: str  # text_layer | ocr
    texts: tuple[str, ...]
    boxes: tuple[Box, ...]


# The encoding: magic, a source byte, the word count, four uint16 per box (1/65535 of the page), then the texts
# joined by a unit separator (removed from the texts). About 8 bytes a word plus its text.
_MAGIC = b"PW1"
_SOURCES = ("text_layer", "ocr")
_SEP = "\x1f"
_SCALE = 65535


def encode_words(words: PageWords) -> bytes:
    """Pure: `words` as bytes (what PageImage.words holds); b"" when there are none."""
    if not words.texts:
        return b""
    n = len(words.texts)
    coords = [min(_SCALE, max(0, round(c * _SCALE))) for box in words.boxes for c in box]
    text = _SEP.join(t.replace(_SEP, " ") for t in words.texts).encode("utf-8", "replace")
    return _MAGIC + bytes([_SOURCES.index(words.source)]) + struct.pack(f"<I{4 * n}H", n, *coords) + text


def decode_words(data: bytes) -> PageWords | None:
    """Pure: the words `encode_words` made; None for b"" (no words) or bytes that are not such an encoding."""
    if len(data) < 8 or not data.startswith(_MAGIC) or data[3] >= len(_SOURCES):
        return None
    (n,) = struct.unpack_from("<I", data, 4)
    end = 8 + 8 * n
    if len(data) < end:
        return None
    coords = struct.unpack_from(f"<{4 * n}H", data, 8)
    texts = tuple(data[end:].decode("utf-8", "replace").split(_SEP))
    if len(texts) != n:
        return None
    boxes = tuple(tuple(c / _SCALE for c in coords[4 * i: 4 * i + 4]) for i in range(n))
    return PageWords(_SOURCES[data[3]], texts, boxes)  # type: ignore[arg-type]
