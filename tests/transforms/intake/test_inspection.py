"""inspect_document on real files (rejections with their reason codes, accepted formats and page counts), and the
inspection's seam: what a page counter raises becomes the reason code (the same rule in process and in the
intake process), and a row that the counter returns (the intake process's timeout) is the document's row."""
from __future__ import annotations

import hashlib
from collections.abc import Callable

import pypdfium2 as pdfium
import pytest
from PIL import Image, UnidentifiedImageError

from schemas.reasons import REASON_CODES
from schemas.records import DocumentRecord, DocumentRow, ListedObject
from tests.support import docmaker
from transforms.intake.formats import PdfPasswordError
from transforms.intake.inspection import (
    IntakeLimits,
    PageCounter,
    count_or_reject,
    count_pages,
    inspect_document,
    reject,
)

LIMITS = IntakeLimits(max_bytes=50 * 2**20, max_pages=5000, max_image_pixels=89_478_485)
OBJ = ListedObject(uri="/in/doc", size=10)


def _inspect(name: str, data: bytes, limits: IntakeLimits = LIMITS) -> DocumentRecord | DocumentRow:
    return inspect_document(ListedObject(uri=f"/data/{name}", size=len(data)), data, limits)


def _rejected(name: str, data: bytes, reason: str, limits: IntakeLimits = LIMITS) -> DocumentRow:
    row = _inspect(name, data, limits)
    assert isinstance(row, DocumentRow), f"{name} was accepted: {row}"
    assert row.outcome == "rejected"
    assert row.reason_code == reason, row
    assert row.reason_code in REASON_CODES
    assert row.source_uri == f"/data/{name}"
    assert row.message
    return row


def _accepted(name: str, data: bytes, limits: IntakeLimits = LIMITS) -> DocumentRecord:
    rec = _inspect(name, data, limits)
    assert isinstance(rec, DocumentRecord), f"{name} was rejected: {rec}"
    assert rec.uri == f"/data/{name}"
    assert rec.size == len(data)
    assert rec.doc_sha256 == hashlib.sha256(data).hexdigest()
    return rec


def raising(err: BaseException) -> PageCounter:
    def count(data: bytes, fmt: str, limits: IntakeLimits) -> int:
        raise err
    return count


@pytest.mark.parametrize(("fmt", "err", "reason"), [
    ("pdf", PdfPasswordError("x"), "encrypted"),
    ("png", Image.DecompressionBombError("too big"), "decompression_bomb"),
    ("png", UnidentifiedImageError("at 0x7f"), "unreadable"),
    ("heic", UnidentifiedImageError("at 0x7f"), "unsupported_format"),
    ("pdf", pdfium.PdfiumError("Failed to load document"), "unreadable"),
    ("tiff", OSError("truncated"), "unreadable"),
    ("gif", EOFError(), "unreadable"),
])
def test_what_the_counter_raises_becomes_the_reason(fmt: str, err: BaseException, reason: str) -> None:
    row = count_or_reject(OBJ, b"data", fmt, "ab" * 32, LIMITS, raising(err))
    assert isinstance(row, DocumentRow)
    assert (row.outcome, row.reason_code, row.format, row.doc_sha256) == ("rejected", reason, fmt, "ab" * 32)
    assert "0x7f" not in row.message  # an address would differ on every run


def test_an_unexpected_error_is_not_swallowed() -> None:
    with pytest.raises(RuntimeError):  # in the intake process this kills the child: worker_crashed
        count_or_reject(OBJ, b"data", "pdf", "ab" * 32, LIMITS, raising(RuntimeError("bug")))


def test_a_row_from_the_counter_is_the_documents_row() -> None:
    data = docmaker.multipage_pdf(2)
    stopped = reject(OBJ, "timeout", "stopped", doc_sha256="s", format="pdf")
    assert inspect_document(OBJ, data, LIMITS, lambda *_: stopped) is stopped
    record = inspect_document(OBJ, data, LIMITS, lambda *_: 2)
    assert record == DocumentRecord(uri=OBJ.uri, size=len(data), doc_sha256=hashlib.sha256(data).hexdigest(),
                                    format="pdf", page_count=2)
    assert inspect_document(OBJ, data, LIMITS) == record  # the default counter opens it: 2 pages
    assert count_pages(data, "pdf", LIMITS) == 2


def test_reject_caps_the_message() -> None:
    row = reject(ListedObject(uri="/d/x", size=5), "unreadable", "x" * 5000)
    assert len(row.message or "") == 500


# --- inspect_document: rejections ----------------------------------------------------------------

def test_zero_bytes() -> None:
    row = _rejected("zero.pdf", b"", "empty")
    assert row.doc_sha256 is None


def test_data_longer_than_max_bytes_is_too_large() -> None:
    # The listing said 10 bytes, but the read returned more than the limit: the bytes decide.
    limits = IntakeLimits(max_bytes=100, max_pages=10, max_image_pixels=10_000)
    data = docmaker.invoice_pdf()
    row = inspect_document(ListedObject(uri="/data/liar.pdf", size=10), data, limits)
    assert isinstance(row, DocumentRow)
    assert row.reason_code == "too_large"


def test_truncated_pdf_is_unreadable() -> None:
    data = docmaker.truncated_pdf()
    row = _rejected("truncated.pdf", data, "unreadable")
    assert row.format == "pdf"
    assert row.doc_sha256 == hashlib.sha256(data).hexdigest()


def test_random_bytes_named_pdf() -> None:
    row = _rejected("random.pdf", docmaker.random_bytes(4096), "unsupported_format")
    assert row.format is None
    assert row.doc_sha256 is not None


def test_text_file_named_png() -> None:
    row = _rejected("notes.png", b"This is a text file, whatever its name says.\n" * 20, "unsupported_format")
    assert row.format is None


def test_encrypted_pdf() -> None:
    row = _rejected("locked.pdf", docmaker.encrypted_pdf(), "encrypted")
    assert row.format == "pdf"


def test_pdf_claiming_a_billion_pages_is_counted_by_its_real_pages() -> None:
    # PDFium ignores a /Count that large and counts the page tree's kids: one real page.
    rec = _accepted("billion.pdf", docmaker.billion_pages_pdf())
    assert (rec.format, rec.page_count) == ("pdf", 1)


def test_pdf_claiming_a_million_pages_is_too_many() -> None:
    row = _rejected("million.pdf", docmaker.billion_pages_pdf(1_000_000), "too_many_pages")
    assert row.page_count == 1_000_000
    assert "5,000" in (row.message or "")


def test_page_limit_boundary() -> None:
    data = docmaker.multipage_pdf(3)
    assert _accepted("three.pdf", data, IntakeLimits(10**6, 3, 10**6)).page_count == 3
    _rejected("three.pdf", data, "too_many_pages", IntakeLimits(10**6, 2, 10**6))


def test_multipage_tiff_over_the_page_limit() -> None:
    row = _rejected("pages.tiff", docmaker.multipage_tiff(4), "too_many_pages", IntakeLimits(10**6, 3, 10**6))
    assert (row.format, row.page_count) == ("tiff", 4)


def test_image_over_pillow_limit_is_a_decompression_bomb() -> None:
    # 20000 x 20000 is over twice Pillow's own limit: Pillow refuses it on open.
    row = _rejected("bomb.png", docmaker.huge_png_header(), "decompression_bomb")
    assert row.format == "png"


def test_image_over_our_pixel_limit_is_a_decompression_bomb() -> None:
    limits = IntakeLimits(max_bytes=10**6, max_pages=10, max_image_pixels=1_000_000)
    row = _rejected("big.png", docmaker.huge_png_header(1001, 1000), "decompression_bomb", limits)
    assert "1,001,000" in (row.message or "")


def test_pixel_limit_boundary() -> None:
    data = docmaker.webp()  # 64 x 48
    _accepted("pic.webp", data, IntakeLimits(10**6, 10, 64 * 48))
    _rejected("pic.webp", data, "decompression_bomb", IntakeLimits(10**6, 10, 64 * 48 - 1))


def test_truncated_image_is_unreadable() -> None:
    data = docmaker.scanned_png()
    row = _rejected("cut.png", data[: len(data) // 2], "unreadable")
    assert row.format == "png"


def test_sniffed_heic_that_pillow_cannot_open_is_unsupported() -> None:
    fake = b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + b"\x00" * 200
    row = _rejected("photo.heic", fake, "unsupported_format")
    assert row.format == "heic"


# --- inspect_document: accepted ------------------------------------------------------------------

@pytest.mark.parametrize(("name", "make", "fmt", "pages"), [
    ("tiny.png", docmaker.tiny_png, "png", 1),
    ("cmyk.jpg", docmaker.jpeg_cmyk, "jpeg", 1),
    ("anim.gif", lambda: docmaker.animated_gif(3), "gif", 1),  # animated: frame 0 only
    ("scan.tiff", lambda: docmaker.multipage_tiff(3), "tiff", 3),  # every TIFF frame is a page
    ("scan5.tiff", lambda: docmaker.multipage_tiff(5), "tiff", 5),
    ("pic.webp", docmaker.webp, "webp", 1),
    ("pic.bmp", docmaker.bmp, "bmp", 1),
    ("rotated.jpg", docmaker.exif_rotated_jpeg, "jpeg", 1),
    ("invoice.pdf", docmaker.invoice_pdf, "pdf", 1),
    ("report.pdf", lambda: docmaker.multipage_pdf(4, terms_page=True), "pdf", 5),
    ("scan.png", docmaker.scanned_png, "png", 1),
])
def test_accepted(name: str, make: Callable[[], bytes], fmt: str, pages: int) -> None:
    rec = _accepted(name, make())
    assert (rec.format, rec.page_count) == (fmt, pages)


def test_pdf_named_jpg_is_a_pdf() -> None:
    assert _accepted("actually-a.jpg", docmaker.invoice_pdf()).format == "pdf"


def test_inspect_is_deterministic() -> None:
    data = docmaker.multipage_tiff(2)
    assert _inspect("a.tiff", data) == _inspect("a.tiff", data)


def test_data_of_exactly_max_bytes_is_accepted() -> None:
    data = docmaker.invoice_pdf()
    limits = IntakeLimits(max_bytes=len(data), max_pages=5, max_image_pixels=LIMITS.max_image_pixels)
    assert isinstance(inspect_document(ListedObject("u", len(data)), data, limits), DocumentRecord)
    small = IntakeLimits(max_bytes=len(data) - 1, max_pages=5, max_image_pixels=LIMITS.max_image_pixels)
    row = inspect_document(ListedObject("u", len(data)), data, small)
    assert isinstance(row, DocumentRow) and row.reason_code == "too_large"
    assert row.message == f"read more than {len(data) - 1:,} bytes"
