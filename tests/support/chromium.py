"""Headless Chromium for the report's checks: CHROMIUM, dump_dom.
Moved from tests/pipelines/tables/test_report.py, which other test files imported."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def dump_dom(html: Path, tmp_path: Path) -> str:
    """The page's DOM after its scripts ran, from headless Chromium with no network and a fresh profile."""
    assert CHROMIUM is not None
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
         f"--user-data-dir={tmp_path / 'chromium-profile'}", "--dump-dom", html.resolve().as_uri()],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout
