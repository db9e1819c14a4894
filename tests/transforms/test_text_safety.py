"""transforms/text_safety.py: the one rule for untrusted text printed on a terminal."""
from __future__ import annotations

import sys
import unicodedata

import pytest

from transforms.text_safety import terminal_safe

# Each character the rule names, written by hand as its code point and the escape it must print as.
UNSAFE = [("\x1b", "\\x1b"), ("\r", "\\r"), ("\n", "\\n"), ("\t", "\\t"), ("\x07", "\\x07"), ("\x00", "\\x00"),
          ("\x7f", "\\x7f"), ("\x9b", "\\x9b"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029"),
          *[(chr(c), f"\\u{c:04x}") for c in range(0x202A, 0x202F)],
          *[(chr(c), f"\\u{c:04x}") for c in range(0x2066, 0x206A)],
          ("\u061c", "\\u061c"), *[(chr(c), f"\\u{c:04x}") for c in range(0x200B, 0x2010)], ("\ufeff", "\\ufeff")]


@pytest.mark.parametrize(("char", "shown"), UNSAFE)
def test_each_unsafe_character_is_shown_as_its_escape(char: str, shown: str) -> None:
    assert terminal_safe(f"a{char}b") == f"a{shown}b"


# Every format character (Cf) Python's Unicode database knows, and the whole tag block, enumerated from the
# database here; each escape is written from the code point (\xNN below 0x100, \uNNNN, \UNNNNNNNN).
FORMAT = [c for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf"]
TAGS = list(range(0xE0000, 0xE0080))


def escaped(c: int) -> str:
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" if c < 0x10000 else f"\\U{c:08x}"


def test_every_format_character_and_the_tag_block_are_shown_as_escapes() -> None:
    assert len(FORMAT) >= 160 and {0x2060, 0x00AD, 0x180E, 0xE0001} <= set(FORMAT)  # the database is there
    for c in sorted(set(FORMAT) | set(TAGS)):
        assert terminal_safe(f"a{chr(c)}b") == f"a{escaped(c)}b", f"U+{c:04X}"


def test_a_terminal_escape_sequence_is_inert_and_other_text_is_unchanged() -> None:
    assert terminal_safe("\x1b]0;pwned\x07\x1b[2J") == "\\x1b]0;pwned\\x07\\x1b[2J"
    plain = "Rechnung Nr. 7 — Summe 12,00 € (ü, 日本, العربية, emoji \U0001f600) \\x1b"
    assert terminal_safe(plain) == plain  # printable text of any script, and a literal backslash, pass as they are


@pytest.mark.parametrize(("given", "shown"), [
    ("http://u:pw@host:8000/v1", "http://u:***@host:8000/v1"),
    ("http://u:p@ss@host/v1", "http://u:***@host/v1"),  # an unescaped @ in the password: the last @ ends it
    ("https://TOKEN@host/v1", "https://***@host/v1"),
    ("http://host:8000/v1?next=a@b", "http://host:8000/v1?next=a@b"),  # an @ after the authority is not userinfo
    ("s3://bucket/key@1", "s3://bucket/key@1"),
    ("no url at all, a@b:c", "no url at all, a@b:c"),
    ("from http://a:1@h1/ to http://b:2@h2/", "from http://a:***@h1/ to http://b:***@h2/"),
])
def test_credentials_in_urls_are_hidden(given: str, shown: str) -> None:
    from transforms.text_safety import redact_url

    assert redact_url(given) == shown
