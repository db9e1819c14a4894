"""Pure tests of intake: sniffing, the size gate, inspect_document and the intake DoFn. No Beam pipeline."""
from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from pathlib import Path

import pytest
from PIL import Image

from schemas.records import REASON_CODES, DocumentRecord, DocumentRow, ListedObject
from schemas.statuses import REJECTED
from tests import docmaker
from transforms.intake.accept import IntakeDoFn, size_gate
from transforms.intake.formats import sniff_format
from transforms.intake.inspection import IntakeLimits, inspect_document, reject
from transforms.intake.listing import MISSING

LIMITS = IntakeLimits(max_bytes=50 * 2**20, max_pages=5000, max_image_pixels=89_478_485)


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


# --- sniff_format --------------------------------------------------------------------------------

@pytest.mark.parametrize(("make", "expected"), [
    (docmaker.invoice_pdf, "pdf"),
    (docmaker.tiny_png, "png"),
    (docmaker.jpeg_cmyk, "jpeg"),
    (docmaker.exif_rotated_jpeg, "jpeg"),
    (docmaker.animated_gif, "gif"),
    (docmaker.bmp, "bmp"),
    (docmaker.multipage_tiff, "tiff"),
    (docmaker.webp, "webp"),
    (docmaker.huge_png_header, "png"),
    (docmaker.encrypted_pdf, "pdf"),
])
def test_sniff_real_files(make: Callable[[], bytes], expected: str) -> None:
    data = make()
    assert sniff_format(data[:1024]) == expected


def test_sniff_big_endian_tiff() -> None:
    buf = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buf, format="TIFF")
    little = buf.getvalue()
    assert little[:4] == b"II*\x00"
    assert sniff_format(b"MM\x00*" + little[4:]) == "tiff"


@pytest.mark.parametrize("head", [
    b"",
    b"hello world, this is plain text\n",
    docmaker.random_bytes(1024, seed=3),
    b"BM" + b"\x00" * 10,  # a BMP header needs at least 26 bytes
    b"GIF90a" + b"\x00" * 20,
    b"RIFF\x00\x00\x00\x00WAVEfmt ",  # RIFF, but not WebP
    b"\x00\x00\x00\x18ftypmp42",  # ISO media, but a video brand
])
def test_sniff_rejects_non_documents(head: bytes) -> None:
    assert sniff_format(head) is None


def test_sniff_pdf_after_junk_within_first_kib() -> None:
    pdf = docmaker.invoice_pdf()
    assert sniff_format((b"\x00junk" * 100 + pdf)[:1024]) == "pdf"
    assert sniff_format((b"x" * 1100 + pdf)[:1024]) is None


def test_sniff_heic_and_avif_brands() -> None:
    assert sniff_format(b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00") == "heic"
    assert sniff_format(b"\x00\x00\x00\x18ftypmif1\x00\x00\x00\x00") == "heic"
    assert sniff_format(b"\x00\x00\x00\x1cftypavif\x00\x00\x00\x00") == "avif"


def test_sniff_ignores_the_extension() -> None:
    # A text file named .png is not a PNG; a PDF named .jpg is a PDF. Only bytes count.
    assert sniff_format(b"not really a png\n") is None
    assert sniff_format(docmaker.invoice_pdf()[:1024]) == "pdf"


# --- size_gate -----------------------------------------------------------------------------------

def test_size_gate_too_large_from_listing_alone() -> None:
    limits = IntakeLimits(max_bytes=1000, max_pages=10, max_image_pixels=10_000)
    row = size_gate(ListedObject(uri="s3://b/big.pdf", size=1001), limits)
    assert row is not None
    assert (row.outcome, row.reason_code, row.bytes) == ("rejected", "too_large", 1001)
    assert "1,001" in (row.message or "")
    assert size_gate(ListedObject(uri="s3://b/ok.pdf", size=1000), limits) is None  # the limit itself is fine


def test_size_gate_zero_bytes_and_missing() -> None:
    empty = size_gate(ListedObject(uri="/d/zero.pdf", size=0), LIMITS)
    assert empty is not None and empty.reason_code == "empty"
    missing = size_gate(ListedObject(uri="/d/gone.pdf", size=MISSING), LIMITS)
    assert missing is not None and missing.reason_code == "not_found"
    assert missing.bytes == 0  # never a negative byte count in the table


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


# --- the intake DoFn ------------------------------------------------------------------------

def test_intake_dofn_accepts_rejects_and_survives_read_errors(tmp_path: Path) -> None:
    from apache_beam.pvalue import TaggedOutput

    good, empty = tmp_path / "good.pdf", tmp_path / "notes.txt"
    good.write_bytes(docmaker.invoice_pdf())
    empty.write_bytes(b"plain text")
    fn = IntakeDoFn(LIMITS)

    def run(obj: ListedObject) -> object:
        (out,) = list(fn.process(obj))
        return out

    accepted = run(ListedObject(str(good), good.stat().st_size))
    assert isinstance(accepted, DocumentRecord) and accepted.page_count == 1
    for obj, reason in ((ListedObject(str(empty), 10), "unsupported_format"),
                        (ListedObject(str(tmp_path / "x.pdf"), LIMITS.max_bytes + 1), "too_large"),
                        (ListedObject(str(tmp_path / "vanished.pdf"), 10), "unreadable")):
        out = run(obj)
        assert isinstance(out, TaggedOutput) and out.tag == REJECTED, obj
        assert isinstance(out.value, DocumentRow) and out.value.reason_code == reason, (obj, out.value)
    assert "read failed: " in (run(ListedObject(str(tmp_path / "vanished.pdf"), 10)).value.message or "")


def test_reject_messages_say_what_happened() -> None:
    """The message is what a person reads in the `documents` row: each reason's wording, exactly."""
    obj = ListedObject("s3://b/x", 10)
    cases = [(docmaker.encrypted_pdf(), "encrypted", "the PDF is password protected"),
             (b"hello world", "unsupported_format", "magic bytes match no supported PDF or image format"),
             (docmaker.truncated_pdf(), "unreadable", "pdf: PdfiumError: Failed to load document (PDFium: Data "
                                                      "format error)."),
             (docmaker.billion_pages_pdf(count=1_000_000), "too_many_pages", "1,000,000 pages is over the limit "
                                                                             "of 5,000"),
             (b"", "empty", "the object has zero bytes")]
    for data, reason, message in cases:
        row = inspect_document(obj, data, LIMITS)
        assert isinstance(row, DocumentRow) and (row.reason_code, row.message) == (reason, message), row
        assert row.source_uri == "s3://b/x" and row.outcome == "rejected"
    assert size_gate(ListedObject("s3://b/x", MISSING), LIMITS).message == \
        "the object was listed by name but does not exist"  # type: ignore[union-attr]
    assert size_gate(ListedObject("s3://b/x", 0), LIMITS).message == "the object has zero bytes"  # type: ignore[union-attr]


def test_data_of_exactly_max_bytes_is_accepted() -> None:
    data = docmaker.invoice_pdf()
    limits = IntakeLimits(max_bytes=len(data), max_pages=5, max_image_pixels=LIMITS.max_image_pixels)
    assert isinstance(inspect_document(ListedObject("u", len(data)), data, limits), DocumentRecord)
    small = IntakeLimits(max_bytes=len(data) - 1, max_pages=5, max_image_pixels=LIMITS.max_image_pixels)
    row = inspect_document(ListedObject("u", len(data)), data, small)
    assert isinstance(row, DocumentRow) and row.reason_code == "too_large"
    assert row.message == f"read more than {len(data) - 1:,} bytes"
