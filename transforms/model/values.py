"""The value normaliser: how an extracted value may be printed on a page, as the tokens the evidence matcher
(transforms/model/evidence.py) looks for. The one home of these rules.

- Text is compared as tokens: runs of letters, and runs of digits with the `.` and `,` inside them (NFKC,
  case-folded), so punctuation and spacing between tokens never matter (`Receipt #4711` = `receipt 4711`).
- A number (money, a quantity) is compared by value: a page token `1,717.44`, `1.717,44`, `£1717.44` (the
  symbol is not part of the token) or `1717.440` is 1717.44.
- A date `YYYY-MM-DD` may be printed in the usual day-first, month-first and ISO orders, with `/`, `.`, `-` or
  spaces, with or without leading zeros, with a two-digit year, or with the month's English name (`Dec 25,
  2018`, `25 December 2018`).
- A currency code may be printed as its symbol (`GBP`: `£`).
Pure.
"""
from __future__ import annotations

import datetime as dt
import re
import unicodedata
from decimal import Decimal, InvalidOperation

TOKEN = re.compile(r"\d(?:[\d.,]*\d)?|[^\W\d_]+")
ISO_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})")
_US = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?")  # 1,717.44
_EU = re.compile(r"\d{1,3}(?:\.\d{3})+(?:,\d+)?")  # 1.717,44
_PLAIN = re.compile(r"\d+(?:[.,]\d+)?")  # 1717.44, 1717,44, 1717
_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
           "november", "december")
CURRENCY_SYMBOLS = {"GBP": "£", "EUR": "€", "USD": "$", "JPY": "¥", "CNY": "¥", "INR": "₹", "KRW": "₩",
                    "RUB": "₽", "TRY": "₺", "ILS": "₪", "NGN": "₦", "PHP": "₱", "UAH": "₴", "VND": "₫"}


def fold(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


def tokens(text: str) -> list[str]:
    """The comparable tokens of a text (case-folded)."""
    return TOKEN.findall(fold(text))


def numbers(token: str) -> tuple[Decimal, ...]:
    """The values a numeric page token may stand for: `1,717` is 1717 (thousands) or 1.717 (a decimal comma)."""
    found: list[str] = []
    if _US.fullmatch(token):
        found.append(token.replace(",", ""))
    if _EU.fullmatch(token):
        found.append(token.replace(".", "").replace(",", "."))
    if _PLAIN.fullmatch(token):
        found.append(token.replace(",", "."))
    out = []
    for text in found:
        try:
            out.append(Decimal(text))
        except InvalidOperation:
            continue
    return tuple(dict.fromkeys(out))


def number_of(value: int | float) -> Decimal | None:
    """A JSON number as a Decimal (as JSON prints it: 8.55 is 8.55, not its binary neighbour)."""
    try:
        number = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    except (InvalidOperation, ValueError):
        return None
    return number if number.is_finite() else None


def date_forms(day: dt.date) -> list[str]:
    """How a date may be printed: the orders, separators, paddings and month names of everyday documents."""
    y, m, d = day.year, day.month, day.day
    years = (f"{y}", f"{y % 100:02d}")
    days = dict.fromkeys((f"{d:02d}", f"{d}"))
    months = dict.fromkeys((f"{m:02d}", f"{m}"))
    forms = [f"{y}-{m:02d}-{d:02d}", f"{y}/{m:02d}/{d:02d}", f"{y}.{m:02d}.{d:02d}", f"{y}{m:02d}{d:02d}"]
    for sep in ("/", ".", "-", " "):
        for dd in days:
            for mm in months:
                for yy in years:
                    forms += [f"{dd}{sep}{mm}{sep}{yy}", f"{mm}{sep}{dd}{sep}{yy}"]
    name = _MONTHS[m - 1]
    for month in dict.fromkeys((name, name[:3], name[:4])):  # `Sept`
        for dd in days:
            forms += [f"{dd} {month} {y}", f"{month} {dd} {y}", f"{dd}-{month}-{y}", f"{dd} {month} {y % 100:02d}"]
    return list(dict.fromkeys(forms))


def printed_forms(value: str) -> list[list[str]]:
    """The token sequences a text value may be printed as: itself, and for an ISO date its other spellings."""
    forms = [tokens(value)]
    match = ISO_DATE.fullmatch(value.strip())
    if match:
        try:
            day = dt.date(*(int(g) for g in match.groups()))
        except ValueError:
            return forms
        forms += [tokens(f) for f in date_forms(day)]
    unique: dict[tuple[str, ...], None] = dict.fromkeys(tuple(f) for f in forms if f)
    return [list(f) for f in unique]


def is_date(value: str) -> bool:
    return ISO_DATE.fullmatch(value.strip()) is not None
