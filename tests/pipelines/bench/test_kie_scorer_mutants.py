"""SROIE task 3 and CORD scoring (pipelines/bench/sroie.py, cord.py) where a planted bug went unseen (issue 43).

CORD: Donut's JSONParseEvaluator orders a dict's keys by length, then name, before the tree-edit distance, and
the distance is of *ordered* trees: a prediction whose keys are right but in another order than the truth's is
scored as Donut scores it only with that order. Worked by hand below.

SROIE task 3, as the competition defines it (ICDAR 2019 SROIE, task 3 "key information extraction"): a
submitted field is correct when its category and its text equal the truth's; precision = correct / submitted,
recall = correct / truth, F1 their harmonic mean. Texts are compared after stripping surrounding whitespace and
nothing else (not case, not inner spaces)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.bench import cord, sroie
from tests.support.docmaker import tiny_png


def test_cord_keys_are_ordered_by_length_then_name_before_the_tree_distance() -> None:
    """Truth {cnt: AB, price: 2}; prediction {nm: AB, cnt: 2}. Ordered by length then name, the truth's root has
    children [cnt, price], the prediction's [nm, cnt]. Cheapest edit: relabel nm -> cnt and cnt -> price (1 each),
    the leaves AB and 2 then match: TED 2. From an empty root: insert cnt (1), leaf AB (its length, 2), price (1),
    leaf 2 (1): 5. nTED accuracy 1 - 2/5 = 0.6. (Ordered by name alone, [cnt, nm] against [cnt, price]: no
    relabel pairing is left in order, and the accuracy drops to 0.)"""
    pred, truth = {"nm": "AB", "cnt": "2"}, {"cnt": "AB", "price": "2"}
    assert list(cord.normalize(truth)) == ["cnt", "price"] and list(cord.normalize(pred)) == ["nm", "cnt"]
    assert cord.ted_accuracy(pred, truth) == pytest.approx(0.6)
    result = cord.score({"r.png": truth}, {"r.png": pred})
    assert result["per_receipt"] == {"r.png": pytest.approx(0.6)} and result["ted_accuracy"] == pytest.approx(0.6)
    assert (result["f1"], result["correct_fields"]) == (0.0, 0)  # no (key, leaf) pair is right


def test_cord_nested_keys_are_ordered_too() -> None:
    """The same receipt one level down (menu -> one item): the menu and <subtree> nodes match for free, so the
    distance is still 2, out of 5 + 2 (menu, <subtree>) from an empty root: 1 - 2/7."""
    pred, truth = {"menu": [{"nm": "AB", "cnt": "2"}]}, {"menu": [{"cnt": "AB", "price": "2"}]}
    assert cord.ted_accuracy(pred, truth) == pytest.approx(1 - 2 / 7)


TRUTH = {"X1": {"company": "BOOK TA .K SDN BHD", "date": "25/12/2018", "address": "NO.53  JALAN TAMPOI",
                "total": "9.00"},
         "X2": {"company": "OJC MARKETING", "date": "15/01/2019", "address": "", "total": "193.00"}}


def test_sroie_compares_case_and_inner_spaces_as_printed() -> None:
    got = {"X1": {**TRUTH["X1"], "company": "Book Ta .K Sdn Bhd", "address": "NO.53 JALAN TAMPOI"},
           "X2": dict(TRUTH["X2"])}
    result = sroie.score(TRUTH, got)
    # 7 truth fields (X2 has no address), 7 submitted; company and address of X1 wrong: 5 right.
    assert (result["overall"]["correct"], result["overall"]["submitted"], result["overall"]["truth"]) == (5, 7, 7)
    assert result["overall"]["f1"] == pytest.approx(5 / 7)
    assert result["fields"]["company"]["precision"] == pytest.approx(1 / 2)
    assert sorted((w["id"], w["field"]) for w in result["wrong"]) == [("X1", "address"), ("X1", "company")]
    assert {w["field"]: (w["truth"], w["got"]) for w in result["wrong"]}["company"] == \
        ("BOOK TA .K SDN BHD", "Book Ta .K Sdn Bhd")


def test_sroie_an_empty_or_missing_prediction_submits_nothing() -> None:
    """A receipt with no extraction (None) and one whose fields are empty or null: nothing submitted, so
    precision 0 (no submission: the RRC scripts' convention), recall 0, F1 0; every truth field is listed wrong."""
    result = sroie.score(TRUTH, {"X1": None, "X2": {"company": "", "date": None, "address": "  ", "total": None}})
    o = result["overall"]
    assert (o["correct"], o["submitted"], o["truth"], o["precision"], o["recall"], o["f1"]) == (0, 0, 7, 0.0, 0.0, 0.0)
    assert result["receipts"] == 2 and result["correct_fields"] == 0
    assert len(result["wrong"]) == 7  # X2's empty address is right by omission: not listed
    assert result["fields"]["address"] == {"correct": 0, "submitted": 0, "truth": 1, "precision": 0.0,
                                           "recall": 0.0, "f1": 0.0}


def test_sroie_a_prediction_for_an_unknown_receipt_is_not_scored() -> None:
    result = sroie.score(TRUTH, {"X1": TRUTH["X1"], "X2": TRUTH["X2"], "X9": TRUTH["X1"]})
    assert (result["receipts"], result["overall"]["submitted"], result["overall"]["f1"]) == (2, 7, 1.0)


def test_sroie_finds_an_upper_case_image_suffix(tmp_path: Path) -> None:
    (tmp_path / "X1.JPG").write_bytes(tiny_png())
    (tmp_path / "X1.txt").write_text(json.dumps(TRUTH["X1"]))
    (tmp_path / "X2.png").write_bytes(tiny_png())
    (tmp_path / "X2.txt").write_text(json.dumps({**TRUTH["X2"], "extra": "ignored"}))
    receipts = sroie.load(tmp_path)
    assert [(r.id, r.image.name) for r in receipts] == [("X1", "X1.JPG"), ("X2", "X2.png")]
    assert receipts[1].truth == TRUTH["X2"]


def test_sroie_render_prints_each_fields_precision_recall_and_f1() -> None:
    """X1's company and address wrong, X2's company not submitted: company 0 of 1 submitted right, 0 of 2 found
    (P 0%, R 0%); date 2 of 2 (100%); address 0 of 1 submitted right, 0 of 1 truth; total 2 of 2."""
    got = {"X1": {**TRUTH["X1"], "company": "BOOK", "address": "x"},
           "X2": {**TRUTH["X2"], "company": ""}}
    lines = sroie.render(sroie.score(TRUTH, got))
    assert any(line.split() == ["date", "P", "100.0%", "R", "100.0%", "F1", "100.0%"] for line in lines), lines
    assert any(line.split() == ["company", "P", "0.0%", "R", "0.0%", "F1", "0.0%"] for line in lines), lines
    half = sroie.render(sroie.score(TRUTH, {"X1": TRUTH["X1"]}))  # X2 not extracted: each field found once of 2
    assert any(line.split() == ["total", "P", "100.0%", "R", "50.0%", "F1", "66.7%"] for line in half), half
