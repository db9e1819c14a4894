"""Every frame of a multi-frame image is checked against --max-image-pixels before it is decoded
(issue 16, item 5): a small first frame must not carry a huge second one past intake or the renderer."""
from __future__ import annotations

import hashlib
import io

import pytest
from PIL import Image

from schemas.records import DocumentRecord, DocumentRow, ListedObject, PageImage, PageRow
from transforms.intake.inspection import IntakeLimits, inspect_document
from transforms.pages.render import RenderSettings, render_document

LIMIT = 1_000_000
LIMITS = IntakeLimits(max_bytes=50 * 2**20, max_pages=100, max_image_pixels=LIMIT)
SETTINGS = RenderSettings(dpi=100, max_side=1000, jpeg_quality=90, max_text_chars=5000, max_page_points=14400,
                          max_image_pixels=LIMIT, max_bytes=50 * 2**20)


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """A 10x10 frame, then a 12000x12000 one (144 MB decoded, a few hundred KB deflated)."""
    small = Image.new("L", (10, 10), 200)
    big = Image.new("L", (12000, 12000), 255)
    buf = io.BytesIO()
    small.save(buf, format="TIFF", save_all=True, append_images=[big], compression="tiff_deflate")
    del big
    return buf.getvalue()


def test_tiff_with_a_huge_second_frame_is_rejected_at_intake(bomb: bytes) -> None:
    assert len(bomb) < 2**20  # small on disk: only the declared frame size gives it away
    row = inspect_document(ListedObject(uri="/in/bomb.tiff", size=len(bomb)), bomb, LIMITS)
    assert isinstance(row, DocumentRow), row
    assert (row.outcome, row.reason_code) == ("rejected", "decompression_bomb")
    assert "frame 2" in (row.message or "") and "12000x12000" in (row.message or "")


def test_renderer_refuses_the_huge_frame_without_decoding_it(bomb: bytes) -> None:
    # Intake is the gate; the renderer checks again (the bytes are re-read there), page by page.
    doc = DocumentRecord(uri="/in/bomb.tiff", size=len(bomb), doc_sha256=hashlib.sha256(bomb).hexdigest(),
                         format="tiff", page_count=2)
    pages = list(render_document(doc, bomb, SETTINGS))
    assert isinstance(pages[0], PageImage) and (pages[0].width, pages[0].height) == (10, 10)
    assert isinstance(pages[1], PageRow)
    assert (pages[1].status, pages[1].reason_code) == ("failed", "decompression_bomb"), pages[1]


def test_frames_within_the_limit_pass(bomb: bytes) -> None:
    small = Image.new("L", (10, 10), 200)
    buf = io.BytesIO()
    small.save(buf, format="TIFF", save_all=True, append_images=[Image.new("L", (1000, 1000), 255)])
    data = buf.getvalue()
    rec = inspect_document(ListedObject(uri="/in/ok.tiff", size=len(data)), data, LIMITS)
    assert isinstance(rec, DocumentRecord) and rec.page_count == 2
