"""A kill between the commits of one wave's tables (issue 43): a wave's tables are committed to the catalog one
after another (transforms/store/commits.py: `pages`, `ledger`, then `documents`, whose snapshot says the wave is in),
so a launcher killed after `pages` leaves a catalog whose tables disagree until the resume. The resume commits the
rest: each table then holds one snapshot per wave, every key once, and the three tables agree. Render-only runs in
child processes (killable); the fault is tests/support/catalog_faults.py `kill-between-commits`."""
from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from schemas import layout
from tests.support import docmaker
from transforms.store import commits

pytest.importorskip("pyiceberg")

ROOT = Path(__file__).resolve().parents[2]
RENDER_ONLY = ["--extract", "false", "--nsfw-classifier", "none", "--hints", "none", "--workers", "1",
               "--progress-every-s", "0", "--document-timeout-s", "0", "--page-timeout-s", "0"]
# 5 objects in waves of 4: a first wave of one object (a tenth of 4, at least 1), then 4 (listing_file.first_wave).
OBJECTS, WAVE_OBJECTS, WAVES = 5, 4, 2
TABLES = ("pages", "ledger", "documents")


def run(inputs: Path, output: Path, fault: tuple[str, int] | None = None) -> subprocess.CompletedProcess[str]:
    head = ["-m", "tests.support.catalog_faults", fault[0], str(fault[1])] if fault else ["-m", "pipelines.cli"]
    argv = [sys.executable, *head, "run", "--input", str(inputs), "--output", str(output), "--run-id", "k",
            "--wave-objects", str(WAVE_OBJECTS), "--catalog", "sqlite", *RENDER_ONLY]
    return subprocess.run(argv, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=600)


def table(output: Path, name: str):
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog("pagemill", uri=f"sqlite:///{output / 'catalog.db'}").load_table(f"pagemill.{name}")


def wave_snapshots(output: Path, name: str) -> Counter[int]:
    props = [s.summary.additional_properties for s in table(output, name).snapshots()]
    return Counter(int(p["pagemill.wave"]) for p in props if "pagemill.wave" in p)


def keys(output: Path, name: str) -> list[tuple]:
    rows = table(output, name).scan().to_arrow().to_pylist()
    return [tuple(r[k] for k in layout.TABLE_KEYS[name]) for r in rows]


def test_killed_between_a_waves_table_commits_the_resume_commits_each_once_and_the_tables_agree(
        tmp_path: Path) -> None:
    assert commits.COMMIT_ORDER.index("pages") < commits.COMMIT_ORDER.index("ledger") < \
        commits.COMMIT_ORDER.index("documents")  # the drill's premise: pages first, documents last
    pages = docmaker.pdf_folder(tmp_path / "in", OBJECTS)
    output = tmp_path / "out"
    killed = run(tmp_path / "in", output, fault=("kill-between-commits", 1))
    assert killed.returncode == -9, killed.stderr[-3000:]
    # Killed between them: wave 1's pages are in, its ledger and documents are not.
    assert wave_snapshots(output, "pages") == Counter(range(WAVES))
    assert wave_snapshots(output, "ledger") == wave_snapshots(output, "documents") == Counter([0])
    resumed = run(tmp_path / "in", output)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for name in TABLES:
        assert wave_snapshots(output, name) == Counter(range(WAVES)), name  # each wave once, in each table
        found = keys(output, name)
        assert len(found) == len(set(found)), f"{name}: a key twice"
    documents = table(output, "documents").scan().to_arrow().to_pylist()
    assert sorted(d["source_uri"] for d in documents) == sorted(pages)
    # The three agree: a page row for each page of each document, a ledger row for each page row.
    want = sorted(("default", "k", d["doc_sha256"], i) for d in documents for i in range(pages[d["source_uri"]]))
    assert sorted(keys(output, "pages")) == want
    assert sorted(keys(output, "ledger")) == want
