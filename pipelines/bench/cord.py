"""CORD v2 (receipts, CC-BY-4.0) in Donut's dataset layout, and Donut's metrics: field F1 and nTED accuracy.

Layout (clovaai/donut's README; what `naver-clova-ix/cord-v2` is converted to): `DIR/metadata.jsonl`, one line a
receipt, `{"file_name": "<image>", "ground_truth": "<JSON text with gt_parse>"}`, the images beside it.

Metrics, written from the definition in clovaai/donut `donut/util.py` JSONParseEvaluator (the published CORD
numbers come from it): both trees are normalised (keys ordered by length then name, empty values dropped, leaves
as stripped strings, a lone value as a one-item list); field F1 counts (key path, leaf) pairs over all receipts
(a predicted pair is a true positive when an equal truth pair is left to consume); nTED accuracy per receipt is
max(0, 1 - TED(pred, truth) / TED(empty, truth)) with Zhang-Shasha tree edit distance (zss), leaves costing their
length and an edited leaf its Levenshtein distance, averaged over receipts.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LEAF = "<leaf>"


@dataclass(frozen=True)
class Receipt:
    id: str  # the image's file name
    image: Path
    truth: Mapping[str, Any]  # gt_parse


def load(root: str | Path) -> list[Receipt]:
    """The receipts of `root/metadata.jsonl`; raises ValueError naming the line of a bad one."""
    root = Path(root)
    meta = root / "metadata.jsonl"
    if not meta.is_file():
        raise ValueError(f"{root}: no metadata.jsonl (expected Donut's layout: metadata.jsonl and the images)")
    receipts = []
    for n, line in enumerate(meta.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            truth = json.loads(row["ground_truth"])["gt_parse"]
            name = row["file_name"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"metadata.jsonl line {n}: needs file_name and ground_truth with gt_parse ({err})") \
                from None
        if not isinstance(name, str) or Path(name).is_absolute() or ".." in Path(name).parts:
            raise ValueError(f"metadata.jsonl line {n}: file_name must be a path inside {root}")
        receipts.append(Receipt(name, root / name, truth if isinstance(truth, dict) else {}))
    if not receipts:
        raise ValueError(f"{meta}: no receipts")
    return receipts


def normalize(data: Any) -> Any:
    """Donut's normalize_dict."""
    if not data:
        return {}
    if isinstance(data, dict):
        out = {}
        for key in sorted(data, key=lambda k: (len(k), k)):
            value = normalize(data[key])
            if value:
                out[key] = value if isinstance(value, list) else [value]
        return out
    if isinstance(data, list):
        if all(isinstance(item, dict) for item in data):
            return [n for n in (normalize(item) for item in data) if n]
        return [str(item).strip() for item in data if type(item) in {str, int, float} and str(item).strip()]
    return [str(data).strip()]


def flatten(data: Any, key: str = "") -> list[tuple[str, Any]]:
    """(dotted key path, leaf) pairs; list items share their key."""
    if type(data) is dict:
        return [pair for k, v in data.items() for pair in flatten(v, f"{key}.{k}" if key else k)]
    if type(data) is list:
        return [pair for item in data for pair in flatten(item, key)]
    return [(key, data)]


def field_counts(pred: Any, truth: Any) -> tuple[int, int]:
    """(true positives, false negatives + false positives) of one receipt."""
    answer = flatten(normalize(truth))
    tp = misses = 0
    for pair in flatten(normalize(pred)):
        if pair in answer:
            tp += 1
            answer.remove(pair)
        else:
            misses += 1
    return tp, misses + len(answer)


def field_f1(preds: Sequence[Any], truths: Sequence[Any]) -> float:
    tp = misses = 0
    for p, t in zip(preds, truths, strict=True):
        a, b = field_counts(p, t)
        tp, misses = tp + a, misses + b
    return tp / (tp + misses / 2) if tp + misses else 0.0


def _tree(data: Any, name: str = "<root>") -> Any:
    from zss import Node

    node = Node(name)
    if isinstance(data, dict):
        for key, value in data.items():
            node.addkid(_tree(value, key))
    elif isinstance(data, list):
        if all(isinstance(item, dict) for item in data):
            for item in data:
                node.addkid(_tree(item, "<subtree>"))
        else:
            for item in data:
                node.addkid(Node(f"{LEAF}{item}"))
    return node


def _insert_remove(node: Any) -> int:
    return len(node.label.replace(LEAF, "")) if LEAF in node.label else 1


def _update(a: Any, b: Any) -> int:
    from rapidfuzz.distance import Levenshtein

    la, lb = LEAF in a.label, LEAF in b.label
    if la and lb:
        return Levenshtein.distance(a.label.replace(LEAF, ""), b.label.replace(LEAF, ""))
    if la != lb:
        return 1 + len((a if la else b).label.replace(LEAF, ""))
    return int(a.label != b.label)


def _ted(a: Any, b: Any) -> float:
    import zss

    return zss.distance(a, b, get_children=zss.Node.get_children, insert_cost=_insert_remove,
                        remove_cost=_insert_remove, update_cost=_update, return_operations=False)


def ted_accuracy(pred: Any, truth: Any) -> float:
    """Donut's nTED-based accuracy of one receipt."""
    answer = _tree(normalize(truth))
    whole = _ted(_tree(normalize({})), answer)
    if not whole:  # an empty truth: the reference divides by zero here; only an empty prediction matches it
        return 1.0 if not normalize(pred) else 0.0
    return max(0.0, 1 - _ted(_tree(normalize(pred)), answer) / whole)


def score(truth: Mapping[str, Any], predictions: Mapping[str, Any]) -> dict[str, Any]:
    """F1 and nTED accuracy of `predictions` (receipt id -> extraction dict, None: nothing extracted)."""
    ids = list(truth)
    preds = [predictions.get(i) or {} for i in ids]
    truths = [truth[i] for i in ids]
    accuracies = {i: ted_accuracy(p, t) for i, p, t in zip(ids, preds, truths, strict=True)}
    counts = [field_counts(p, t) for p, t in zip(preds, truths, strict=True)]
    f1 = field_f1(preds, truths)
    return {"benchmark": "cord", "score": f1, "f1": f1,
            "ted_accuracy": sum(accuracies.values()) / len(ids) if ids else 0.0, "receipts": len(ids),
            "correct_fields": sum(c[0] for c in counts), "per_receipt": accuracies}


def render(result: Mapping[str, Any]) -> list[str]:
    return [f"  CORD nTED accuracy {100 * result['ted_accuracy']:.1f}% (the metric Donut publishes), field F1 "
            f"{100 * result['f1']:.1f}% over {result['receipts']} receipts ({result['correct_fields']} fields right)"]
