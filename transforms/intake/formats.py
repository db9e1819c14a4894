"""Format sniffing from magic bytes and safe opening of PDFs and images. Never trusts an extension."""
from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pypdfium2 as pdfium
from PIL import Image

# pdfium is not thread-safe, and Beam runs DoFns on several threads of one worker (Dataflow: 12).
# One lock per process serialises every pdfium call; it guards a C library, not Python state.
PDFIUM_LOCK = threading.Lock()

IMAGE_FORMATS = ("png", "jpeg", "gif", "bmp", "tiff", "webp", "heic", "avif")
PAGED_IMAGE_FORMATS = ("tiff",)  # every frame is a page; other animated formats use frame 0


def sniff_format(head: bytes) -> str | None:
    """The real format from the first bytes, or None. PDF allows junk before the header (1 KiB)."""
    if b"%PDF-" in head[:1024]:
        return "pdf"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if head.startswith(b"BM") and len(head) >= 26:
        return "bmp"
    if head[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return "tiff"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[4:8] == b"ftyp":
        brand = head[8:12]
        if brand in (b"avif", b"avis"):
            return "avif"
        if brand in (b"heic", b"heix", b"heim", b"heis", b"mif1", b"msf1", b"hevc", b"hevx"):
            return "heic"
    return None


class PdfPasswordError(Exception):
    """The PDF needs a password."""


def load_pdf(data: bytes) -> pdfium.PdfDocument:
    """Open a PDF; the caller holds PDFIUM_LOCK around this and every later call on the document."""
    try:
        doc = pdfium.PdfDocument(data)
    except pdfium.PdfiumError as err:
        if "password" in str(err).lower():
            raise PdfPasswordError(str(err)) from err
        raise
    # Without a form environment pdfium draws no form fields: filled-in AcroForm values would be
    # missing from the page the model sees.
    doc.init_forms()
    return doc


@contextmanager
def open_pdf(data: bytes) -> Iterator[pdfium.PdfDocument]:
    """Open a PDF and hold the pdfium lock for the whole block: for short looks such as a page count."""
    with PDFIUM_LOCK:
        doc = load_pdf(data)
        try:
            yield doc
        finally:
            doc.close()


def open_image(data: bytes, max_pixels: int) -> Image.Image:
    """Open an image lazily (header only) and refuse it if it declares too many pixels."""
    img = Image.open(io.BytesIO(data))
    check_frame(img, max_pixels)
    return img


def check_frame(img: Image.Image, max_pixels: int) -> None:
    """Refuse the current frame if its header declares too many pixels. Call after every `seek`:
    each frame of a TIFF has its own size, and seeking reads the header only, never the pixels."""
    width, height = img.size
    if width * height > max_pixels:
        frame = img.tell()
        where = f"frame {frame + 1} declares" if frame else "image declares"
        raise Image.DecompressionBombError(
            f"{where} {width}x{height} = {width * height:,} pixels, over the limit of {max_pixels:,}")


def seek_frame(img: Image.Image, index: int, max_pixels: int) -> None:
    """Move to frame `index` and check its declared size before anything decodes it."""
    img.seek(index)
    check_frame(img, max_pixels)


def image_page_count(img: Image.Image, fmt: str) -> int:
    if fmt in PAGED_IMAGE_FORMATS:
        return max(1, int(getattr(img, "n_frames", 1)))
    return 1
