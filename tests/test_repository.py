"""The repository names no machine: no absolute path of a developer's or CI's machine in any tracked file
(the shared corpus is `../shared/corpus` beside the clone, or $PAGEMILL_CORPUS)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Built from parts so that this file does not match itself.
ROOTS = ["wo" + "rk", "ho" + "me", "ro" + "ot", "Us" + "ers", "mn" + "t"]
MACHINE_PATH = re.compile("(?<![\\w.~<>-])/(" + "|".join(ROOTS) + ")/[\\w.-]+")


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [REPO / name for name in out.decode().split("\0") if name]


def test_no_machine_paths_in_tracked_files() -> None:
    found = []
    for path in tracked_files():
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary samples
        found += [f"{path.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
                  for m in MACHINE_PATH.finditer(text)]
    assert not found, "machine paths in the repository:\n" + "\n".join(found)


def test_the_pattern_finds_what_it_is_for() -> None:
    sample = "see " + "/wo" + "rk/main/samples/a.pdf and " + "/ho" + "me/dev/x"
    assert [m.group(0) for m in MACHINE_PATH.finditer(sample)] == ["/wo" + "rk/main", "/ho" + "me/dev"]
    assert not MACHINE_PATH.search("<checkout>/samples/a.pdf ../shared/corpus s3://bucket" + "/wo" + "rk/x")
