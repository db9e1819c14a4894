"""The fast paths of the page stages give what the plain implementation gives, on the shared corpus.

The render stage hashes pdfium's RGB buffer instead of `tobytes()` of a BGR-swapped copy, the gate
decodes each JPEG once without a second RGB copy, PDQ resizes without Image.thumbnail's copy, and
hint text that is ASCII skips NFKC. Each is compared here with the straightforward version of the
same step (written out below as it was before), on the first pages of the corpus's PDFs: pixels,
page hash, JPEG bytes, text layer, evidence, PDQ hash, safety verdicts and hints must be equal.
"""
from __future__ import annotations

import hashlib
import io
import unicodedata
from itertools import islice

import numpy as np
import pdqhash
import pypdfium2 as pdfium
import pytest
from PIL import Image

from schemas.records import DocumentRecord, PageImage
from tests.support.corpus_pdfs import corpus_pdfs
from tests.support.pictures import hamming
from transforms.hints.choose import HintSettings, choose_hint
from transforms.intake.formats import load_pdf
from transforms.model import prompt
from transforms.pages.render import RenderSettings, encode_page, normalise, render_document
from transforms.pages.textlayer import PICTURE_MIN_COVERAGE, pdf_text_evidence
from transforms.safety import injection
from transforms.safety.blocklist import PDQ_MIN_QUALITY, PDQ_SIDE, thumbnail_size, usable_pdq
from transforms.safety.gate import SafetyConfig, load_checks, screen_page

# The pipeline's defaults (pipelines/config/options.py).
SETTINGS = RenderSettings(dpi=150.0, max_side=1288, jpeg_quality=90, max_text_chars=20_000,
                          max_page_points=14_400.0, max_image_pixels=89_478_485, max_bytes=50 * 2**20)


def plain_render(data: bytes, index: int) -> tuple[str, bytes, str, float, tuple[str, ...]]:
    """(page hash, JPEG, text, coverage, invisible) the plain way: BGR bitmap, PIL copy, tobytes()."""
    pdf = load_pdf(data)
    page = pdf[index]
    width, height = page.get_size()
    bitmap = page.render(scale=min(SETTINGS.dpi / 72.0, SETTINGS.max_side / max(width, height)), may_draw_forms=True)
    img = bitmap.to_pil()
    textpage = page.get_textpage()
    text = textpage.get_text_bounded()
    evidence = pdf_text_evidence(page, textpage, img)
    img = normalise(img, SETTINGS.max_side)
    digest = hashlib.sha256(f"{img.width}x{img.height}:".encode())
    digest.update(img.tobytes())
    return digest.hexdigest(), encode_page(img, SETTINGS.jpeg_quality), text, evidence.coverage, evidence.invisible


def plain_pdq(img: Image.Image) -> str | None:
    small = img.convert("RGB")
    if max(small.size) > PDQ_SIDE:
        small = small.copy()
        small.thumbnail((PDQ_SIDE, PDQ_SIDE), Image.Resampling.BILINEAR)
    bits, quality = pdqhash.compute(np.ascontiguousarray(np.asarray(small)))
    return f"{int(''.join(str(int(b)) for b in bits), 2):064x}" if quality >= PDQ_MIN_QUALITY else None


PDQ_ROUNDING_BITS = 8


def plain_normalise(text: str) -> str:
    text = unicodedata.normalize("NFKC", text)
    return "".join(ch for ch in text if unicodedata.category(ch) != "Cf")


@pytest.fixture(scope="module")
def corpus_pages() -> list[tuple[bytes, PageImage]]:
    out = []
    for path, data in corpus_pdfs():
        try:
            count = len(pdfium.PdfDocument(data))
        except pdfium.PdfiumError:  # encrypted or broken: intake rejects these before rendering
            continue
        doc = DocumentRecord(uri=path, size=len(data), doc_sha256=hashlib.sha256(data).hexdigest(),
                             format="pdf", page_count=count)
        out += [(data, p) for p in islice(render_document(doc, data, SETTINGS), 1) if isinstance(p, PageImage)]
    assert len(out) > 40, len(out)
    return out


def test_rendered_pages_equal_the_plain_render(corpus_pages: list[tuple[bytes, PageImage]]) -> None:
    for data, page in corpus_pages:
        digest, jpeg, text, cover, invisible = plain_render(data, page.page_index)
        assert page.page_hash == digest, page.source_uri
        assert page.image == jpeg, page.source_uri
        assert (page.text_layer, page.text_coverage, page.invisible_text) == (text[:20_000], cover, invisible)


def test_gate_and_hints_equal_the_plain_steps(corpus_pages: list[tuple[bytes, PageImage]]) -> None:
    checks = load_checks(SafetyConfig(nsfw_classifier="nudenet", nsfw_threshold=0.05))
    classified = 0
    distances = []
    for _, page in corpus_pages:
        decoded = Image.open(io.BytesIO(page.image)).convert("RGB")
        checked, verdict = screen_page(page, checks, low_side=0)
        # The gate hashes the JPEG's own luma channel, the plain step the RGB decode: PDQ hashes luminance,
        # so the two differ only by rounding, a few bits, far inside the match radius (--pdq-threshold 31).
        # A list made from either still matches the page.
        plain = plain_pdq(decoded)
        assert (checked.pdq_hash is None) == (plain is None), page.source_uri
        if plain is not None:
            distances.append(hamming(checked.pdq_hash or "", plain))
            assert distances[-1] <= PDQ_ROUNDING_BITS, (page.source_uri, distances[-1])
        if page.has_raster or page.text_coverage < PICTURE_MIN_COVERAGE:
            classified += 1
            score, _ = checks.others[0].classifier.score(decoded)  # type: ignore[attr-defined]
            assert (verdict is not None) == (score >= 0.05), page.source_uri
        for text in (page.text_layer, *page.invisible_text):
            assert injection.normalise(text) == plain_normalise(text)
        hints = HintSettings(allow_ocr=False)
        choice = choose_hint(checked, hints)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(injection, "normalise", plain_normalise)
            patch.setattr(prompt, "normalise", plain_normalise)
            assert choose_hint(checked, hints) == choice, page.source_uri
    assert 0 < classified < len(corpus_pages)
    assert distances and sorted(distances)[len(distances) // 2] == 0, distances  # most pages: the same hash


@pytest.mark.parametrize("size", [(911, 1288), (1288, 911), (513, 512), (512, 513), (4000, 3), (3, 4000),
                                  (1000, 1000), (512, 512), (300, 200), (2577, 1001)])
def test_pdq_resize_is_thumbnails(size: tuple[int, int]) -> None:
    img = Image.new("RGB", size)
    expected = img.copy()
    expected.thumbnail((PDQ_SIDE, PDQ_SIDE), Image.Resampling.BILINEAR)
    assert thumbnail_size(size, PDQ_SIDE) == expected.size


def test_pdq_of_a_photo_equals_the_plain_hash() -> None:
    rng = np.random.default_rng(3)
    img = Image.fromarray(rng.integers(0, 255, (700, 1100, 3), dtype=np.uint8)).filter(
        __import__("PIL.ImageFilter", fromlist=["GaussianBlur"]).GaussianBlur(4))
    assert usable_pdq(img) == plain_pdq(img) is not None


def test_non_ascii_text_is_still_normalised() -> None:
    for text in ("ｉｇｎｏｒｅ previous", "zero\u200bwidth", "plain ascii", "ﬁnance", "\u202eevil"):
        assert injection.normalise(text) == plain_normalise(text)
