"""SROIE task 3 and CORD scoring (pipelines/bench/sroie.py, cord.py) on small fixtures made here in each dataset's
own layout: the oracle scores 100%, perturbed predictions score exactly the share derived here by hand."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.bench import cord, sroie
from tests.support.docmaker import tiny_png

KEYS = {  # SROIE key files as the dataset writes them: the texts as printed
    "X001": {"company": "BOOK TA .K (TAMAN DAYA) SDN BHD", "date": "25/12/2018", "address": "NO.53 JALAN TAMPOI",
             "total": "9.00"},
    "X002": {"company": "OJC MARKETING SDN BHD", "date": "15/01/2019", "address": "NO 2 & 4, JALAN BAYU 4",
             "total": "193.00"},
    "X003": {"company": "ADVANCO COMPANY", "date": "02/02/2018", "address": "", "total": "5.80"},  # no address
}


def sroie_folder(root: Path, split: bool) -> Path:
    images, keys = (root / "img", root / "entities") if split else (root, root)
    images.mkdir(parents=True, exist_ok=True)
    keys.mkdir(parents=True, exist_ok=True)
    for rid, fields in KEYS.items():
        (images / f"{rid}.jpg").write_bytes(tiny_png())
        (keys / f"{rid}.txt").write_text(json.dumps(fields, indent=1))
    return root


@pytest.mark.parametrize("split", [False, True], ids=["task3-release", "img-entities"])
def test_sroie_layouts_and_oracle(tmp_path: Path, split: bool) -> None:
    receipts = sroie.load(sroie_folder(tmp_path, split))
    assert [r.id for r in receipts] == sorted(KEYS)
    truth = {r.id: r.truth for r in receipts}
    result = sroie.score(truth, {rid: dict(f) for rid, f in KEYS.items()})
    assert result["overall"] == {"correct": 11, "submitted": 11, "truth": 11, "precision": 1.0, "recall": 1.0,
                                 "f1": 1.0}  # 4 + 4 + 3 non-empty fields


def test_sroie_perturbed_scores_the_expected_share() -> None:
    truth = {rid: dict(f) for rid, f in KEYS.items()}
    got = {rid: dict(f) for rid, f in KEYS.items()}
    got["X001"]["date"] = "2018-12-25"  # same day, other text: wrong under the metric
    got["X002"]["total"] = " 193.00 "  # surrounding spaces are stripped: right
    got["X003"]["address"] = "somewhere"  # a field the truth does not have: submitted, not correct
    del got["X002"]["company"]  # not submitted
    result = sroie.score(truth, got)
    # correct 11 - 1 (date) - 1 (company) = 9; submitted 11 - 1 + 1 = 11; truth 11.
    assert (result["overall"]["correct"], result["overall"]["submitted"], result["overall"]["truth"]) == (9, 11, 11)
    assert result["overall"]["f1"] == pytest.approx(9 / 11)
    assert result["fields"]["date"]["precision"] == pytest.approx(2 / 3)
    assert result["fields"]["address"]["precision"] == pytest.approx(2 / 3)  # 3 submitted, 2 right
    assert result["fields"]["address"]["recall"] == 1.0
    assert sroie.score(truth, {})["overall"]["f1"] == 0.0


def test_sroie_bad_folder(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no receipt image"):
        sroie.load(tmp_path)
    (tmp_path / "a.jpg").write_bytes(tiny_png())
    (tmp_path / "a.txt").write_text("72,25,326,25,326,64,72,64,TAN WOON YANN")  # a task 1/2 box file
    with pytest.raises(ValueError, match="not a JSON key file"):
        sroie.load(tmp_path)


GT = [  # CORD gt_parse trees (CORD v2's keys)
    {"menu": [{"nm": "ICE TEA", "cnt": "2", "price": "10,000"}, {"nm": "CAKE", "cnt": "1", "price": "5,000"}],
     "total": {"total_price": "15,000"}},
    {"menu": {"nm": "A", "cnt": "2"}},
]


def cord_folder(root: Path) -> Path:
    lines = []
    for i, gt in enumerate(GT):
        (root / f"receipt_{i}.png").write_bytes(tiny_png())
        lines.append(json.dumps({"file_name": f"receipt_{i}.png",
                                 "ground_truth": json.dumps({"gt_parse": gt, "meta": {"split": "test"}})}))
    (root / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    return root


def test_cord_oracle_and_perturbed(tmp_path: Path) -> None:
    receipts = cord.load(cord_folder(tmp_path))
    truth = {r.id: r.truth for r in receipts}
    perfect = cord.score(truth, {r.id: r.truth for r in receipts})
    assert (perfect["f1"], perfect["ted_accuracy"], perfect["correct_fields"]) == (1.0, 1.0, 9)
    # Receipt 1 loses its `cnt` (one leaf "2"). Its tree: root - menu - <subtree> - {cnt - "2", nm - "A"}; from an
    # empty root that is 6 units (4 nodes at 1, two 1-character leaves at 1); without cnt, 2 units away: 1 - 2/6.
    # Fields: 9 truth pairs, 8 predicted and right, 1 missed: F1 = 8 / (8 + 1/2).
    got = {"receipt_0.png": GT[0], "receipt_1.png": {"menu": {"nm": "A", "cnt": None}}}
    result = cord.score(truth, got)
    assert result["per_receipt"] == {"receipt_0.png": 1.0, "receipt_1.png": pytest.approx(1 - 2 / 6)}
    assert result["ted_accuracy"] == pytest.approx((1 + 2 / 3) / 2)
    assert result["f1"] == pytest.approx(8 / 8.5)
    # A wrong price (one character edited) of receipt 0: one pair wrong both ways; the leaf costs 1 edit.
    wrong = json.loads(json.dumps(GT[0]).replace("5,000", "6,000", 1))
    assert cord.field_counts(wrong, GT[0]) == (6, 2)
    assert cord.score(truth, {"receipt_0.png": wrong})["per_receipt"]["receipt_1.png"] == 0.0  # nothing extracted


def test_cord_bad_metadata(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no metadata\.jsonl"):
        cord.load(tmp_path)
    outside = {"file_name": "../x.png", "ground_truth": json.dumps({"gt_parse": {}})}
    (tmp_path / "metadata.jsonl").write_text(json.dumps(outside))
    with pytest.raises(ValueError, match="inside"):
        cord.load(tmp_path)
    (tmp_path / "metadata.jsonl").write_text("{\"file_name\": \"a.png\"}\n")
    with pytest.raises(ValueError, match="line 1"):
        cord.load(tmp_path)
