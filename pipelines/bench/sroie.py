"""SROIE task 3 (ICDAR 2019, key information extraction from scanned receipts) in its own layout, and its metric.

Layout: one receipt image `<id>.jpg` (or .png) and its key file `<id>.txt`, a JSON object with `company`, `date`,
`address`, `total` as printed on the receipt; the key files either beside the images (the task 3 release) or in
`entities/` beside an `img/` folder (the layout most mirrors use).

Metric, as the competition defines it (no copy of the ICDAR/RRC evaluation script could be fetched here, so this
is the published definition, not a port): every non-empty field of a receipt is one item; a submitted field is
correct when its category and its text equal the truth's (texts compared after stripping surrounding whitespace,
nothing else: `25/12/2018` is not `2018-12-25`). Precision = correct / submitted non-empty fields, recall =
correct / truth non-empty fields, F1 their harmonic mean; per field and over all fields (micro). pagemill's
`sroie` schema (schemas/extraction/sroie.json) asks for the four fields verbatim, as printed.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FIELDS = ("company", "date", "address", "total")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


@dataclass(frozen=True)
class Receipt:
    id: str
    image: Path
    truth: Mapping[str, str]


def text(value: Any) -> str:
    """A field's text as the metric compares it: surrounding whitespace stripped; null is empty."""
    if value is None or isinstance(value, dict | list):
        return ""
    return str(value).strip()


def read_key(raw: str, source: str) -> dict[str, str]:
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as err:
        raise ValueError(f"{source}: not a JSON key file ({err.msg})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{source}: not a JSON object")
    return {k: text(obj.get(k)) for k in FIELDS}


def load(root: str | Path) -> list[Receipt]:
    """Every receipt under `root` with both an image and a key file; raises ValueError when there is none."""
    root = Path(root)
    images = root / "img" if (root / "img").is_dir() else root
    keys = root / "entities" if (root / "entities").is_dir() else root
    receipts = []
    for image in sorted(p for p in images.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES):
        key = keys / f"{image.stem}.txt"
        if key.is_file():
            raw = key.read_text(encoding="utf-8", errors="replace")
            receipts.append(Receipt(image.stem, image, read_key(raw, key.name)))
    if not receipts:
        raise ValueError(f"{root}: no receipt image with a key file (<id>.jpg and <id>.txt, or img/ and entities/)")
    return receipts


def _prf(correct: int, submitted: int, truth: int) -> dict[str, Any]:
    p = correct / submitted if submitted else 0.0
    r = correct / truth if truth else 0.0
    return {"correct": correct, "submitted": submitted, "truth": truth, "precision": p, "recall": r,
            "f1": 2 * p * r / (p + r) if p + r else 0.0}


def score(truth: Mapping[str, Mapping[str, str]], predictions: Mapping[str, Mapping[str, Any] | None]
          ) -> dict[str, Any]:
    """Per-field and overall P/R/F1 of `predictions` (receipt id -> extracted fields, None: nothing extracted)."""
    counts = {f: [0, 0, 0] for f in FIELDS}  # correct, submitted, truth
    wrong = []
    for rid, fields in truth.items():
        got = predictions.get(rid) or {}
        for f in FIELDS:
            want, have = text(fields.get(f)), text(got.get(f))
            counts[f][1] += bool(have)
            counts[f][2] += bool(want)
            if want and have == want:
                counts[f][0] += 1
            elif want or have:
                wrong.append({"id": rid, "field": f, "truth": want, "got": have})
    per_field = {f: _prf(*c) for f, c in counts.items()}
    overall = _prf(*(sum(c[i] for c in counts.values()) for i in range(3)))
    return {"benchmark": "sroie", "score": overall["f1"], "overall": overall, "fields": per_field,
            "receipts": len(truth), "correct_fields": overall["correct"], "wrong": wrong}


def render(result: Mapping[str, Any]) -> list[str]:
    o = result["overall"]
    lines = [f"  SROIE task 3 F1 {100 * o['f1']:.1f}% (precision {100 * o['precision']:.1f}%, recall "
             f"{100 * o['recall']:.1f}%) over {result['receipts']} receipts"]
    lines += [f"    {f:<8} P {100 * v['precision']:5.1f}%  R {100 * v['recall']:5.1f}%  F1 {100 * v['f1']:5.1f}%"
              for f, v in result["fields"].items()]
    return lines
