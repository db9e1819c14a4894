"""The text layer's words with their boxes, for the evidence of extracted values (transforms/model/evidence.py):
pdfium gives each character's box; characters are joined into words at spaces and line ends, and a word the
rendered page does not show (white-on-white, microscopic: textlayer.box_visible) is left out, as it is left out
of the hint. Boxes are in 0-1 of the rendered page (a strip padded to a readable aspect, transforms/pages/sizes.py,
is measured without its padding). The caller holds the pdfium lock.

Bounded: at most MAX_CHARS characters a page are read (a few microseconds each); past it the page's words stop
there, and values printed further on are reported as not found.
"""
from __future__ import annotations

import ctypes

import numpy as np
from PIL import Image

from schemas.evidence import Box, PageWords, encode_words
from transforms.pages.textlayer import box_visible, device_affine, gray_array

MAX_CHARS = 50_000


def pdf_words(page: object, textpage: object, img: Image.Image, gray: np.ndarray | None = None,
              max_chars: int = MAX_CHARS) -> bytes:
    """The page's visible words, encoded (schemas/evidence.py); b"" when it has none. `img` is the bitmap before
    any resize; `gray` its textlayer.gray_array, when the caller has it (a few ms a page)."""
    import pypdfium2.raw as pdfium_c

    raw = textpage.raw  # type: ignore[attr-defined]
    count = min(pdfium_c.FPDFText_CountChars(raw), max_chars)
    if count <= 0:
        return b""
    left, right, bottom, top = (ctypes.c_double() for _ in range(4))
    texts: list[str] = []
    spans: list[list[float]] = []  # per word: left, bottom, right, top in PDF points
    current: list[str] = []
    span: list[float] = []
    for i in range(count):
        char = chr(pdfium_c.FPDFText_GetUnicode(raw, i) or 32)
        if char.isspace() or pdfium_c.FPDFText_IsGenerated(raw, i) == 1:
            if current:
                texts.append("".join(current))
                spans.append(span)
                current, span = [], []
            continue
        if not pdfium_c.FPDFText_GetCharBox(raw, i, left, right, bottom, top):
            continue
        box = [left.value, bottom.value, right.value, top.value]
        span = box if not span else [min(span[0], box[0]), min(span[1], box[1]), max(span[2], box[2]),
                                     max(span[3], box[3])]
        current.append(char)
    if current:
        texts.append("".join(current))
        spans.append(span)
    if not texts:
        return b""
    affine = device_affine(page, img.width, img.height)
    corners = np.array(spans, dtype=float)  # n x 4
    xs = affine[0, 0] * corners[:, [0, 2, 0, 2]] + affine[0, 1] * corners[:, [1, 1, 3, 3]] + affine[0, 2]
    ys = affine[1, 0] * corners[:, [0, 2, 0, 2]] + affine[1, 1] * corners[:, [1, 1, 3, 3]] + affine[1, 2]
    px = np.stack([xs.min(1), ys.min(1), xs.max(1), ys.max(1)], axis=1)
    gray = gray_array(img) if gray is None else gray
    kept_texts: list[str] = []
    kept_boxes: list[Box] = []
    for text, (x0, y0, x1, y1) in zip(texts, px.tolist(), strict=True):
        pixels = (int(np.floor(x0)), int(np.floor(y0)), int(np.ceil(x1)), int(np.ceil(y1)))
        if not box_visible(gray, pixels):
            continue
        kept_texts.append(text)
        kept_boxes.append((_share(x0, img.width), _share(y0, img.height), _share(x1, img.width),
                           _share(y1, img.height)))
    return encode_words(PageWords("text_layer", tuple(kept_texts), tuple(kept_boxes)))


def _share(v: float, size: int) -> float:
    return min(1.0, max(0.0, v / size)) if size else 0.0
