"""A render child that hangs after one page: first_page_then_hang.
Moved from tests/transforms/document_work/test_pages_timed.py, which other test files imported."""
from __future__ import annotations

import time
from collections.abc import Iterator

from schemas.records import DocumentRecord, PageImage, PageRow
from transforms.pages.render import RenderSettings, render_document

SETTINGS = RenderSettings(dpi=72, max_side=640, jpeg_quality=80, max_text_chars=2000, max_page_points=14400,
                          max_image_pixels=89_478_485, max_bytes=50 * 2**20)


def first_page_then_hang(doc: DocumentRecord, data: bytes, s: RenderSettings) -> Iterator[PageImage | PageRow]:
    """Fault injection (runs in the child): one page, then a render that never ends."""
    yield next(iter(render_document(doc, data, s)))
    time.sleep(3600)
