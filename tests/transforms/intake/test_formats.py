"""sniff_format: the format is told by the magic bytes of the first KiB, never by the name."""
from __future__ import annotations

import io
from collections.abc import Callable

import pytest
from PIL import Image

from tests.support import docmaker
from transforms.intake.formats import sniff_format

# --- sniff_format --------------------------------------------------------------------------------

@pytest.mark.parametrize(("make", "expected"), [
    (docmaker.invoice_pdf, "pdf"),
    (docmaker.tiny_png, "png"),
    (docmaker.jpeg_cmyk, "jpeg"),
    (docmaker.exif_rotated_jpeg, "jpeg"),
    (docmaker.animated_gif, "gif"),
    (docmaker.bmp, "bmp"),
    (docmaker.multipage_tiff, "tiff"),
    (docmaker.webp, "webp"),
    (docmaker.huge_png_header, "png"),
    (docmaker.encrypted_pdf, "pdf"),
])
def test_sniff_real_files(make: Callable[[], bytes], expected: str) -> None:
    data = make()
    assert sniff_format(data[:1024]) == expected


def test_sniff_big_endian_tiff() -> None:
    buf = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buf, format="TIFF")
    little = buf.getvalue()
    assert little[:4] == b"II*\x00"
    assert sniff_format(b"MM\x00*" + little[4:]) == "tiff"


@pytest.mark.parametrize("head", [
    b"",
    b"hello world, this is plain text\n",
    docmaker.random_bytes(1024, seed=3),
    b"BM" + b"\x00" * 10,  # a BMP header needs at least 26 bytes
    b"GIF90a" + b"\x00" * 20,
    b"RIFF\x00\x00\x00\x00WAVEfmt ",  # RIFF, but not WebP
    b"\x00\x00\x00\x18ftypmp42",  # ISO media, but a video brand
])
def test_sniff_rejects_non_documents(head: bytes) -> None:
    assert sniff_format(head) is None


def test_sniff_pdf_after_junk_within_first_kib() -> None:
    pdf = docmaker.invoice_pdf()
    assert sniff_format((b"\x00junk" * 100 + pdf)[:1024]) == "pdf"
    assert sniff_format((b"x" * 1100 + pdf)[:1024]) is None


def test_sniff_heic_and_avif_brands() -> None:
    assert sniff_format(b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00") == "heic"
    assert sniff_format(b"\x00\x00\x00\x18ftypmif1\x00\x00\x00\x00") == "heic"
    assert sniff_format(b"\x00\x00\x00\x1cftypavif\x00\x00\x00\x00") == "avif"


def test_sniff_ignores_the_extension() -> None:
    # A text file named .png is not a PNG; a PDF named .jpg is a PDF. Only bytes count.
    assert sniff_format(b"not really a png\n") is None
    assert sniff_format(docmaker.invoice_pdf()[:1024]) == "pdf"
