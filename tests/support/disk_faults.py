"""A disk that fills in the middle of a write: the shared fault of the tests that write part files and manifests."""
from __future__ import annotations

import errno
import os
from typing import Any


class FullDisk:
    """Wraps an open handle: the first write lands half its bytes, then raises ENOSPC naming `path` (the file is
    left as a partial file, as a real full disk leaves it)."""

    def __init__(self, handle: Any, path: str) -> None:
        self.handle, self.path = handle, path

    def __enter__(self) -> FullDisk:
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.handle.close()
        return False

    def write(self, data: bytes) -> None:
        self.handle.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path)
