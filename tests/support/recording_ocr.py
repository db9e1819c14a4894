"""An OCR probe that records every page image it is given: RecordingOcr.
Moved from tests/transforms/hints/test_choose.py, which other test files imported."""
from __future__ import annotations

import hashlib
from pathlib import Path

from transforms.hints.ocr import OcrResult, OcrSettings, run_tesseract


class RecordingOcr:
    """An OCR probe: records the sha256 of every page image it is given, then runs the real thing
    (or returns `fixed`). Picklable, so Beam can carry it to a worker."""

    def __init__(self, log: Path, fixed: OcrResult | None = None) -> None:
        self.log, self.fixed = log, fixed

    def __call__(self, image: bytes, s: OcrSettings) -> OcrResult:
        with self.log.open("a") as handle:
            handle.write(hashlib.sha256(image).hexdigest() + "\n")
        return self.fixed if self.fixed is not None else run_tesseract(image, s)

    def calls(self) -> list[str]:
        return self.log.read_text().split() if self.log.exists() else []
