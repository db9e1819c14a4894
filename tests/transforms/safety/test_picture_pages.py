"""Which pages the picture checks (the NSFW classifier) see: image inputs and PDF pages that draw a raster
image or leave ink unexplained; a page of text and rules skips them, with a note. Blocklists see every page."""
from __future__ import annotations

import hashlib
import io
from dataclasses import replace
from itertools import islice
from pathlib import Path

import pypdfium2 as pdfium
import pytest
from PIL import Image

from schemas.records import DocumentRecord, PageImage
from tests.support import docmaker
from tests.support.corpus_pdfs import corpus_pdfs
from tests.support.pictures import encode, photo, write_list
from transforms.pages.render import RenderSettings, has_raster_image, render_document
from transforms.safety.blocklist import usable_pdq
from transforms.safety.gate import Checks, SafetyConfig, Verdict, holds_picture, load_checks, screen_page

SETTINGS = RenderSettings(dpi=100, max_side=1000, jpeg_quality=90, max_text_chars=5000, max_page_points=14400,
                          max_image_pixels=89_478_485, max_bytes=2**26)
LINES = [[f"Line {i}: invoice total {i * 7.5:.2f} due on delivery" for i in range(30)]]
SKIP_NOTE = "nudenet:skipped_no_raster"


def with_photo(base: bytes, nested: bool = False) -> bytes:
    """`base` with a JPEG photo drawn on its first page: directly, or inside a Form XObject (a page
    imported as an XObject, as imposition tools do)."""
    pdf = pdfium.PdfDocument(base)
    target = pdf[0]
    jpeg = encode(photo(3, (320, 240)), "JPEG", quality=85)
    if nested:
        holder = pdfium.PdfDocument.new()
        holder_page = holder.new_page(400, 300)
        _draw_jpeg(holder, holder_page, jpeg)
        xobject = holder.page_as_xobject(0, pdf)
        target.insert_obj(xobject.as_pageobject())
    else:
        _draw_jpeg(pdf, target, jpeg)
    target.gen_content()
    buf = io.BytesIO()
    pdf.save(buf)
    return buf.getvalue()


def _draw_jpeg(pdf: pdfium.PdfDocument, page: pdfium.PdfPage, jpeg: bytes) -> None:
    image = pdfium.PdfImage.new(pdf)
    image.load_jpeg(io.BytesIO(jpeg), pages=[page])
    image.set_matrix(pdfium.PdfMatrix().scale(320, 240).translate(60, 300))
    page.insert_obj(image)
    page.gen_content()


def rendered(data: bytes, fmt: str = "pdf") -> list[PageImage]:
    doc = DocumentRecord(uri=f"mem://x.{fmt}", size=len(data), doc_sha256=hashlib.sha256(data).hexdigest(),
                         format=fmt, page_count=len(pdfium.PdfDocument(data)) if fmt == "pdf" else 1)
    pages = list(render_document(doc, data, SETTINGS))
    assert all(isinstance(p, PageImage) for p in pages), pages
    return pages  # type: ignore[return-value]


@pytest.fixture(scope="module")
def always_quarantines() -> Checks:
    """The real NudeNet classifier with threshold 0: any page it looks at is quarantined, so a verdict
    proves that the classifier ran and no verdict proves that it did not."""
    return load_checks(SafetyConfig(nsfw_classifier="nudenet", nsfw_threshold=0.0))


def test_raster_detection_on_pdf_pages() -> None:
    text = docmaker.text_pdf(LINES)
    cases = {"text": (text, False), "photo": (with_photo(text), True), "nested": (with_photo(text, True), True),
             "invoice": (docmaker.invoice_pdf(), False)}
    for name, (data, expected) in cases.items():
        pdf = pdfium.PdfDocument(data)
        assert has_raster_image(pdf[0]) is expected, name
        (page,) = rendered(data)
        assert page.has_raster is expected, name


def test_a_pdf_page_with_a_photo_is_classified(always_quarantines: Checks) -> None:
    (page,) = rendered(with_photo(docmaker.text_pdf(LINES)))
    assert page.text_coverage >= 0.5  # mostly text, yet the photo sends it to the classifier
    _, verdict = screen_page(page, always_quarantines, low_side=0)
    assert verdict is not None and verdict.reason_code == "blocked_nsfw"
    (nested,) = rendered(with_photo(docmaker.text_pdf(LINES), nested=True))
    _, verdict = screen_page(nested, always_quarantines, low_side=0)
    assert verdict is not None and verdict.reason_code == "blocked_nsfw"


def test_a_text_only_page_skips_the_classifier_with_a_note(always_quarantines: Checks) -> None:
    (page,) = rendered(docmaker.text_pdf(LINES))
    assert not holds_picture(page)
    checked, verdict = screen_page(page, always_quarantines, low_side=0)
    assert verdict is None
    assert SKIP_NOTE in checked.flag_detail
    # Ink that the text layer does not explain (a vector drawing, outlined text) is classified again.
    _, verdict = screen_page(replace(page, text_coverage=0.3), always_quarantines, low_side=0)
    assert verdict is not None and verdict.reason_code == "blocked_nsfw"


def test_image_inputs_are_classified(always_quarantines: Checks) -> None:
    for fmt, data in (("png", docmaker.scanned_png()), ("jpeg", encode(photo(5), "JPEG"))):
        (page,) = rendered(data, fmt)
        assert page.has_raster and holds_picture(page), fmt
        checked, verdict = screen_page(page, always_quarantines, low_side=0)
        assert verdict is not None and verdict.reason_code == "blocked_nsfw", fmt
        assert SKIP_NOTE not in checked.flag_detail


def test_blocklists_still_see_text_only_pages(tmp_path: Path) -> None:
    (page,) = rendered(docmaker.text_pdf(LINES))
    assert not page.has_raster
    img = Image.open(io.BytesIO(page.image)).convert("RGB")
    pdq = usable_pdq(img)
    assert pdq is not None  # a page of text lines has enough structure for a PDQ hash
    for entry in (f"sha256:{page.page_hash}", f"pdq:{pdq}"):
        cfg = SafetyConfig(blocklists=(write_list(tmp_path, entry + "\n", f"{entry[:3]}.txt"),),
                           nsfw_classifier="nudenet")
        _, verdict = screen_page(page, load_checks(cfg), low_side=0)
        assert verdict is not None and verdict.reason_code == "blocked_hash", entry


def test_corpus_verdicts_equal_classifying_every_page() -> None:
    """On the shared corpus's documents and scans, skipping text-only pages quarantines exactly what
    classifying every page does, at the default threshold and at a low one."""
    pages: list[PageImage] = []
    for path, data in corpus_pdfs():
        try:
            count = len(pdfium.PdfDocument(data))
        except pdfium.PdfiumError:  # encrypted or broken: intake rejects these before the gate
            continue
        doc = DocumentRecord(uri=path, size=len(data), doc_sha256=hashlib.sha256(data).hexdigest(),
                             format="pdf", page_count=count)
        pages += [p for p in islice(render_document(doc, data, SETTINGS), 2) if isinstance(p, PageImage)]
    skipped = [p for p in pages if not holds_picture(p)]
    assert len(pages) > 40 and 0 < len(skipped) < len(pages), (len(pages), len(skipped))
    print(f"{len(pages)} corpus pages, {len(skipped)} skip the classifier")
    for threshold in (0.8, 0.05):
        checks = load_checks(SafetyConfig(nsfw_classifier="nudenet", nsfw_threshold=threshold))
        for page in pages:
            gated = screen_page(page, checks, low_side=0)[1]
            every = screen_page(replace(page, has_raster=True), checks, low_side=0)[1]
            assert (gated and gated.reason_code) == (every and every.reason_code), (page.source_uri, threshold)


class _Always:
    """A page check that quarantines whatever it is shown (so a verdict proves it ran)."""

    def __init__(self, name: str, pictures_only: bool) -> None:
        self.name, self.pictures_only = name, pictures_only

    def check(self, page: PageImage, image: Image.Image) -> Verdict:
        return Verdict("blocked_hash", f"{self.name} saw the page", {"check": self.name})


def test_extra_checks_run_on_text_pages_unless_pictures_only() -> None:
    (page,) = rendered(docmaker.text_pdf(LINES))
    base = load_checks(SafetyConfig())
    vendor = replace_others(base, [_Always("vendor", pictures_only=False)])
    _, verdict = screen_page(page, vendor, low_side=0)
    assert verdict is not None and verdict.detail["check"] == "vendor"
    picture = replace_others(base, [_Always("picturecheck", pictures_only=True)])
    checked, verdict = screen_page(page, picture, low_side=0)
    assert verdict is None and "picturecheck:skipped_no_raster" in checked.flag_detail
    (photo_page,) = rendered(with_photo(docmaker.text_pdf(LINES)))
    _, verdict = screen_page(photo_page, picture, low_side=0)
    assert verdict is not None and verdict.detail["check"] == "picturecheck"


def replace_others(checks: Checks, others: list) -> Checks:
    return Checks(checks.lists, checks.blocklist, others)
