"""The engine service's folder, planted or squatted by another user.
Moved from tests/transforms/engines/vllm_machine/test_machine_folder.py, which other test files imported."""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from transforms.engines.vllm_machine import folder as mf

OTHER_UID = 65534  # nobody


def plant_as_other_user(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path], None]:
    """Make `path` (and what is under it) belong to another user: chown as root, else a getuid that answers
    another uid than the files' (then every file of ours reads as someone else's)."""
    if os.geteuid() == 0:
        def chown(path: Path) -> None:
            for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
                os.lchown(p, OTHER_UID, OTHER_UID)
        return chown
    me = os.getuid()
    monkeypatch.setattr(mf.os, "getuid", lambda: me + 1)
    return lambda path: None


def squat(folder: Path) -> str:
    """Another local user's `folder`, made before ours: owned by uid 65534 as root; otherwise open to everyone
    (mode 0777), which is refused as surely. What the refusal says."""
    folder.mkdir()
    if os.geteuid() == 0:
        os.chown(folder, OTHER_UID, OTHER_UID)
        return f"owned by uid {OTHER_UID}"
    folder.chmod(0o777)
    return "mode 0777"
