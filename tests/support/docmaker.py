"""Makes test documents as bytes: PDFs written by hand, images drawn with Pillow.

Everything is generated here, so tests and the bundled samples never depend on files from outside,
and the same seed always gives the same bytes (except `encrypted_pdf`, where pypdf adds a random /ID).
"""
from __future__ import annotations

import io
import random
import struct
import zlib
from decimal import Decimal
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

A4 = (595, 842)  # points
_LEADING = 16  # points between body lines at 11 pt


# --- PDF writing -------------------------------------------------------------------------------

def _pdf_str(text: str) -> bytes:
    """A PDF literal string. Helvetica with WinAnsiEncoding is close to cp1252; anything else becomes '?'."""
    raw = text.encode("cp1252", errors="replace")
    # Only these three bytes are special inside ( ); escaping them is enough for a balanced string.
    raw = raw.replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)")
    return b"(" + raw + b")"


def text_op(x: float, y: float, text: str, size: float = 11, bold: bool = False) -> bytes:
    """One line of text at (x, y) as PDF content operators, for the streams of build_pdf."""
    font = b"/F2" if bold else b"/F1"
    return b"BT %s %g Tf %g %g Td %s Tj ET\n" % (font, size, x, y, _pdf_str(text))


def _line(x1: float, y1: float, x2: float, y2: float, width: float = 0.75) -> bytes:
    return b"%g w %g %g m %g %g l S\n" % (width, x1, y1, x2, y2)


def _rect(x: float, y: float, w: float, h: float, width: float = 0.75) -> bytes:
    return b"%g w %g %g %g %g re S\n" % (width, x, y, w, h)


def build_pdf(streams: list[bytes], page_size: tuple[int, int] = A4,
              pages_count: int | None = None) -> bytes:
    """A complete PDF 1.4 file, one content stream per page, with byte-exact xref offsets.

    `pages_count` overrides /Count in the page tree, to make a file that lies about its page count.
    """
    n = len(streams)
    objs: list[bytes] = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [%s] /Count %d >>"
        % (b" ".join(b"%d 0 R" % (5 + 2 * i) for i in range(n)), n if pages_count is None else pages_count),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica-Bold /Encoding /WinAnsiEncoding >>",
    ]
    for i, stream in enumerate(streams):
        objs.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 %d %d]"
            b" /Resources << /Font << /F1 3 0 R /F2 4 0 R >> >> /Contents %d 0 R >>"
            % (page_size[0], page_size[1], 6 + 2 * i))
        objs.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream))
    # The binary comment on line 2 tells transfer tools the file is binary (PDF spec 7.5.2).
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for num, body in enumerate(objs, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (num, body)
    xref = len(out)
    # Each xref entry must be exactly 20 bytes, so lines end in the two bytes " \n" (PDF spec 7.5.4).
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % off for off in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return bytes(out)


def _frame(page_size: tuple[int, int]) -> bytes:
    """Ruled lines common to every text page: a margin box, a rule under the title, a footer rule."""
    w, h = page_size
    return _rect(40, 40, w - 80, h - 80) + _line(50, h - 84, w - 50, h - 84, 1.5) + _line(50, 70, w - 50, 70)


def text_pdf(pages: list[list[str]], *, page_size: tuple[int, int] = A4,
             white_text: str | None = None) -> bytes:
    """One page per list of lines; the first line of a page is its title (bold, 16 pt).

    `white_text` is drawn white-on-white near the bottom of page 1: invisible when rendered, but present
    in the text layer, as a prompt-injection attempt hidden in a document would be.
    """
    h = page_size[1]
    streams = []
    for index, lines in enumerate(pages):
        ops = [_frame(page_size)]
        for i, line in enumerate(lines):
            if i == 0:
                ops.append(text_op(56, h - 76, line, 16, bold=True))
            else:
                ops.append(text_op(56, h - 90 - i * _LEADING, line))
        if index == 0 and white_text is not None:
            # q/Q keeps the white fill from leaking into anything drawn later on the page.
            ops.append(b"q 1 1 1 rg " + text_op(56, 52, white_text, 8) + b"Q\n")
        streams.append(b"".join(ops))
    return build_pdf(streams, page_size)


_VENDORS = ["Northwind Traders Ltd", "Acme Office Supply GmbH", "Blue Heron Consulting (UK)",
            "Contoso Print & Co"]
_ITEMS = ["Copy paper A4, 500 sheets", "Toner cartridge black", "Desk lamp LED", "Stapler, heavy duty",
          "Consulting hours", "Shipping & handling", "Whiteboard markers (4)", "USB-C cable 2 m"]


def invoice_pdf(seed: int = 0) -> bytes:
    """A born-digital one-page invoice; seed 0 is invoice INV-2026-001 dated 2026-01-15."""
    rng = random.Random(seed)
    w, h = A4
    number, day = f"INV-2026-{seed + 1:03d}", 15 + seed % 10
    ops = [_frame(A4), text_op(56, h - 76, "INVOICE", 16, bold=True),
           text_op(56, h - 110, rng.choice(_VENDORS), 12, bold=True),
           text_op(56, h - 126, "12 Harbour Street, Bristol BS1 4XY"),
           text_op(56, h - 142, "VAT no. GB 123 4567 89"), text_op(360, h - 110, f"Invoice no: {number}"),
           text_op(360, h - 126, f"Invoice date: 2026-01-{day:02d}"),
           text_op(360, h - 142, f"Due date: 2026-02-{day:02d}"),
           text_op(56, h - 180, "Bill to: Pagemill Test Customer, 1 Main Road, Leeds LS1 1AA")]
    # The line-item table: a header row in a box, one ruled row per item, right-aligned-ish numbers.
    top, row = h - 220, 20
    cols = [(56, "Description"), (330, "Qty"), (390, "Unit price"), (480, "Amount")]
    ops += [_rect(50, top - 6, w - 100, row, 1)] + [text_op(x, top, label, 10, bold=True) for x, label in cols]
    subtotal = Decimal("0.00")
    items = rng.sample(_ITEMS, rng.randint(3, 5))
    for i, item in enumerate(items, start=1):
        qty, price = rng.randint(1, 12), Decimal(rng.randint(150, 9000)) / 100
        amount = qty * price
        subtotal += amount
        y = top - i * row
        ops += [text_op(56, y, item, 10), text_op(330, y, str(qty), 10), text_op(390, y, f"{price:.2f}", 10),
                text_op(480, y, f"{amount:.2f}", 10), _line(50, y - 6, w - 50, y - 6, 0.3)]
    tax = (subtotal * Decimal("0.20")).quantize(Decimal("0.01"))
    y = top - (len(items) + 2) * row
    for label, value in (("Subtotal", subtotal), ("VAT 20%", tax), ("Total due (GBP)", subtotal + tax)):
        ops += [text_op(360, y, label, 10, bold=label.startswith("Total")), text_op(480, y, f"{value:.2f}", 10)]
        y -= row
    ops += [_line(355, y + row - 6, w - 50, y + row - 6, 1),
            text_op(56, 52, "Payment: bank transfer within 30 days.", 9)]
    return build_pdf([b"".join(ops)])


TERMS_LINES = ["Terms and conditions", "1. Prices are in GBP and exclude VAT unless stated otherwise.",
               "2. Payment is due within 30 days of the invoice date.",
               "3. Goods remain our property until paid for in full.",
               "4. Complaints must be made in writing within 14 days of delivery."]


def multipage_pdf(n_pages: int, *, terms_page: bool = False, title: str = "Quarterly report") -> bytes:
    """`n_pages` pages with different text each, plus (if `terms_page`) one more page, identical in every
    document made here, so page-level dedup has something to find across documents."""
    pages = [[f"{title}, section {i + 1}", f"This is page {i + 1} of the body of '{title}'.",
              f"Revenue in region {chr(65 + i % 26)} grew by {3 + i * 7 % 11} per cent.",
              "Figures are unaudited (see notes) and rounded to the nearest thousand."]
             for i in range(n_pages)]
    if terms_page:
        pages.append(TERMS_LINES)
    return text_pdf(pages)


def truncated_pdf() -> bytes:
    """A valid PDF cut in half: the xref, trailer and part of the objects are gone."""
    data = multipage_pdf(3)
    return data[: len(data) // 2]


def billion_pages_pdf(count: int = 1_000_000_000) -> bytes:
    """A one-page PDF whose page tree claims /Count `count` (a page-count bomb for readers that trust it).

    PDFium (pypdfium2 5.x) trusts /Count only below 1,048,575 and otherwise counts the real kids, so it
    reports 1 page for the default; pass e.g. count=1_000_000 to get a file it reports as 1,000,000 pages.
    """
    return build_pdf([_frame(A4) + text_op(56, 766, "One real page", 16, bold=True)], pages_count=count)


def encrypted_pdf(password: str = "secret") -> bytes:
    """An invoice encrypted with a user password (RC4-128, which pypdf can do without extra packages)."""
    try:
        from pypdf import PdfReader, PdfWriter
    except ImportError as err:
        raise ImportError("encrypted_pdf needs pypdf (pip install pypdf), a test-only dependency") from err
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(invoice_pdf())))
    writer.encrypt(user_password=password, owner_password=password + "-owner", algorithm="RC4-128")
    buf = io.BytesIO()
    writer.write(buf)
    return buf.getvalue()


def random_bytes(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


# --- images ------------------------------------------------------------------------------------

def _encode(img: Image.Image, fmt: str, **params: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **params)
    return buf.getvalue()


def scanned_png(seed: int = 0) -> bytes:
    """A receipt that looks scanned: blocky upscaled text, slightly rotated, on uneven grey with specks.

    Greyscale with sparse noise keeps the PNG small (it is committed as a sample twice).
    """
    rng = random.Random(seed)
    lines = ["CORNER CAFE", "14 Mill Lane, York", f"Receipt #{4711 + seed}", "2026-01-15 12:42", "",
             "Flat white        3.20", "Croissant         2.40", "Orange juice      2.95", "",
             "TOTAL   GBP     8.55", "Card  **** 4242", "", "Thank you!"]
    small = Image.new("L", (150, 14 * len(lines) + 20), 255)
    draw = ImageDraw.Draw(small)
    font = ImageFont.load_default()  # always available, unlike any TrueType font on the host
    for i, line in enumerate(lines):
        draw.text((10, 10 + i * 14), line, fill=20, font=font)
    # Drawn small and scaled up without smoothing, so strokes have the blocky edges of a low-dpi scan.
    page = small.resize((small.width * 3, small.height * 3), Image.Resampling.NEAREST)
    page = page.rotate(rng.uniform(-2.5, 2.5), resample=Image.Resampling.BICUBIC, expand=True, fillcolor=255)
    # Paper shade: a soft left-to-right gradient, darker than white, as a flatbed scanner gives.
    shade = Image.linear_gradient("L").rotate(90).resize(page.size).point(lambda v: 200 + v // 16)
    page = Image.composite(page, shade, page.point(lambda v: 255 if v < 128 else 0))
    pixels = page.load()
    for _ in range(page.width * page.height // 200):  # 0.5% dark specks
        pixels[rng.randrange(page.width), rng.randrange(page.height)] = rng.randrange(60, 160)
    return _encode(page, "PNG", optimize=True)


def _picture(size: tuple[int, int] = (64, 48), mode: str = "RGB") -> Image.Image:
    """A small image with a marker in the top-left corner, so rotations are detectable."""
    img = Image.new("RGB", size, (240, 240, 230))
    draw = ImageDraw.Draw(img)
    draw.rectangle((0, 0, size[0] // 4, size[1] // 4), fill=(200, 20, 20))
    draw.line((0, size[1] - 1, size[0] - 1, 0), fill=(20, 20, 200), width=2)
    return img.convert(mode)


def jpeg_cmyk() -> bytes:
    return _encode(_picture(mode="CMYK"), "JPEG", quality=85)


def exif_rotated_jpeg() -> bytes:
    """A 64x48 JPEG with EXIF orientation 6: viewers show it rotated 90 degrees clockwise, 48x64."""
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation
    return _encode(_picture(), "JPEG", quality=90, exif=exif.tobytes())


def animated_gif(frames: int = 3) -> bytes:
    imgs = [_picture().rotate(90 * i) for i in range(frames)]
    return _encode(imgs[0], "GIF", save_all=True, append_images=imgs[1:], duration=100, loop=0)


def tiny_png() -> bytes:
    return _encode(Image.new("RGB", (1, 1), (255, 255, 255)), "PNG")


def multipage_tiff(n: int = 3) -> bytes:
    imgs = [_picture().rotate(90 * i) for i in range(n)]
    return _encode(imgs[0], "TIFF", save_all=True, append_images=imgs[1:], compression="tiff_deflate")


def webp() -> bytes:
    return _encode(_picture(), "WEBP", quality=80)


def bmp() -> bytes:
    return _encode(_picture(), "BMP")


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def huge_png_header(width: int = 20000, height: int = 20000) -> bytes:
    """A PNG that declares width x height 8-bit grey pixels but is a few hundred bytes on disk.

    The IDAT holds only 16 rows of compressed zeros: Pillow reads the size from IHDR on open and refuses
    the image (DecompressionBombError above 2x Image.MAX_IMAGE_PIXELS, a warning above 1x) before
    decoding anything. A full IDAT would be ~400 KB even compressed, which is not what a bomb looks like.
    """
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit greyscale, no interlace
    idat = zlib.compress(b"\x00" * (width + 1) * min(height, 16), 9)
    chunks = _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + chunks


def slow_pdf(n_pages: int, stream_bytes: int = 2_000_000, seed: int = 0) -> bytes:
    """A valid PDF whose pages all draw one shared content stream of `stream_bytes` of random line
    operators: tiny on disk per page, seconds of pdfium time per page (the issue's slow PDF)."""
    rng = random.Random(seed)
    ops: list[str] = ["0.1 w\n"]
    size = 0
    while size < stream_bytes:
        op = f"{rng.randint(0, 612)} {rng.randint(0, 792)} m {rng.randint(0, 612)} {rng.randint(0, 792)} l S\n"
        ops.append(op)
        size += len(op)
    content = "".join(ops).encode()
    kids = " ".join(f"{4 + i} 0 R" for i in range(n_pages))
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>",
            f"<< /Type /Pages /Kids [{kids}] /Count {n_pages} >>".encode(),
            b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream"]
    objs += [b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 3 0 R >>"] * n_pages
    out = bytearray(b"%PDF-1.7\n")
    offsets = []
    for i, body in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return bytes(out)


def pdf_folder(folder: Path, n: int, tag: str = "") -> dict[str, int]:
    """`n` distinct PDFs of 1 to 3 pages in a new folder (multi-page: a resumed wave must account for each
    document's pages); their pages by source URI. `tag` makes another folder's documents distinct from these."""
    folder.mkdir(parents=True)
    pages = {}
    for i in range(n):
        path = folder / f"d{i:03d}.pdf"
        path.write_bytes(multipage_pdf(1 + i % 3, title=f"Document {tag}{i}"))
        pages[str(path)] = 1 + i % 3
    return pages
