"""Personal-data detectors for model output. Pure functions; each kind is checked, not just matched:
card numbers pass Luhn, IBANs pass ISO 13616 mod-97, national ids follow their issuing rules.

Kinds: `email`, `phone`, `card`, `iban`, `national_id` (US SSN, UK National Insurance number,
Spanish DNI and NIE with their check letter).
"""
from __future__ import annotations

import re

EMAIL = re.compile(r"\b[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63})*\.[A-Za-z]{2,24}\b")
# International (+CC ...), North-American (NXX) NXX-XXXX or national 0NN NNNN NNNN shapes; separators are
# required between groups so that plain amounts, dates and invoice numbers do not look like phones.
PHONE = re.compile(r"(?<![\w+])(?:\+\d{1,3}[\s.-]?(?:\(\d{1,4}\)[\s.-]?)?\d{1,4}(?:[\s.-]\d{2,4}){2,4}"
                   r"|\(\d{3}\)\s?\d{3}[\s.-]\d{4}|\d{3}[.-]\d{3}[.-]\d{4}|0\d{2,4}[\s-]\d{3,4}[\s-]\d{3,4})(?![\w])")
CARD = re.compile(r"(?<!\d)(?:\d[ -]?){12,18}\d(?!\d)")
IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?:[ ]?[A-Z0-9]{4}){2,7}(?:[ ]?[A-Z0-9]{1,4})?\b")
SSN = re.compile(r"(?<!\d)(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?!\d)")
NINO = re.compile(r"\b(?![DFIQUV])[A-CEGHJ-PR-TW-Z](?![DFIQUVO])[A-CEGHJ-NPR-TW-Z]\s?\d{2}\s?\d{2}\s?\d{2}\s?[A-D]\b")
DNI = re.compile(r"\b([XYZ]?)(\d{7,8})-?([A-Z])\b")
_DNI_LETTERS = "TRWAGMYFPDXBNJZSQVHLCKE"


def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def iban_ok(text: str) -> bool:
    compact = text.replace(" ", "").upper()
    if not 15 <= len(compact) <= 34:
        return False
    moved = compact[4:] + compact[:4]
    return int("".join(str(int(ch, 36)) for ch in moved)) % 97 == 1


def dni_ok(prefix: str, number: str, letter: str) -> bool:
    if len(number) != (7 if prefix else 8):
        return False
    value = int(str("XYZ".index(prefix)) + number) if prefix else int(number)
    return _DNI_LETTERS[value % 23] == letter


def find(text: str) -> dict[str, list[str]]:
    """Kind -> the values found in `text` (each checked as described above)."""
    found: dict[str, list[str]] = {}

    def add(kind: str, value: str) -> None:
        found.setdefault(kind, []).append(value)

    for m in EMAIL.finditer(text):
        add("email", m.group(0))
    for m in CARD.finditer(text):
        digits = re.sub(r"\D", "", m.group(0))
        if 13 <= len(digits) <= 19 and digits[0] in "23456" and luhn_ok(digits) and len(set(digits)) > 1:
            add("card", m.group(0))
    for m in IBAN.finditer(text.upper()):
        if iban_ok(m.group(0)):
            add("iban", m.group(0))
    for m in PHONE.finditer(text):
        digits = re.sub(r"\D", "", m.group(0))
        if 9 <= len(digits) <= 15 and m.group(0) not in "".join(found.get("card", [])):
            add("phone", m.group(0))
    for m in SSN.finditer(text):
        add("national_id", m.group(0))
    for m in NINO.finditer(text):
        add("national_id", m.group(0))
    for m in DNI.finditer(text):
        if dni_ok(*m.groups()):
            add("national_id", m.group(0))
    return found


def mask(value: str) -> str:
    """What a flag's detail shows of a found value: its shape, never the value itself."""
    return re.sub(r"[A-Za-z]", "a", re.sub(r"\d", "9", value))[:40]
