"""Page sizes without rendering: the (width, height) in pixels that `transforms/pages.py` would send to
the model, computed from a PDF page's size in points or an image's header.

Used by `pagemill estimate`. Every step mirrors the page stage exactly, and the tests compare these
figures with `render_document`'s output:
- PDF: `scale = min(dpi / 72, max_side / longest side in points)`; pypdfium2's `PdfPage.render` makes a
  bitmap of `ceil(width_pt * scale)` x `ceil(height_pt * scale)` px (its source: `math.ceil(get_width() *
  scale)`), so a page can come out one pixel over `max_side`, which `normalise` then scales back.
- images: frame 0 is EXIF-transposed (orientations 5-8 swap the sides); every frame is then normalised.
- `normalise`: longest side capped at `max_side` with Python's `round` on each side (at least 1 px),
  then strips thinner than 100:1 padded with white.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import pypdfium2 as pdfium
from PIL import ExifTags, Image

from transforms.formats import PDFIUM_LOCK, load_pdf, open_image
from transforms.pages import MAX_ASPECT

SWAPPING_ORIENTATIONS = (5, 6, 7, 8)  # EXIF orientations that exif_transpose turns by 90 degrees


@dataclass(frozen=True)
class PageSize:
    """One page as the page stage would produce it: its size in px, or the reason it would fail."""

    page_index: int
    width: int = 0
    height: int = 0
    text: str = ""  # the text layer, capped as the page stage caps it ("" when not read)
    reason_code: str | None = None


def pdf_render_size(width_pt: float, height_pt: float, dpi: float, max_side: int) -> tuple[int, int]:
    """Size of the bitmap pypdfium2 renders for a page of width_pt x height_pt at the page stage's scale."""
    scale = min(dpi / 72.0, max_side / max(width_pt, height_pt))
    return math.ceil(width_pt * scale), math.ceil(height_pt * scale)


def normalised_size(width: int, height: int, max_side: int) -> tuple[int, int]:
    """`transforms.pages.normalise` on sizes: cap the longest side, then pad thin strips."""
    if max(width, height) > max_side:
        scale = max_side / max(width, height)
        width, height = max(1, round(width * scale)), max(1, round(height * scale))
    long, short = max(width, height), min(width, height)
    need = -(-long // int(MAX_ASPECT))
    if short >= need:
        return width, height
    return (width, need) if width >= height else (need, height)


def pdf_page_sizes(data: bytes, *, dpi: float, max_side: int, max_page_points: float, read_text: bool,
                   max_text_chars: int) -> Iterator[PageSize]:
    """Every page of a PDF. With read_text the page is loaded (as the page stage loads it) and its text
    layer read; without, pdfium reads only the page's boxes. Nothing is rendered. The pdfium lock is held
    for one page at a time."""
    with PDFIUM_LOCK:
        pdf = load_pdf(data)
        count = len(pdf)
    try:
        for index in range(count):
            with PDFIUM_LOCK:
                size = _pdf_page(pdf, index, dpi, max_side, max_page_points, read_text, max_text_chars)
            yield size
    finally:
        with PDFIUM_LOCK:
            pdf.close()


def _pdf_page(pdf: pdfium.PdfDocument, index: int, dpi: float, max_side: int, max_page_points: float,
              read_text: bool, max_text_chars: int) -> PageSize:
    text = ""
    try:
        if read_text:
            page = pdf[index]
            try:
                width, height = page.get_size()
                textpage = page.get_textpage()
                text = textpage.get_text_bounded()[:max_text_chars]
                textpage.close()
            finally:
                page.close()
        else:
            width, height = pdf.get_page_size(index)
    except Exception:  # noqa: BLE001 - the page stage would fail this page the same way
        return PageSize(index, reason_code="render_failed")
    if max(width, height) > max_page_points or min(width, height) <= 0:
        return PageSize(index, reason_code="page_too_large")
    w, h = normalised_size(*pdf_render_size(width, height, dpi, max_side), max_side)
    return PageSize(index, w, h, text)


def image_page_sizes(data: bytes, page_count: int, *, max_side: int, max_image_pixels: int) -> Iterator[PageSize]:
    """Every page (frame) of an image, from the header; frame 0 is decoded once to read its EXIF
    orientation exactly as `ImageOps.exif_transpose` does (it loads the image first)."""
    with open_image(data, max_image_pixels) as img:
        for index in range(page_count):
            try:
                img.seek(index)
                width, height = img.size
                if index == 0:
                    img.load()
                    orientation = img.getexif().get(ExifTags.Base.Orientation, 1)
                    if orientation in SWAPPING_ORIENTATIONS:
                        width, height = height, width
            except (OSError, ValueError, EOFError, Image.DecompressionBombError):
                yield PageSize(index, reason_code="render_failed")
                continue
            w, h = normalised_size(width, height, max_side)
            yield PageSize(index, w, h)
