"""The size rules of transforms/pages/sizes.py against the real thing: pypdfium2's own bitmaps, PIL's resize and
the page stage's `normalise`. (The estimate's sizes against `render_document`, document by document and over
the corpus, are in tests/pipelines/estimate/test_estimate.py.)"""
from __future__ import annotations

import pypdfium2 as pdfium
import pytest
from PIL import Image

from tests.support import docmaker
from transforms.pages.render import normalise
from transforms.pages.sizes import (
    MAX_ASPECT,
    low_detail_size,
    normalised_size,
    page_too_large,
    pdf_render_scale,
    pdf_render_size,
    resize_for_detail,
)


@pytest.mark.parametrize("points", [(595, 842), (1001, 333), (612, 792), (200, 7000), (73, 71)])
@pytest.mark.parametrize(("dpi", "max_side"), [(150, 1288), (72, 800), (300, 333)])
def test_pdf_render_size_is_the_bitmap_pypdfium2_renders(points: tuple[int, int], dpi: float, max_side: int) -> None:
    pdf = pdfium.PdfDocument(docmaker.text_pdf([["Page"]], page_size=points))
    page = pdf[0]
    width, height = page.get_size()
    bitmap = page.render(scale=pdf_render_scale(width, height, dpi, max_side))
    assert (bitmap.width, bitmap.height) == pdf_render_size(width, height, dpi, max_side)
    bitmap.close()
    page.close()
    pdf.close()


@pytest.mark.parametrize("size", [(10, 20), (2000, 1000), (1289, 5), (5, 3000), (10_000, 1), (1288, 1288),
                                  (1, 1), (640, 7), (333, 334)])
@pytest.mark.parametrize("max_side", [1288, 500, 7])
def test_normalised_size_is_what_normalise_makes(size: tuple[int, int], max_side: int) -> None:
    out = normalise(Image.new("RGB", size, (1, 2, 3)), max_side)
    assert out.size == normalised_size(*size, max_side)
    assert max(out.size) <= max_side and max(out.size) <= min(out.size) * MAX_ASPECT  # padding: long side kept


@pytest.mark.parametrize("size", [(1288, 900), (450, 600), (641, 1), (3, 2000)])
@pytest.mark.parametrize("side", [640, 0, 1])
def test_low_detail_size_is_the_image_the_model_is_sent(size: tuple[int, int], side: int) -> None:
    image = Image.new("RGB", size)
    sent = resize_for_detail(image, side)
    assert sent.size == low_detail_size(*size, side)
    assert (sent is image) == (side <= 0 or max(size) <= side)  # never enlarged, never copied for nothing


def test_page_too_large() -> None:
    assert not page_too_large(14_400, 10, 14_400)
    assert page_too_large(14_401, 10, 14_400)
    assert page_too_large(100, 0, 14_400)
