"""Page sizes: the one home of every rule that decides a page image's size in pixels, and the reading of
those sizes without rendering.

The rules (pure):
- PDF: `pdf_render_scale` = min(dpi / 72, max_side / longest side in points), the scale the page stage
  renders at; pypdfium2's `PdfPage.render` then makes a bitmap of `ceil(width_pt * scale)` x
  `ceil(height_pt * scale)` px (its source: `math.ceil(get_width() * scale)`): `pdf_render_size`. A page can
  come out one pixel over `max_side`, which the cap then scales back.
- `capped_size`: longest side at most a side (never enlarged), Python's `round` on each side, at least 1 px.
  The page stage's `normalise` caps at --max-side, the hints stage's low detail at --low-detail-side.
- `padded_size`: strips thinner than MAX_ASPECT:1 padded with white.
- `page_too_large`: a PDF page over --max-page-points (or with no area) is not rendered.

`transforms/pages/render.py` renders and resizes with these; `pdf_page_sizes` / `image_page_sizes` (used by
`pagemill estimate`) read the sizes from a PDF's page boxes or an image's header, and a test compares
them with `render_document`'s output. Images: frame 0 is EXIF-transposed (orientations 5-8 swap the
sides); every frame is then normalised.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import pypdfium2 as pdfium
from PIL import ExifTags, Image

from schemas.reasons import PAGE_TOO_LARGE, RENDER_FAILED
from transforms.intake.formats import PDFIUM_LOCK, load_pdf, open_image

MAX_ASPECT = 100  # well inside the 200:1 that Qwen2-VL's processor accepts, after its own rounding
SWAPPING_ORIENTATIONS = (5, 6, 7, 8)  # EXIF orientations that exif_transpose turns by 90 degrees


def pdf_render_scale(width_pt: float, height_pt: float, dpi: float, max_side: int) -> float:
    """The scale a PDF page is rendered at: --dpi, or less when that would pass --max-side."""
    return min(dpi / 72.0, max_side / max(width_pt, height_pt))


def pdf_render_size(width_pt: float, height_pt: float, dpi: float, max_side: int) -> tuple[int, int]:
    """Size of the bitmap pypdfium2 renders for a page of width_pt x height_pt at `pdf_render_scale`."""
    scale = pdf_render_scale(width_pt, height_pt, dpi, max_side)
    return math.ceil(width_pt * scale), math.ceil(height_pt * scale)


def page_too_large(width_pt: float, height_pt: float, max_page_points: float) -> bool:
    """A PDF page the page stage refuses to render (`page_too_large`): over the cap, or without area."""
    return max(width_pt, height_pt) > max_page_points or min(width_pt, height_pt) <= 0


def capped_size(width: int, height: int, side: int) -> tuple[int, int]:
    """The size scaled so its longest side is at most `side` (never enlarged)."""
    if max(width, height) <= side:
        return width, height
    scale = side / max(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


def padded_size(width: int, height: int, max_aspect: float = MAX_ASPECT) -> tuple[int, int]:
    """The size after padding a strip thinner than max_aspect:1 (the short side grows)."""
    long, short = max(width, height), min(width, height)
    need = -(-long // int(max_aspect))  # ceil: the shortest side that keeps the ratio in bounds
    if short >= need:
        return width, height
    return (width, need) if width >= height else (need, height)


def normalised_size(width: int, height: int, max_side: int) -> tuple[int, int]:
    """The size `transforms.pages.render.normalise` gives an image: capped at max_side, then padded."""
    return padded_size(*capped_size(width, height, max_side))


def low_detail_size(width: int, height: int, side: int) -> tuple[int, int]:
    """The size a page is sent to the model at: capped at `side`, or as it is when `side` is 0 (full detail)."""
    return (width, height) if side <= 0 else capped_size(width, height, side)


def cap_image(img: Image.Image, side: int) -> Image.Image:
    """The image resized to `capped_size` (the same image when nothing changes)."""
    size = capped_size(img.width, img.height, side)
    if size == img.size:
        return img
    return img.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)


def resize_for_detail(img: Image.Image, side: int) -> Image.Image:
    """The page as sent to the model (`low_detail_size`): used by the safety gate, which checks the page
    as the model will see it, and by the engines, which send it."""
    return img if side <= 0 else cap_image(img, side)


@dataclass(frozen=True)
class PageSize:
    """One page as the page stage would produce it: its size in px, or the reason it would fail."""

    page_index: int
    width: int = 0
    height: int = 0
    text: str = ""  # the text layer, capped as the page stage caps it ("" when not read)
    reason_code: str | None = None


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
        return PageSize(index, reason_code=RENDER_FAILED)
    if page_too_large(width, height, max_page_points):
        return PageSize(index, reason_code=PAGE_TOO_LARGE)
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
                yield PageSize(index, reason_code=RENDER_FAILED)
                continue
            w, h = normalised_size(width, height, max_side)
            yield PageSize(index, w, h)
