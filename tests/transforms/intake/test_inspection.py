"""The inspection's seam: what a page counter raises becomes the reason code (the same rule in process and in the
intake process), and a row that the counter returns (the intake process's timeout) is the document's row.
The formats themselves are tested through real files in test_accept.py."""
from __future__ import annotations

import hashlib

import pypdfium2 as pdfium
import pytest
from PIL import Image, UnidentifiedImageError

from schemas.records import DocumentRecord, DocumentRow, ListedObject
from tests import docmaker
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
