"""A class a hostile catalog names as its FileIO (`py-io-impl`) or location provider: made, it records that it
ran, in this process (`CALLS`) and in the file `PAGEMILL_TEST_MARKER` names (a child process's run)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

CALLS: list[Any] = []


class Planted:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        CALLS.append(args)
        if os.environ.get("PAGEMILL_TEST_MARKER"):
            Path(os.environ["PAGEMILL_TEST_MARKER"]).write_text("ran")
