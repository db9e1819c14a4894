"""An intake child that hangs on a marked document: MARK, hangs_on_mark.
Moved from tests/transforms/intake/test_intake_timed.py, which other test files imported."""
from __future__ import annotations

import time

from transforms.intake.inspection import IntakeLimits, count_pages

MARK = b"%PAGEMILL-TEST-MARK\n"  # after %%EOF: pdfium ignores it; the drills below look for it


def hangs_on_mark(data: bytes, fmt: str, limits: IntakeLimits) -> int:
    """Fault injection (runs in the child): opening a marked document never ends."""
    if MARK in data:
        time.sleep(3600)
    return count_pages(data, fmt, limits)
