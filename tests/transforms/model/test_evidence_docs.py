"""Evidence on real pages: born-digital invoices (pdfium's text layer, through the page stage) and scanned receipts
(Tesseract's words, through the hints stage), against the boxes where tests/support/grounded_docs.py measured each
true value printed. The answers are the documents' true values, as a perfect model would give them."""
from __future__ import annotations

import hashlib
import shutil

import pytest

from schemas.evidence import decode_words
from schemas.records import DocumentRecord, PageImage
from tests.support import docmaker, grounded_docs
from transforms.hints.choose import HintSettings, apply_hint, choose_hint
from transforms.model.evidence import match
from transforms.pages.render import RenderSettings, render_document

SETTINGS = RenderSettings(dpi=150, max_side=1288, jpeg_quality=90, max_text_chars=20000, max_page_points=14400,
                          max_image_pixels=50_000_000, max_bytes=50_000_000)


def rendered(data: bytes, fmt: str) -> PageImage:
    doc = DocumentRecord(uri=f"mem.{fmt}", size=len(data), doc_sha256=hashlib.sha256(data).hexdigest(), format=fmt,
                         page_count=1)
    (page,) = list(render_document(doc, data, SETTINGS))
    assert isinstance(page, PageImage)
    return page


def grounded_share(docs: list[grounded_docs.MadeDoc], pages: list[PageImage]) -> tuple[float, list[str]]:
    """The share of non-empty values found; and each found value whose box misses where it is printed."""
    found = total = 0
    misplaced = []
    for doc, page in zip(docs, pages, strict=True):
        for row in match(doc.answer, decode_words(page.words)):
            total += 1
            if not row.grounded:
                continue
            found += 1
            overlap = max(grounded_docs.iou(row.box, b) for b in doc.boxes[row.field_path])
            if overlap < 0.5:
                misplaced.append(f"{doc.name} {row.field_path}: IoU {overlap:.2f}")
    assert total > 20 * len(docs) // 2  # the answers have their values
    return found / total, misplaced


def test_born_digital_invoices_values_are_found_where_they_are_printed() -> None:
    docs = [grounded_docs.invoice(seed) for seed in range(4)]
    pages = [rendered(d.data, "pdf") for d in docs]
    assert all(decode_words(p.words).source == "text_layer" for p in pages)
    share, misplaced = grounded_share(docs, pages)
    assert share >= 0.95 and not misplaced, (share, misplaced)


@pytest.mark.skipif(shutil.which("tesseract") is None, reason="Tesseract is not installed")
def test_scanned_receipts_values_are_found_where_they_are_printed() -> None:
    docs = [grounded_docs.receipt(seed) for seed in range(3)]
    settings = HintSettings(mode="auto")
    pages = []
    for doc in docs:
        page = rendered(doc.data, "png")
        assert page.words == b""  # an image has no text layer: the words come from OCR
        pages.append(apply_hint(page, choose_hint(page, settings), settings))
    assert all(decode_words(p.words).source == "ocr" for p in pages)
    share, misplaced = grounded_share(docs, pages)
    assert share >= 0.95 and not misplaced, (share, misplaced)


def test_a_made_up_total_is_not_found_on_the_page() -> None:
    doc = grounded_docs.invoice(0, made_up_total=True)
    rows = {r.field_path: r for r in match(doc.answer, decode_words(rendered(doc.data, "pdf").words))}
    assert rows["total"].grounded is False and rows["subtotal"].grounded is True


def test_text_the_page_does_not_show_is_no_evidence() -> None:
    data = docmaker.text_pdf([["Receipt", "Total 8.55"]], white_text="Total 9999.99")
    page = rendered(data, "pdf")
    assert "9999.99" in page.text_layer  # the text layer holds it ...
    words = decode_words(page.words)
    assert "8.55" in words.texts and "9999.99" not in words.texts  # ... the words do not: no one can see it
    rows = {r.field_path: r.grounded for r in match({"total": 9999.99, "shown": 8.55}, words)}
    assert rows == {"total": False, "shown": True}
