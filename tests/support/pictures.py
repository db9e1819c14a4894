"""Photos and gradients as encoded pages, blocklists of them: photo, encode, write_list.
Moved from tests/transforms/safety/test_gate.py, which other test files imported."""
from __future__ import annotations

import hashlib
import io
import random
from pathlib import Path

from PIL import Image, ImageDraw, ImageFilter

from schemas.records import DocumentRecord, PageImage
from transforms.pages.render import RenderSettings, render_document

SETTINGS = RenderSettings(dpi=100, max_side=1000, jpeg_quality=90, max_text_chars=5000, max_page_points=14400,
                          max_image_pixels=89_478_485, max_bytes=2**26)


def hamming(a: str, b: str) -> int:
    """Bits that differ between two PDQ hashes (hex): worked out here, apart from the blocklist's matcher."""
    return (int(a, 16) ^ int(b, 16)).bit_count()


def photo(seed: int, size: tuple[int, int] = (640, 480)) -> Image.Image:
    """A photo-like picture: soft coloured blobs and shapes, different for every seed."""
    rng = random.Random(seed)
    img = Image.new("RGB", size, tuple(rng.randrange(256) for _ in range(3)))
    draw = ImageDraw.Draw(img)
    for _ in range(25):
        x, y = rng.randrange(size[0]), rng.randrange(size[1])
        r = rng.randrange(20, 160)
        box = (x - r, y - r, x + r, y + r)
        colour = tuple(rng.randrange(256) for _ in range(3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=colour)
    return img.filter(ImageFilter.GaussianBlur(3))


def encode(img: Image.Image, fmt: str = "PNG", **params: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **params)
    return buf.getvalue()


def page_of(data: bytes, fmt: str = "png", uri: str = "mem://page") -> PageImage:
    doc = DocumentRecord(uri=uri, size=len(data), doc_sha256=hashlib.sha256(data).hexdigest(), format=fmt,
                         page_count=1)
    (page,) = render_document(doc, data, SETTINGS)
    assert isinstance(page, PageImage)
    return page


def write_list(tmp_path: Path, text: str, name: str = "list.txt") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def gradient() -> Image.Image:
    """A soft radial gradient (no people anywhere): NudeNet still gives it a small, real score."""
    import numpy as np

    y, x = np.mgrid[0:200, 0:200]
    level = np.clip(239 * (1 - np.sqrt((x - 40) ** 2 + (y - 40) ** 2) / 180), 0, 255).astype("uint8")
    return Image.fromarray(level).convert("RGB")
