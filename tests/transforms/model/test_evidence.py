"""The evidence matcher (transforms/model/evidence.py) on words whose boxes the test lays out itself."""
from __future__ import annotations

import json

import pytest

from schemas.evidence import PageWords, encode_words
from schemas.records import PageRow
from transforms.model.evidence import FLAG, leaves, match, with_evidence

LINE_H = 0.02


def page(lines: list[str], source: str = "text_layer") -> PageWords:
    """One word after another, 0.1 wide each, one line every 0.05 of the page."""
    texts, boxes = [], []
    for row, line in enumerate(lines):
        for col, word in enumerate(line.split()):
            texts.append(word)
            boxes.append((0.1 * col, 0.05 * row, 0.1 * col + 0.08, 0.05 * row + LINE_H))
    return PageWords(source, tuple(texts), tuple(boxes))


def by_path(rows) -> dict:
    return {r.field_path: r for r in rows}


def test_leaves_are_the_non_empty_values_with_their_paths() -> None:
    answer = {"total": 12.5, "vendor": " ", "due": None, "paid": True, "items": [{"amount": 0}, {}],
              "note": "x", "tags": []}
    assert list(leaves(answer)) == [("total", 12.5), ("items[0].amount", 0), ("note", "x")]


def test_values_are_found_in_their_printed_forms_with_their_words_box() -> None:
    words = page(["INVOICE", "Date: 25/12/2018", "Total due: £1,717.44", "Vendor: Contoso Print & Co"])
    rows = by_path(match({"date": "2018-12-25", "total": 1717.44, "vendor": "Contoso Print & Co"}, words))
    assert rows["date"].quote == "25/12/2018" and rows["date"].box == pytest.approx((0.1, 0.05, 0.18, 0.05 + LINE_H))
    assert rows["total"].quote == "£1,717.44" and rows["total"].box == pytest.approx((0.2, 0.1, 0.28, 0.1 + LINE_H))
    assert rows["vendor"].quote == "Contoso Print & Co"
    assert rows["vendor"].box == pytest.approx((0.1, 0.15, 0.48, 0.15 + LINE_H))
    assert all(r.grounded and r.score == 1.0 and r.method == "text_layer" for r in rows.values())


def test_a_value_over_two_lines_gets_the_union_box() -> None:
    rows = by_path(match({"address": "12 Harbour Street, Bristol BS1 4XY"},
                         page(["Acme", "12 Harbour Street,", "Bristol BS1 4XY", "Tel 0117"])))
    assert rows["address"].grounded and rows["address"].quote == "12 Harbour Street, Bristol BS1 4XY"
    assert rows["address"].box == pytest.approx((0.0, 0.05, 0.28, 0.1 + LINE_H))


def test_a_repeated_value_takes_the_place_on_its_own_items_row() -> None:
    words = page(["Qty Item Amount", "1 Pen 2.00", "2 Paper 9.00", "1 Lamp 40.00", "Total 51.00 1"])
    rows = by_path(match({"items": [{"q": 1, "d": "Pen", "a": 2.0}, {"q": 2, "d": "Paper", "a": 9.0},
                                    {"q": 1, "d": "Lamp", "a": 40.0}]}, words))
    assert rows["items[0].q"].box[1] == pytest.approx(0.05)  # the `1` of the Pen row
    assert rows["items[2].q"].box[1] == pytest.approx(0.15)  # the `1` of the Lamp row, not the Pen's
    assert rows["items[1].q"].box[1] == pytest.approx(0.10)


def test_a_value_two_fields_share_takes_two_places() -> None:
    """Quantity 1: the unit price and the amount are the same number, printed twice on the row."""
    rows = by_path(match({"items": [{"d": "Lamp", "q": 1, "price": 40.0, "amount": 40.0}]},
                         page(["Lamp 1 40.00 40.00"])))
    assert rows["items[0].price"].box[0] == pytest.approx(0.2) and rows["items[0].amount"].box[0] == pytest.approx(0.3)


def test_an_ocr_misread_is_a_near_match_with_its_score() -> None:
    rows = by_path(match({"item": "Croissant"}, page(["2 x Croissani 4.80"], "ocr")))
    assert rows["item"].grounded and 0.85 <= rows["item"].score < 1.0 and rows["item"].quote == "Croissani"
    assert rows["item"].method == "ocr"


def test_a_made_up_value_is_not_grounded_and_flags_its_page() -> None:
    words = page(["Total 8.55", "Card 4242"])
    answer = {"total": 9999.99, "card": "4242"}
    row = PageRow("d" * 64, "s3://b/r.png", 0, "ok", extraction=json.dumps(answer), flags=("pii",))
    out = with_evidence(row, encode_words(words))
    rows = by_path(out.evidence)
    assert rows["total"].grounded is False and rows["total"].box is None and rows["total"].quote is None
    assert rows["card"].grounded is True
    assert (out.evidence_values, out.ungrounded_values) == (2, 1)
    assert out.flags == ("pii", FLAG) and any("total" in n and "9999" not in n for n in out.flag_detail)
    assert with_evidence(out, encode_words(words)).flag_detail == out.flag_detail  # a reused row: the note once


def test_a_page_with_no_words_is_not_checked_and_not_flagged() -> None:
    row = PageRow("d" * 64, "u", 0, "ok", extraction=json.dumps({"total": 1.0}))
    out = with_evidence(row, b"")
    assert [(r.grounded, r.method) for r in out.evidence] == [(None, "none")]
    assert out.ungrounded_values is None and out.evidence_values == 1 and FLAG not in out.flags


@pytest.mark.parametrize("extraction", [None, "", "not json", "[1, 2]", "42"])
def test_no_json_object_no_evidence(extraction: str | None) -> None:
    row = PageRow("d" * 64, "u", 0, "invalid", extraction=extraction)
    assert with_evidence(row, encode_words(page(["1 2 42"]))) == row


def test_near_matches_are_bounded_per_page() -> None:
    """Each misread value costs a scan of the page: past MAX_NEAR a page, values must be found as printed."""
    from transforms.model.evidence import MAX_NEAR

    words = page([f"Croissani{i:02d}" for i in range(MAX_NEAR + 2)])
    rows = match({"items": [f"Croissant{i:02d}" for i in range(MAX_NEAR + 2)]}, words)
    assert [r.grounded for r in rows] == [True] * MAX_NEAR + [False, False]
