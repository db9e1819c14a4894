"""The shared corpus's input PDFs: corpus_pdfs.
Moved from tests/transforms/safety/test_picture_pages.py, which other test files imported."""
from __future__ import annotations

import csv

from tests.conftest import CORPUS


def corpus_pdfs() -> list[tuple[str, bytes]]:
    rows = list(csv.DictReader((CORPUS / "manifest.csv").open()))
    return [(r["local_path"], (CORPUS / r["local_path"]).read_bytes()) for r in rows
            if r["role"] == "input" and r["category"] in ("extraction_gt", "ocr_scans")
            and r["local_path"].lower().endswith(".pdf")]
