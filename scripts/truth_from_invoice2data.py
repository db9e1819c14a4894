"""Truth lines for `pagemill eval` (invoice schema) from invoice2data's expected results.

invoice2data (in the shared corpus under `extraction_gt/invoice-x__invoice2data/tests/compare/`) keeps, beside
each test invoice `X.pdf`, the fields its templates extract in `X.json` (a list holding one object). This writes
one truth line per PDF that has such a file:
`{"source": "<path of the PDF relative to the input folder>", "page_index": 0, "fields": {...}}`.

Only fields with an explicit counterpart in schemas/extraction/invoice.json are kept (FIELD_MAP), and only when
invoice2data has a value for them (a field it does not extract is left out of the truth, not set to null: its
templates extract what they were written for, not everything on the page). Left out on purpose:
- `lines`: each template names its line fields differently (`price_unit`, `price`, `qty`, `desc`, `item`) and
  many list only some of the lines, so they are not a fair truth for `line_items`;
- everything without a schema field (partner address, IBAN, VAT ids, notes, ...).
Values are per document; they are checked against page 0, where these invoices print them (most are one page).

    python scripts/truth_from_invoice2data.py [INPUT_DIR] [--output FILE]   # default ../shared/corpus/extraction_gt
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# invoice2data field -> invoice schema field. Amounts are numbers in both; dates are ISO strings in both.
FIELD_MAP = {
    "issuer": "vendor_name",
    "invoice_number": "invoice_number",
    "date": "issue_date",
    "date_due": "due_date",
    "currency": "currency",
    "amount_untaxed": "subtotal",
    "amount_tax": "tax",
    "amount": "total",
}
# As the tests find the corpus: $PAGEMILL_CORPUS, else ../shared/corpus beside the repository.
DEFAULT_INPUT = Path(os.environ.get("PAGEMILL_CORPUS") or Path(__file__).resolve().parents[1].parent / "shared"
                     / "corpus") / "extraction_gt"


def truth_fields(expected: dict[str, Any]) -> dict[str, Any]:
    """The schema fields of one invoice2data result, in the schema's order, values as they are."""
    return {ours: expected[theirs] for theirs, ours in FIELD_MAP.items()
            if expected.get(theirs) is not None and expected.get(theirs) != ""}


def truth_lines(root: Path) -> Iterator[dict[str, Any]]:
    """One truth row per `X.pdf` under `root` that has an invoice2data `X.json` beside it, sorted by path."""
    for expected_path in sorted(root.rglob("*.json")):
        pdf = expected_path.with_suffix(".pdf")
        if not pdf.is_file():
            continue
        try:
            data = json.loads(expected_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # not an invoice2data result
        if not (isinstance(data, list) and data and isinstance(data[0], dict) and "issuer" in data[0]):
            continue
        fields = truth_fields(data[0])
        if fields:
            yield {"source": pdf.relative_to(root).as_posix(), "page_index": 0, "fields": fields}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("input", nargs="?", type=Path, default=DEFAULT_INPUT)
    parser.add_argument("--output", type=Path, default=None, help="default: standard output")
    args = parser.parse_args(argv)
    if not args.input.is_dir():
        print(f"truth_from_invoice2data: no folder {args.input}", file=sys.stderr)
        return 2
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in truth_lines(args.input))
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
