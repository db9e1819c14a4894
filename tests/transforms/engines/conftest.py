"""Fixtures of the engine tests."""
from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def folder() -> Iterator[Path]:
    """A service folder in a short private path (a Unix socket's path has ~107 bytes); its services stopped after."""
    base = Path(tempfile.mkdtemp(prefix="pm-"))
    yield base / "svc"
    for path in base.rglob("stub.pid"):
        for pid in path.read_text().split():
            try:
                os.kill(int(pid), signal.SIGTERM)
            except ProcessLookupError:
                pass
    shutil.rmtree(base, ignore_errors=True)
