"""The page words' compact encoding (schemas/evidence.py): what goes in comes out, to 1/65535 of the page."""
from __future__ import annotations

import pytest

from schemas.evidence import PageWords, decode_words, encode_words


def test_words_round_trip_within_a_65535th_of_the_page() -> None:
    words = PageWords("ocr", ("Total", "£1,717.44", "naïve", "a\x1fb"), ((0.1, 0.2, 0.3, 0.4), (0.0, 0.0, 1.0, 1.0),
                                                                       (0.5, 0.5, 0.51, 0.52), (0.9, 0.9, 0.95, 0.99)))
    data = encode_words(words)
    assert len(data) < 8 + 8 * 4 + 40  # a handful of bytes a word
    back = decode_words(data)
    assert back is not None and back.source == "ocr"
    assert back.texts == ("Total", "£1,717.44", "naïve", "a b")  # the separator cannot hide in a word
    for got, want in zip(back.boxes, words.boxes, strict=True):
        assert got == pytest.approx(want, abs=1 / 65535)


@pytest.mark.parametrize("data", [b"", b"PW1", b"XX1\x00\x01\x00\x00\x00" + b"\x00" * 8, b"PW1\x07\x01\x00\x00\x00",
                                  b"PW1\x00\x05\x00\x00\x00" + b"\x00" * 8])
def test_what_is_not_an_encoding_decodes_to_no_words(data: bytes) -> None:
    assert decode_words(data) is None


def test_no_words_encode_to_nothing() -> None:
    assert encode_words(PageWords("text_layer", (), ())) == b""


def test_a_text_layer_word_with_a_lone_surrogate_still_encodes() -> None:
    # pdfium hands back lone surrogates from broken ToUnicode maps (a corpus PDF did): the page must not fail.
    words = PageWords("text_layer", ("ok", "bad\udb62x"), ((0.0, 0.0, 0.5, 0.5), (0.5, 0.5, 1.0, 1.0)))
    decoded = decode_words(encode_words(words))
    assert decoded is not None and decoded.texts[0] == "ok" and decoded.texts[1].startswith("bad")
