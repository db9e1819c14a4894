"""Text-layer evidence: how much of a page's ink its text layer explains, and which of its text the
rendered page does not show.

Both come from comparing the text layer's boxes with the rendered pixels:
- *coverage*: the share of the page's text-like ink (pixels that differ from the background, less
  long horizontal and vertical rules) that lies inside a text box. A born-digital page is near 1; a
  scan without a text layer is 0; a page with figures or text drawn as images is in between.
- *invisible text*: a text box whose pixels are all one shade (white-on-white, text under an opaque
  shape of its own colour) or less than `MIN_BOX_PX` high (zero-size or microscopic fonts). The model
  never sees such text in the image, so it is left out of the hint and scanned for injections.

Pure functions on numpy arrays, plus `pdf_text_evidence`, which reads pdfium's text boxes (the
caller holds the pdfium lock).

Bounded work: pdfium's `get_text_bounded` scans the whole page on every call, and the caller holds
the process-wide pdfium lock, so a page of thousands of tiny invisible runs would starve every other
thread. At most MAX_TEXT_RECTS boxes are looked at and the text of at most MAX_HIDDEN_BOXES invisible
boxes is read; past either bound the evidence is `truncated` (the page gets the flag
`hidden_text_truncated`) and its coverage is 0: a text layer that could not be checked is not trusted
as a hint (hints then come from OCR, or there is none).
"""
from __future__ import annotations

import ctypes
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image

CELL = 4  # ink is measured on CELL x CELL pixel cells (their mean): a few ms a page, still finer than a glyph
INK_DELTA = 40  # a cell whose mean is this far from the background shade holds ink
RULE_FRACTION = 25  # an ink run longer than 1/25 of the page's longest side is a rule, not text
MIN_VISIBLE_RANGE = 24  # a box whose darkest and lightest pixels differ by less shows nothing
MIN_BOX_PX = 2  # a box less high than this (px) is a zero-size or microscopic font
MIN_INVISIBLE_ALNUM = 4  # fewer letters and digits than this is noise (a space, a dash), not text
BOX_PAD = 2  # px around a text box that still count as that box's ink (anti-aliasing)
MAX_TEXT_RECTS = 20_000  # text boxes looked at per page (each a cheap pixel test)
MAX_HIDDEN_BOXES = 200  # invisible boxes whose text is read per page (each a scan of the whole page)
TRUNCATED_FLAG = "hidden_text_truncated"
Box = tuple[int, int, int, int]  # left, top, right, bottom in pixels (right/bottom exclusive)


# A PDF page without raster images still gets the picture checks when less than this share of its ink
# lies in text boxes (`coverage`; rules are not counted): what is left may be a vector drawing.
PICTURE_MIN_COVERAGE = 0.9


@dataclass(frozen=True)
class TextEvidence:
    coverage: float
    invisible: tuple[str, ...]
    truncated: bool = False  # the check stopped at a bound: the text layer is not trusted


def gray_array(img: Image.Image) -> np.ndarray:
    return np.asarray(img.convert("L"))


def background(gray: np.ndarray) -> int:
    """The most common shade: the paper."""
    return int(np.bincount(gray.ravel(), minlength=256).argmax())


def long_runs(mask: np.ndarray, length: int) -> np.ndarray:
    """Pixels that lie in a horizontal run of at least `length` set pixels. O(pixels), no Python loop."""
    rows, n = mask.shape
    if length > n:
        return np.zeros_like(mask)
    cs = np.zeros((rows, n + 1), np.int32)
    np.cumsum(mask, axis=1, out=cs[:, 1:])
    full = (cs[:, length:] - cs[:, :-length]) == length  # full[j]: the window [j, j + length) is all set
    m = full.shape[1]
    starts = np.zeros((rows, m + 1), np.int32)
    np.cumsum(full, axis=1, out=starts[:, 1:])
    # Pixel i is in a full window iff some full[j] with i - length < j <= i: a difference of two
    # shifted prefix sums (padded so both shifts are plain slices).
    padded = np.concatenate([np.zeros((rows, length - 1), np.int32), starts,
                             np.repeat(starts[:, -1:], length, axis=1)], axis=1)
    return (padded[:, length: length + n] - padded[:, :n]) > 0


def _halve(g: np.ndarray) -> np.ndarray:
    h, w = (g.shape[0] // 2) * 2, (g.shape[1] // 2) * 2
    g = g[:h, :w]
    return (g[0::2, 0::2] + g[1::2, 0::2] + g[0::2, 1::2] + g[1::2, 1::2]) // 4


def ink_mask(gray: np.ndarray) -> np.ndarray:
    """Text-like ink on CELL x CELL cells: cells whose mean is off the background, less rules. A
    one-pixel stroke through a cell still moves its mean by 255 * CELL / CELL**2 = 64."""
    cells = gray.astype(np.uint16)
    for _ in range(CELL.bit_length() - 1):
        cells = _halve(cells)
    if cells.size == 0:
        return np.zeros((0, 0), bool)
    cells = cells.astype(np.uint8)
    ink = np.abs(cells.astype(np.int16) - background(cells)) > INK_DELTA
    length = max(6, max(ink.shape) // RULE_FRACTION)
    rules = long_runs(ink, length) | long_runs(np.ascontiguousarray(ink.T), length).T
    return ink & ~rules


def coverage(ink: np.ndarray, boxes: Iterable[Box]) -> float:
    """Share of the ink (from `ink_mask`, in cells) inside the boxes (full-resolution pixels).
    A page with no ink is fully covered: there is nothing left to explain."""
    total = int(ink.sum())
    if total == 0:
        return 1.0
    covered = np.zeros_like(ink)
    for left, top, right, bottom in boxes:
        covered[max(top - BOX_PAD, 0) // CELL: (bottom + BOX_PAD + CELL - 1) // CELL,
                max(left - BOX_PAD, 0) // CELL: (right + BOX_PAD + CELL - 1) // CELL] = True
    return round(float((ink & covered).sum()) / total, 4)


def box_visible(gray: np.ndarray, box: Box) -> bool:
    left, top, right, bottom = box
    if bottom - top < MIN_BOX_PX or right - left < 1:
        return False
    cell = gray[max(top, 0): bottom, max(left, 0): right]
    return cell.size > 0 and int(cell.max()) - int(cell.min()) >= MIN_VISIBLE_RANGE


def invisible_runs(texts: Sequence[str]) -> tuple[str, ...]:
    """The invisible boxes' texts worth reporting: those with a few letters or digits."""
    kept = [t.strip() for t in texts if sum(ch.isalnum() for ch in t) >= 1]
    return tuple(kept) if sum(sum(ch.isalnum() for ch in t) for t in kept) >= MIN_INVISIBLE_ALNUM else ()


def device_affine(page: object, width: int, height: int) -> np.ndarray:
    """The 2x3 map from PDF user space to bitmap pixels, as pdfium renders the page (rotation, crop)."""
    import pypdfium2.raw as pdfium_c

    dx, dy = ctypes.c_int(), ctypes.c_int()
    # Far-apart points keep the integer rounding of FPDF_PageToDevice out of the slope.
    points = [(0.0, 0.0), (10000.0, 0.0), (0.0, 10000.0)]
    mapped = []
    for x, y in points:
        pdfium_c.FPDF_PageToDevice(page.raw, 0, 0, width, height, 0, x, y, dx, dy)  # type: ignore[attr-defined]
        mapped.append((dx.value, dy.value))
    (x0, y0), (x1, y1), (x2, y2) = mapped
    return np.array([[(x1 - x0) / 1e4, (x2 - x0) / 1e4, x0], [(y1 - y0) / 1e4, (y2 - y0) / 1e4, y0]])


def pdf_text_evidence(page: object, textpage: object, img: Image.Image, gray: np.ndarray | None = None) -> TextEvidence:
    """Coverage and invisible text of one rendered PDF page (`img` is the bitmap before any resize; `gray` its
    `gray_array`, when the caller has it). The caller holds the pdfium lock."""
    gray = gray_array(img) if gray is None else gray
    affine = device_affine(page, img.width, img.height)
    boxes: list[Box] = []
    hidden: list[str] = []
    count = textpage.count_rects()  # type: ignore[attr-defined]
    truncated = count > MAX_TEXT_RECTS
    for i in range(min(count, MAX_TEXT_RECTS)):
        left, bottom, right, top = textpage.get_rect(i)  # type: ignore[attr-defined]
        corners = np.array([[left, right, left, right], [bottom, bottom, top, top], [1, 1, 1, 1]])
        xs, ys = affine @ corners
        box = (int(np.floor(xs.min())), int(np.floor(ys.min())), int(np.ceil(xs.max())), int(np.ceil(ys.max())))
        if box_visible(gray, box):
            boxes.append(box)
        elif len(hidden) < MAX_HIDDEN_BOXES:
            hidden.append(textpage.get_text_bounded(left, bottom, right, top))  # type: ignore[attr-defined]
        else:
            truncated = True
            break
    invisible = invisible_runs(hidden)
    if truncated:
        return TextEvidence(coverage=0.0, invisible=invisible, truncated=True)
    return TextEvidence(coverage=coverage(ink_mask(gray), boxes), invisible=invisible)


def remove_runs(text: str, runs: Iterable[str]) -> str:
    """The text layer without its invisible runs (each removed once, where it occurs)."""
    for run in runs:
        if run:
            text = text.replace(run, " ", 1)
    return text
