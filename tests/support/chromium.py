"""Headless Chromium for the report's checks: CHROMIUM, dump_dom.
Moved from tests/pipelines/tables/test_report.py, which other test files imported."""
from __future__ import annotations

import subprocess
from pathlib import Path

from pipelines.bench.olmocr_math import CHROMIUM_FLAGS, chromium_path

CHROMIUM = chromium_path()


def dump_dom(html: Path, tmp_path: Path) -> str:
    """The page's DOM after its scripts ran, from headless Chromium with no network and a fresh profile."""
    assert CHROMIUM is not None
    done = subprocess.run(
        [CHROMIUM, *CHROMIUM_FLAGS, "--disable-extensions", f"--user-data-dir={tmp_path / 'chromium-profile'}",
         "--dump-dom", html.resolve().as_uri()],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout
