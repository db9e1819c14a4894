"""Documents whose true values and their places the test knows: born-digital invoices (PDF) and scanned receipts
(PNG), each with the extraction a perfect model would give, and, for each field path, the boxes (0-1 of the page,
origin top left) where the document prints that value.

A value's box is measured, not predicted: the value's piece of text is drawn alone on a blank page of the same
geometry, rendered the same way (pdfium for a PDF; the same font and rotation for a scan), and the box is the
bounding box of its ink. Nothing here asks pagemill where anything is.
"""
from __future__ import annotations

import functools
import io
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from tests.support import docmaker

Box = tuple[float, float, float, float]


@dataclass
class Piece:
    """One run of text drawn at (x, y); `paths`: the field paths whose value it prints (all or part of)."""

    x: float
    y: float
    text: str
    paths: tuple[str, ...] = ()
    size: float = 10
    bold: bool = False


@dataclass
class MadeDoc:
    name: str
    data: bytes
    answer: dict
    key: str  # text printed only on this document: the fake model finds its document by it in the prompt
    boxes: dict[str, list[Box]] = field(default_factory=dict)  # field path -> where its value is printed


def iou(a: Box, b: Box) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _ink_box(alone: np.ndarray) -> Box:
    ys, xs = np.nonzero(alone < 215)
    h, w = alone.shape
    return (xs.min() / w, ys.min() / h, (xs.max() + 1) / w, (ys.max() + 1) / h)


def _union(boxes: list[Box]) -> Box:
    return (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))


def _boxes(pieces: list[Piece], ink: Callable[[Piece], Box]) -> dict[str, list[Box]]:
    """Per field path, the union box of the pieces that print it (one box: a value printed once)."""
    by_path: dict[str, list[Box]] = {}
    for piece in pieces:
        if piece.paths:
            box = ink(piece)
            for path in piece.paths:
                by_path.setdefault(path, []).append(box)
    return {path: [_union(found)] for path, found in by_path.items()}


# --- born-digital invoices ----------------------------------------------------------------------------------------

def _pdf(pieces: list[Piece]) -> bytes:
    ops = [docmaker.text_op(p.x, docmaker.A4[1] - p.y, p.text, p.size, p.bold) for p in pieces]
    return docmaker.build_pdf([b"".join(ops)])


def _render_pdf(pieces: list[Piece]) -> np.ndarray:
    import pypdfium2

    pdf = pypdfium2.PdfDocument(_pdf(pieces))
    try:
        return np.asarray(pdf[0].render(scale=1.5).to_pil().convert("L"))
    finally:
        pdf.close()


def invoice(seed: int, made_up_total: bool = False) -> MadeDoc:
    """A one-page invoice; dates printed day-first and by month name, money with thousands separators and `£`."""
    rng = random.Random(seed)
    vendor = ["Northwind Traders Ltd", "Acme Office Supply GmbH", "Blue Heron Consulting"][seed % 3]
    number = f"INV-{7100 + seed}"
    day = 3 + seed % 20
    pieces = [Piece(56, 76, "INVOICE", (), 16, True), Piece(56, 110, vendor, ("vendor_name",), 12, True),
              Piece(360, 110, "Invoice no:"), Piece(430, 110, number, ("invoice_number",)),
              Piece(360, 126, "Date:"), Piece(430, 126, f"{day:02d}/03/2026", ("issue_date",)),
              Piece(360, 142, "Due:"), Piece(430, 142, f"Apr {day}, 2026", ("due_date",)),
              Piece(56, 180, "Currency:"), Piece(110, 180, "GBP", ("currency",)),
              Piece(56, 220, "Description", (), 10, True), Piece(330, 220, "Qty", (), 10, True),
              Piece(390, 220, "Unit price", (), 10, True), Piece(480, 220, "Amount", (), 10, True)]
    items, subtotal = [], Decimal("0.00")
    for i in range(3 + seed % 2):
        qty, price = rng.randint(1, 9), Decimal(rng.randint(15000, 190000)) / 100
        amount = qty * price
        subtotal += amount
        y, path = 240 + 20 * i, f"line_items[{i}]"
        description = ["Copy paper A4 500 sheets", "Toner cartridge black", "Desk lamp LED", "Consulting hours",
                       "Shipping and handling"][(seed + i) % 5]
        pieces += [Piece(56, y, description, (f"{path}.description",)), Piece(330, y, str(qty), (f"{path}.quantity",)),
                   Piece(390, y, f"{price:,.2f}", (f"{path}.unit_price",)),
                   Piece(480, y, f"{amount:,.2f}", (f"{path}.amount",))]
        items.append({"description": description, "quantity": qty, "unit_price": float(price), "amount": float(amount)})
    tax = (subtotal * Decimal("0.20")).quantize(Decimal("0.01"))
    y = 260 + 20 * len(items)
    for label, value, path in (("Subtotal", subtotal, "subtotal"), ("VAT 20%", tax, "tax"),
                               ("Total due", subtotal + tax, "total")):
        pieces += [Piece(360, y, label), Piece(470, y, f"£{value:,.2f}", (path,))]
        y += 20
    answer = {"vendor_name": vendor, "invoice_number": number, "issue_date": f"2026-03-{day:02d}",
              "due_date": f"2026-04-{day:02d}", "currency": "GBP", "subtotal": float(subtotal), "tax": float(tax),
              "total": float(subtotal + tax) if not made_up_total else 98765.43, "line_items": items}
    boxes = _boxes(pieces, lambda p: _ink_box(_render_pdf([p])))
    return MadeDoc(f"invoice-{seed}.pdf", _pdf(pieces), answer, number, boxes)


# --- scanned receipts ---------------------------------------------------------------------------------------------

RECEIPT_SIZE = (900, 1100)


@functools.cache
def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    return ImageFont.load_default(size=size)


def _draw(pieces: list[Piece]) -> Image.Image:
    page = Image.new("L", RECEIPT_SIZE, 255)
    draw = ImageDraw.Draw(page)
    for p in pieces:
        draw.text((p.x, p.y), p.text, fill=25, font=_font(round(p.size)))
    return page


def _angle(seed: int) -> float:
    return random.Random(seed).uniform(-0.6, 0.6)


def _turned_ink(piece: Piece, seed: int) -> Box:
    """Where a piece's ink lies once the page is turned as `_scan` turns it (PIL: counter-clockwise about the
    centre), from its ink pixels turned by the same angle (faster than turning a page per piece)."""
    ys, xs = np.nonzero(np.asarray(_draw([piece])) < 215)
    a = np.radians(_angle(seed))
    cx, cy = RECEIPT_SIZE[0] / 2, RECEIPT_SIZE[1] / 2
    dx, dy = xs + 0.5 - cx, ys + 0.5 - cy
    tx, ty = cx + dx * np.cos(a) + dy * np.sin(a), cy - dx * np.sin(a) + dy * np.cos(a)
    w, h = RECEIPT_SIZE
    return (float(tx.min() - 0.5) / w, float(ty.min() - 0.5) / h, float(tx.max() + 0.5) / w, float(ty.max() + 0.5) / h)


def _scan(pieces: list[Piece], seed: int) -> np.ndarray:
    """The pieces drawn in a TrueType font, turned a little, on a scanner's uneven paper with specks."""
    rng = random.Random(seed)
    rng.random()  # the angle's draw (_angle)
    page = _draw(pieces).rotate(_angle(seed), resample=Image.Resampling.BICUBIC, fillcolor=255)
    shade = np.linspace(228, 250, RECEIPT_SIZE[0])[None, :].repeat(RECEIPT_SIZE[1], 0)
    pixels = np.minimum(np.asarray(page, dtype=np.float64), shade)
    for _ in range(400):
        pixels[rng.randrange(RECEIPT_SIZE[1]), rng.randrange(RECEIPT_SIZE[0])] = rng.randrange(90, 170)
    return pixels.astype(np.uint8)


def receipt(seed: int) -> MadeDoc:
    """A till receipt, scanned: money with a decimal point, the date day-first with dots."""
    rng = random.Random(100 + seed)
    merchant = ["CORNER CAFE", "HARBOUR BAKERY", "MILL LANE DELI"][seed % 3]
    number = f"{4711 + seed}"
    day = 4 + seed % 20
    s = 30
    pieces = [Piece(80, 60, merchant, ("merchant",), 44), Piece(80, 130, "14 Mill Lane", ("address",), s),
              Piece(80, 170, "York YO1 7HH", ("address",), s), Piece(80, 230, "Receipt", (), s),
              Piece(240, 230, number, (), s), Piece(80, 280, f"{day:02d}.02.2026", ("date",), s),
              Piece(320, 280, "12:42", (), s)]
    names = ["Flat white", "Croissant", "Orange juice", "Bagel", "Green tea"]
    items, total = [], Decimal("0")
    for i in range(3):
        qty, price = rng.randint(1, 3), Decimal(rng.randint(120, 690)) / 100
        amount = qty * price
        total += amount
        y, path, name = 350 + 50 * i, f"items[{i}]", names[(seed + i) % 5]
        pieces += [Piece(80, y, str(qty), (f"{path}.quantity",), s), Piece(120, y, "x", (), s),
                   Piece(160, y, name, (f"{path}.description",), s),
                   Piece(620, y, f"{amount:.2f}", (f"{path}.amount",), s)]
        items.append({"description": name, "quantity": qty, "amount": float(amount)})
    y = 350 + 50 * len(items) + 40
    pieces += [Piece(80, y, "TOTAL", (), s), Piece(400, y, "EUR", ("currency",), s),
               Piece(620, y, f"{total:.2f}", ("total",), s), Piece(80, y + 80, "Thank you", (), s)]
    answer = {"merchant": merchant, "date": f"2026-02-{day:02d}", "address": "14 Mill Lane York YO1 7HH",
              "currency": "EUR", "total": float(total), "items": items}
    buf = io.BytesIO()
    Image.fromarray(_scan(pieces, seed)).save(buf, format="PNG")
    boxes = _boxes(pieces, lambda p: _turned_ink(p, seed))
    return MadeDoc(f"receipt-{seed}.png", buf.getvalue(), answer, number, boxes)
