"""The extract stage's config and pages on the tiny model: config, pages_of.
Moved from tests/transforms/extract/test_extract.py, which other test files imported."""
from __future__ import annotations

import hashlib
import io
from dataclasses import replace

import pypdfium2 as pdfium
from PIL import Image

from schemas.extraction import load_schema
from schemas.records import DocumentRecord, PageImage, PageTask
from transforms.extract.stage import ExtractConfig, make_task
from transforms.model import budget
from transforms.pages.render import RenderSettings, render_document

SETTINGS = RenderSettings(dpi=100, max_side=1000, jpeg_quality=85, max_text_chars=5000, max_page_points=14400,
                          max_image_pixels=89_478_485, max_bytes=2**26)


def config(**changes: object) -> ExtractConfig:
    base = ExtractConfig(schema=load_schema("invoice"), tenant="t1", model="tiny", model_revision="test",
                         render_key="dpi=100", model_family="qwen2_vl", max_model_len=8192,
                         max_tokens=384, max_attempts=2,
                         gpu_hourly_usd=2.5, api_price="gpt-4o", prices=budget.load_prices())
    return replace(base, **changes)


def pages_of(data: bytes, uri: str) -> list[PageImage]:
    sha = hashlib.sha256(data).hexdigest()
    doc = DocumentRecord(uri=uri, size=len(data), doc_sha256=sha, format="pdf",
                         page_count=len(pdfium.PdfDocument(data)))
    return [p for p in render_document(doc, data, SETTINGS) if isinstance(p, PageImage)]


def tasks_for(pages: list[PageImage], engine_settings, cfg: ExtractConfig) -> list[PageTask]:
    return [make_task(p, cfg)[1] for p in pages]


def odd_page(width: int, height: int, uri: str) -> PageImage:
    img = Image.new("RGB", (width, height), (200, 200, 200))
    buf = io.BytesIO()
    img.save(buf, format="JPEG")
    return PageImage(doc_sha256="x" * 64, source_uri=uri, page_index=0, page_hash=uri, image=buf.getvalue(),
                     width=width, height=height)
