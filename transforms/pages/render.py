"""Pages: render one page at a time, normalise, hash the pixels, keep the text layer.

A PDF is rendered page by page with pypdfium2 and each page leaves the DoFn as JPEG bytes before
the next is rendered, so no stage holds a document's rendered pages. Images are EXIF-rotated,
flattened onto white, converted to RGB and resized to the same cap.
"""
from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from dataclasses import dataclass

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
from PIL import Image, ImageOps

from schemas.reasons import CHANGED_DURING_RUN, DECOMPRESSION_BOMB, ENCRYPTED, PAGE_TOO_LARGE, RENDER_FAILED
from schemas.records import DocumentRecord, PageImage, PageRow
from schemas.statuses import FAILED
from transforms.intake.formats import PDFIUM_LOCK, PdfPasswordError, load_pdf, open_image, seek_frame
from transforms.pages.sizes import MAX_ASPECT, cap_image, padded_size, page_too_large, pdf_render_scale
from transforms.pages.textlayer import (
    PICTURE_MIN_COVERAGE,
    TRUNCATED_FLAG,
    TextEvidence,
    gray_array,
    pdf_text_evidence,
)
from transforms.pages.words import pdf_words

FAILED_PAGES = "failed_pages"
MAX_FORM_DEPTH = 8  # nested Form XObjects looked into for images; deeper nesting counts as an image
MAX_PAGE_OBJECTS = 200_000  # objects looked at per page (cheap ctypes calls); past it, assume an image


@dataclass(frozen=True)
class RenderSettings:
    dpi: float
    max_side: int
    jpeg_quality: int
    max_text_chars: int
    max_page_points: float
    max_image_pixels: int
    max_bytes: int


class PageError(Exception):
    """One page could not be rendered; carries the reason code for its `pages` row."""

    def __init__(self, reason_code: str, message: str) -> None:
        super().__init__(message)
        self.reason_code = reason_code


def normalise(img: Image.Image, max_side: int) -> Image.Image:
    """RGB on white, at most max_side on the longest side (`transforms.pages.sizes.normalised_size`). Transparent
    pixels must not turn black."""
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        flat = Image.new("RGB", rgba.size, (255, 255, 255))
        flat.paste(rgba, mask=rgba.getchannel("A"))
        img = flat
    elif img.mode != "RGB":
        img = img.convert("RGB")
    return pad_to_aspect(cap_image(img, max_side), MAX_ASPECT)


def pad_to_aspect(img: Image.Image, max_aspect: float) -> Image.Image:
    """Pad a thin strip with white: vision encoders refuse extreme aspect ratios (Qwen2-VL: 200:1)."""
    size = padded_size(img.width, img.height, max_aspect)
    if size == img.size:
        return img
    padded = Image.new("RGB", size, (255, 255, 255))
    padded.paste(img, (0, 0))
    return padded


def page_hash(img: Image.Image, packed: object | None = None) -> str:
    """sha256 of the normalised pixels and their size: equal pages in different files collide.
    `packed`: the same pixels as `img.tobytes()` gives them, already in a buffer (saves a copy)."""
    digest = hashlib.sha256(f"{img.width}x{img.height}:".encode())
    digest.update(img.tobytes() if packed is None else packed)  # type: ignore[arg-type]
    return digest.hexdigest()


def encode_page(img: Image.Image, quality: int) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def decode_luma(data: bytes) -> Image.Image:
    """The page's luminance: a JPEG's own Y channel, decoded without its colour (Pillow's draft mode)."""
    image = Image.open(io.BytesIO(data))
    image.draft("L", image.size)
    image.load()
    return image if image.mode == "L" else image.convert("L")


def decode_rgb(data: bytes) -> Image.Image:
    """The page's pixels as RGB, copied only if the JPEG is not RGB already (a page's always is)."""
    image = Image.open(io.BytesIO(data))
    image.load()
    return image if image.mode == "RGB" else image.convert("RGB")


def has_raster_image(page: pdfium.PdfPage) -> bool:
    """Whether the page draws a raster image, directly or inside a Form XObject. Stops at the first
    image. Anything it cannot tell (a pdfium error, nesting or object counts past the bounds) is True:
    the safety gate then classifies the page as it would any picture. The caller holds the pdfium lock."""
    seen = 0
    stack: list[tuple[object, int]] = [(None, 0)]
    while stack:
        form, depth = stack.pop()
        if form is None:
            count = pdfium_c.FPDFPage_CountObjects(page)
        else:
            count = pdfium_c.FPDFFormObj_CountObjects(form)
        if count < 0:
            return True
        seen += count
        if seen > MAX_PAGE_OBJECTS:
            return True
        for i in range(count):
            obj = pdfium_c.FPDFPage_GetObject(page, i) if form is None else pdfium_c.FPDFFormObj_GetObject(form, i)
            if not obj:
                return True
            kind = pdfium_c.FPDFPageObj_GetType(obj)
            if kind == pdfium_c.FPDF_PAGEOBJ_IMAGE:
                return True
            if kind == pdfium_c.FPDF_PAGEOBJ_FORM:
                if depth + 1 >= MAX_FORM_DEPTH:
                    return True
                stack.append((obj, depth + 1))
    return False


def _finish(doc: DocumentRecord, index: int, img: Image.Image, text: str, s: RenderSettings,
            evidence: TextEvidence | None = None, has_raster: bool = True, digest: str | None = None,
            words: bytes = b"") -> PageImage:
    evidence = evidence or TextEvidence(coverage=0.0, invisible=())
    return PageImage(doc_sha256=doc.doc_sha256, source_uri=doc.uri, page_index=index,
                     page_hash=digest or page_hash(img),
                     image=encode_page(img, s.jpeg_quality), width=img.width, height=img.height,
                     text_layer=text[: s.max_text_chars], text_coverage=evidence.coverage,
                     invisible_text=tuple(t[:500] for t in evidence.invisible[:50]),
                     flags=(TRUNCATED_FLAG,) if evidence.truncated else (), has_raster=has_raster, words=words)


@dataclass(frozen=True)
class RenderedPdfPage:
    image: Image.Image  # normalised
    text: str
    evidence: TextEvidence
    has_raster: bool
    page_hash: str
    words: bytes = b""  # the text layer's visible words and their boxes (transforms/pages/words.py)


def render_pdf_page(pdf: pdfium.PdfDocument, index: int, s: RenderSettings) -> RenderedPdfPage:
    """Render one page (the caller holds the pdfium lock), read its text layer, compare the two, say
    whether it draws a raster image, and hash its pixels."""
    page = pdf[index]
    try:
        width, height = page.get_size()
        if page_too_large(width, height, s.max_page_points):
            raise PageError(PAGE_TOO_LARGE, f"page is {width:.0f}x{height:.0f} pt")
        scale = pdf_render_scale(width, height, s.dpi, s.max_side)
        # RGB byte order: PIL's own, so a page that needs no resize is hashed from pdfium's buffer as it
        # is, with no BGR swap and no tobytes() copy.
        bitmap = page.render(scale=scale, may_draw_forms=True, rev_byteorder=True)
        try:
            img = bitmap.to_pil()
            final = normalise(img, s.max_side)
            packed = bitmap.mode == "RGB" and bitmap.stride == 3 * bitmap.width and final is img
            digest = page_hash(final, bitmap.buffer if packed else None)
        finally:
            bitmap.close()
        textpage = page.get_textpage()
        text = textpage.get_text_bounded()
        gray = gray_array(img)  # once for both: a few ms a page
        evidence = pdf_text_evidence(page, textpage, img, gray)
        # A text layer whose hidden text was not all checked is no evidence either (as it is no hint).
        words = b"" if evidence.truncated else pdf_words(page, textpage, img, gray)
        textpage.close()
        # Only read where it decides anything: a page whose text does not explain its ink is
        # classified anyway (safety.holds_picture), and the walk runs under the pdfium lock.
        raster = evidence.coverage < PICTURE_MIN_COVERAGE or has_raster_image(page)
    finally:
        page.close()
    return RenderedPdfPage(final, text, evidence, raster, digest, words)


def render_pdf(doc: DocumentRecord, data: bytes, s: RenderSettings) -> Iterator[PageImage | PageRow]:
    with PDFIUM_LOCK:
        pdf = load_pdf(data)
        count = len(pdf)
    try:
        for index in doc.page_indices:
            if index >= count:  # the document has fewer pages than intake counted: never a crash
                yield failed_page(doc, index, RENDER_FAILED, f"the document has {count} pages")
                continue
            try:
                # The lock is held for one page only (never across a yield), so threads interleave.
                with PDFIUM_LOCK:
                    r = render_pdf_page(pdf, index, s)
                yield _finish(doc, index, r.image, r.text, s, r.evidence, r.has_raster, r.page_hash, r.words)
            except PageError as err:
                yield failed_page(doc, index, err.reason_code, str(err))
            except Exception as err:  # noqa: BLE001 - one bad page must not fail its document
                yield failed_page(doc, index, RENDER_FAILED, f"{type(err).__name__}: {err}")
    finally:
        with PDFIUM_LOCK:
            pdf.close()


def render_image(doc: DocumentRecord, data: bytes, s: RenderSettings) -> Iterator[PageImage | PageRow]:
    with open_image(data, s.max_image_pixels) as img:
        for index in doc.page_indices:
            try:
                seek_frame(img, index, s.max_image_pixels)  # before the frame is decoded
                frame = ImageOps.exif_transpose(img) if index == 0 else img.copy()
                yield _finish(doc, index, normalise(frame, s.max_side), "", s)
            except Image.DecompressionBombError as err:
                yield failed_page(doc, index, DECOMPRESSION_BOMB, str(err))
            except Exception as err:  # noqa: BLE001
                yield failed_page(doc, index, RENDER_FAILED, f"{type(err).__name__}: {err}")


def failed_page(doc: DocumentRecord, index: int, reason_code: str, message: str) -> PageRow:
    return PageRow.of_index(doc.doc_sha256, doc.uri, index, FAILED, reason_code=reason_code, message=message[:500],
                            route="failed")


def render_document(doc: DocumentRecord, data: bytes, s: RenderSettings) -> Iterator[PageImage | PageRow]:
    """Every page of the document, one at a time: a PageImage, or a failed PageRow. Pure."""
    if hashlib.sha256(data).hexdigest() != doc.doc_sha256:
        for index in doc.page_indices:
            yield failed_page(doc, index, CHANGED_DURING_RUN, "the object's bytes changed after intake")
        return
    done = 0
    try:
        pages = render_pdf(doc, data, s) if doc.format == "pdf" else render_image(doc, data, s)
        for page in pages:
            done += 1
            yield page
    except PdfPasswordError as err:  # intake checked, but be safe: never crash on one document
        for index in doc.page_indices[done:]:
            yield failed_page(doc, index, ENCRYPTED, str(err))
    except Exception as err:  # noqa: BLE001 - opening failed after intake passed: the pages fail, not the run
        for index in doc.page_indices[done:]:
            yield failed_page(doc, index, RENDER_FAILED, f"{type(err).__name__}: {err}")
