"""Pure tests of the page stage (render_document, normalise, page_hash). No Beam pipeline."""
from __future__ import annotations

import hashlib
import io
import re
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from PIL import Image

from schemas.reasons import REASON_CODES
from schemas.records import DocumentRecord, PageImage, PageRow
from tests.support import docmaker
from transforms.output.outcome import document_outcome
from transforms.pages.render import RenderSettings, normalise, page_hash, render_document

SETTINGS = RenderSettings(dpi=150.0, max_side=1288, jpeg_quality=90, max_text_chars=20_000,
                          max_page_points=14_400.0, max_image_pixels=89_478_485, max_bytes=50 * 2**20)


def _record(data: bytes, fmt: str, pages: int, uri: str = "/data/doc") -> DocumentRecord:
    return DocumentRecord(uri=uri, size=len(data), doc_sha256=hashlib.sha256(data).hexdigest(), format=fmt,
                          page_count=pages)


def _render(data: bytes, fmt: str, pages: int, settings: RenderSettings = SETTINGS,
            uri: str = "/data/doc") -> list[PageImage | PageRow]:
    return list(render_document(_record(data, fmt, pages, uri), data, settings))


def _images(out: list[PageImage | PageRow]) -> list[PageImage]:
    assert all(isinstance(p, PageImage) for p in out), [p for p in out if isinstance(p, PageRow)]
    return [p for p in out if isinstance(p, PageImage)]


def _decode(page: PageImage) -> Image.Image:
    img = Image.open(io.BytesIO(page.image))
    assert img.format == "JPEG"  # pages travel as encoded bytes
    img.load()
    return img


def _with_page_size(pdf: bytes, index: int, size: tuple[int, int]) -> bytes:
    """A docmaker PDF with page `index`'s MediaBox replaced, and the xref rebuilt so offsets stay exact."""
    boxes = list(re.finditer(rb"/MediaBox \[0 0 \d+ \d+\]", pdf))
    box = boxes[index]
    body = pdf[: box.start()] + b"/MediaBox [0 0 %d %d]" % size + pdf[box.end():]
    head = body[: body.index(b"xref\n")]
    offsets = [m.start() for m in re.finditer(rb"(?m)^\d+ 0 obj\n", head)]
    xref = b"xref\n0 %d\n0000000000 65535 f \n" % (len(offsets) + 1)
    xref += b"".join(b"%010d 00000 n \n" % off for off in offsets)
    trailer = b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(offsets) + 1, len(head))
    return head + xref + trailer


def _tally(out: list[PageImage | PageRow]) -> tuple[Counter[str], Counter[str]]:
    """What the pipeline's tally sees: a render-only run turns every PageImage into a `rendered` row."""
    statuses: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for page in out:
        if isinstance(page, PageImage):
            statuses["rendered"] += 1
        else:
            statuses[page.status] += 1
            if page.reason_code:
                reasons[page.reason_code] += 1
    return statuses, reasons


# --- PDFs ----------------------------------------------------------------------------------------

def test_three_page_pdf_yields_three_pages_in_order_with_text() -> None:
    data = docmaker.multipage_pdf(3, title="Harbour survey")
    out = render_document(_record(data, "pdf", 3), data, SETTINGS)
    assert isinstance(out, Iterator)  # one page at a time, not a list of a document's pages
    pages = _images(list(out))
    assert [p.page_index for p in pages] == [0, 1, 2]
    doc_sha = hashlib.sha256(data).hexdigest()
    for i, page in enumerate(pages):
        assert page.doc_sha256 == doc_sha
        assert page.source_uri == "/data/doc"
        assert f"Harbour survey, section {i + 1}" in page.text_layer
        assert f"This is page {i + 1} of the body" in page.text_layer
        img = _decode(page)
        assert (img.width, img.height) == (page.width, page.height)
        assert img.mode == "RGB"
        assert len(page.page_hash) == 64
    # Different text, different pixels, different hashes.
    assert len({p.page_hash for p in pages}) == 3


def test_pdf_pages_are_capped_at_max_side() -> None:
    data = docmaker.invoice_pdf()
    # 150 dpi would give 1240 x 1754 px for A4; the cap wins.
    page = _images(_render(data, "pdf", 1))[0]
    assert max(page.width, page.height) == SETTINGS.max_side
    assert page.height > page.width  # A4 portrait stays portrait
    assert page.width == pytest.approx(SETTINGS.max_side * docmaker.A4[0] / docmaker.A4[1], abs=2)
    small = RenderSettings(**{**SETTINGS.__dict__, "max_side": 300})
    page = _images(_render(data, "pdf", 1, small))[0]
    assert max(page.width, page.height) == 300
    assert max(_decode(page).size) == 300


def test_low_dpi_is_not_upscaled_to_max_side() -> None:
    low = RenderSettings(**{**SETTINGS.__dict__, "dpi": 36.0})  # A4 at 36 dpi: 298 x 421 px
    page = _images(_render(docmaker.invoice_pdf(), "pdf", 1, low))[0]
    assert max(page.width, page.height) == pytest.approx(842 / 2, abs=2)


def test_text_layer_is_capped() -> None:
    capped = RenderSettings(**{**SETTINGS.__dict__, "max_text_chars": 10})
    page = _images(_render(docmaker.multipage_pdf(1), "pdf", 1, capped))[0]
    assert len(page.text_layer) == 10


def test_same_page_in_two_pdfs_has_the_same_page_hash() -> None:
    a = docmaker.multipage_pdf(2, terms_page=True, title="Report A")
    b = docmaker.multipage_pdf(4, terms_page=True, title="Report B")
    assert a != b
    pages_a = _images(_render(a, "pdf", 3, uri="/data/a.pdf"))
    pages_b = _images(_render(b, "pdf", 5, uri="/data/b.pdf"))
    assert pages_a[-1].page_hash == pages_b[-1].page_hash  # the terms page
    assert docmaker.TERMS_LINES[1] in pages_a[-1].text_layer
    assert pages_a[-1].doc_sha256 != pages_b[-1].doc_sha256
    body_a = {p.page_hash for p in pages_a[:-1]}
    body_b = {p.page_hash for p in pages_b[:-1]}
    assert not body_a & body_b


def test_page_hash_is_deterministic_across_runs() -> None:
    data = docmaker.multipage_pdf(2)
    first = [p.page_hash for p in _images(_render(data, "pdf", 2))]
    second = [p.page_hash for p in _images(_render(data, "pdf", 2))]
    assert first == second


def test_page_larger_than_max_page_points_fails_alone_and_the_document_is_partial() -> None:
    data = _with_page_size(docmaker.multipage_pdf(3), 1, (20_000, 842))
    out = _render(data, "pdf", 3)
    assert [p.page_index for p in out] == [0, 1, 2]
    assert isinstance(out[0], PageImage) and isinstance(out[2], PageImage)
    bad = out[1]
    assert isinstance(bad, PageRow)
    assert (bad.status, bad.reason_code, bad.route) == ("failed", "page_too_large", "failed")
    assert "20000" in (bad.message or "")
    assert bad.reason_code in REASON_CODES
    statuses, reasons = _tally(out)
    row = document_outcome(_record(data, "pdf", 3), statuses, reasons)
    assert (row.outcome, row.reason_code) == ("partial", "page_too_large")
    assert row.message and "1 failed" in row.message


def test_page_at_max_page_points_renders() -> None:
    data = _with_page_size(docmaker.multipage_pdf(1), 0, (14_400, 842))
    page = _images(_render(data, "pdf", 1))[0]
    assert page.width == SETTINGS.max_side  # very wide, capped on its long side


def test_changed_bytes_fail_every_page() -> None:
    data = docmaker.multipage_pdf(3)
    doc = _record(data, "pdf", 3)
    changed = docmaker.multipage_pdf(3, title="Edited after intake")
    out = list(render_document(doc, changed, SETTINGS))
    assert len(out) == 3
    for i, row in enumerate(out):
        assert isinstance(row, PageRow)
        assert (row.page_index, row.status, row.reason_code) == (i, "failed", "changed_during_run")
        assert row.doc_sha256 == doc.doc_sha256
    statuses, reasons = _tally(out)
    result = document_outcome(doc, statuses, reasons)
    assert (result.outcome, result.reason_code) == ("failed", "changed_during_run")


def test_encrypted_pdf_that_slipped_past_intake_fails_its_pages() -> None:
    data = docmaker.encrypted_pdf()
    out = _render(data, "pdf", 1)
    assert len(out) == 1
    assert isinstance(out[0], PageRow) and out[0].reason_code == "encrypted"


# --- images --------------------------------------------------------------------------------------

def test_exif_rotation_is_applied() -> None:
    page = _images(_render(docmaker.exif_rotated_jpeg(), "jpeg", 1))[0]
    assert (page.width, page.height) == (48, 64)  # stored landscape 64 x 48, shown portrait
    img = _decode(page)
    # The red marker, top-left as stored, is top-right once rotated 90 degrees clockwise.
    r, g, b = img.getpixel((page.width - 5, 5))
    assert r > 150 and g < 80 and b < 80, (r, g, b)
    r, g, b = img.getpixel((5, 5))
    assert not (r > 150 and g < 80), (r, g, b)


def test_transparent_png_becomes_white_not_black() -> None:
    rgba = Image.new("RGBA", (40, 30), (0, 0, 0, 0))  # fully transparent *black*
    rgba.paste((0, 0, 0, 255), (15, 10, 25, 20))  # an opaque black square in the middle
    buf = io.BytesIO()
    rgba.save(buf, format="PNG")
    page = _images(_render(buf.getvalue(), "png", 1))[0]
    img = _decode(page)
    assert min(img.getpixel((2, 2))) >= 245
    assert max(img.getpixel((20, 15))) <= 10


@pytest.mark.parametrize("img", [
    Image.new("RGBA", (8, 8), (0, 0, 0, 0)),
    Image.new("LA", (8, 8), (0, 0)),
    Image.new("PA", (8, 8), (0, 0)),
])
def test_normalise_transparent_modes_flatten_onto_white(img: Image.Image) -> None:
    out = normalise(img, 100)
    assert out.mode == "RGB"
    assert out.getextrema() == ((255, 255), (255, 255), (255, 255))


def test_normalise_palette_with_transparency_flattens_onto_white() -> None:
    img = Image.new("P", (8, 8), 0)
    img.putpalette([0, 0, 0] + [255, 0, 0] * 255)
    img.info["transparency"] = 0
    out = normalise(img, 100)
    assert out.getpixel((3, 3)) == (255, 255, 255)


def test_normalise_modes_and_cap() -> None:
    assert normalise(Image.new("L", (10, 20), 128), 100).mode == "RGB"
    assert normalise(Image.new("CMYK", (10, 20)), 100).mode == "RGB"
    assert normalise(Image.new("I;16", (10, 20)), 100).mode == "RGB"
    big = normalise(Image.new("RGB", (2000, 1000), (1, 2, 3)), 500)
    assert big.size == (500, 250)
    assert normalise(Image.new("RGB", (1, 1)), 500).size == (1, 1)  # never upscaled
    thin = normalise(Image.new("RGB", (10_000, 1)), 500)
    assert thin.size == (500, 5)  # never zero pixels high; padded to a 100:1 ratio


def test_page_hash_covers_size_and_pixels() -> None:
    white = Image.new("RGB", (2, 3), (255, 255, 255))
    assert page_hash(white) == page_hash(Image.new("RGB", (2, 3), (255, 255, 255)))
    # Same bytes, different shape: a different page.
    assert page_hash(white) != page_hash(Image.new("RGB", (3, 2), (255, 255, 255)))
    assert page_hash(white) != page_hash(Image.new("RGB", (2, 3), (255, 255, 254)))


def test_same_picture_in_two_lossless_formats_has_the_same_page_hash() -> None:
    bmp = _images(_render(docmaker.bmp(), "bmp", 1))[0]
    tiff = _images(_render(docmaker.multipage_tiff(3), "tiff", 3))[0]
    assert bmp.page_hash == tiff.page_hash


def test_multipage_tiff_yields_every_frame() -> None:
    pages = _images(_render(docmaker.multipage_tiff(4), "tiff", 4))
    assert [p.page_index for p in pages] == [0, 1, 2, 3]
    assert len({p.page_hash for p in pages}) == 4  # each frame is rotated differently
    assert all(p.text_layer == "" for p in pages)


def test_animated_gif_is_one_page() -> None:
    pages = _images(_render(docmaker.animated_gif(3), "gif", 1))
    assert len(pages) == 1
    assert (pages[0].width, pages[0].height) == (64, 48)


@pytest.mark.parametrize(("make", "fmt"), [
    (docmaker.jpeg_cmyk, "jpeg"), (docmaker.webp, "webp"), (docmaker.bmp, "bmp"), (docmaker.tiny_png, "png"),
    (docmaker.scanned_png, "png"),
])
def test_images_render_to_rgb_jpeg(make: Callable[[], bytes], fmt: str) -> None:
    data = make()
    page = _images(_render(data, fmt, 1))[0]
    img = _decode(page)
    assert img.mode == "RGB"
    assert (img.width, img.height) == (page.width, page.height)
    with Image.open(io.BytesIO(data)) as original:
        assert (page.width, page.height) == original.size  # all smaller than max_side


def test_cmyk_jpeg_keeps_its_colours() -> None:
    img = _decode(_images(_render(docmaker.jpeg_cmyk(), "jpeg", 1))[0])
    r, g, b = img.getpixel((4, 4))  # the red marker, not its inverse
    assert r > 150 and g < 80 and b < 80, (r, g, b)


def test_large_image_is_capped() -> None:
    buf = io.BytesIO()
    Image.new("RGB", (3000, 1500), (10, 200, 10)).save(buf, format="PNG")
    page = _images(_render(buf.getvalue(), "png", 1))[0]
    assert (page.width, page.height) == (1288, 644)


def test_thin_strip_is_padded_to_a_ratio_vision_models_accept() -> None:
    from transforms.pages.render import normalise
    from transforms.pages.sizes import MAX_ASPECT

    strip = normalise(Image.new("RGB", (3000, 5), (0, 0, 0)), 1288)
    assert strip.width == 1288 and strip.width / strip.height <= MAX_ASPECT
    assert strip.getpixel((10, 0)) == (0, 0, 0) and strip.getpixel((10, strip.height - 1)) == (255, 255, 255)


# --- RenderPagesDoFn ------------------------------------------------------------------------------

def test_render_dofn_reads_the_object_and_splits_pages_from_failures(tmp_path) -> None:
    from apache_beam.pvalue import TaggedOutput

    from transforms.pages.render import FAILED_PAGES
    from transforms.pages.stage import RenderPagesDoFn

    fn = RenderPagesDoFn(SETTINGS)
    good = tmp_path / "three.pdf"
    good.write_bytes(docmaker.multipage_pdf(3))
    sha = hashlib.sha256(good.read_bytes()).hexdigest()
    out = list(fn.process(DocumentRecord(str(good), good.stat().st_size, sha, "pdf", 3)))
    assert [p.page_index for p in out if isinstance(p, PageImage)] == [0, 1, 2]
    assert all(p.source_uri == str(good) for p in out)
    wide = tmp_path / "wide.pdf"
    wide.write_bytes(docmaker.text_pdf([["A banner"]], page_size=(20000, 842)))
    sha = hashlib.sha256(wide.read_bytes()).hexdigest()
    (failed,) = list(fn.process(DocumentRecord(str(wide), wide.stat().st_size, sha, "pdf", 1)))
    assert isinstance(failed, TaggedOutput) and failed.tag == FAILED_PAGES
    assert (failed.value.status, failed.value.reason_code, failed.value.page_index) == ("failed", "page_too_large", 0)
    # The object vanished between intake and rendering: every page fails as unreadable, none is lost.
    gone = list(fn.process(DocumentRecord(str(tmp_path / "gone.pdf"), 10, "c" * 64, "pdf", 2)))
    assert [(o.tag, o.value.page_index, o.value.status, o.value.reason_code) for o in gone] == [
        (FAILED_PAGES, 0, "failed", "unreadable"), (FAILED_PAGES, 1, "failed", "unreadable")]
    assert all(o.value.doc_sha256 == "c" * 64 and o.value.source_uri.endswith("gone.pdf") for o in gone)


def test_a_document_that_cannot_be_opened_fails_every_page_with_the_error() -> None:
    data = docmaker.truncated_pdf()
    doc = DocumentRecord("s3://b/t.pdf", len(data), hashlib.sha256(data).hexdigest(), "pdf", 2)
    rows = list(render_document(doc, data, SETTINGS))
    assert [(r.page_index, r.status, r.reason_code, r.message) for r in rows] == [
        (i, "failed", "render_failed", "PdfiumError: Failed to load document (PDFium: Data format error).")
        for i in (0, 1)]
    assert all(isinstance(r, PageRow) and (r.source_uri, r.doc_sha256) == (doc.uri, doc.doc_sha256) for r in rows)
    changed = DocumentRecord("s3://b/t.pdf", len(data), "0" * 64, "pdf", 2)
    assert [(r.page_index, r.reason_code, r.message) for r in render_document(changed, data, SETTINGS)] == [
        (i, "changed_during_run", "the object's bytes changed after intake") for i in (0, 1)]
