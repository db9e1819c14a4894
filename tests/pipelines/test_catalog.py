"""`--catalog`: a run's waves committed to Iceberg tables (transforms/store/commits.py, transforms/store/iceberg.py),
read back with pyiceberg alone as another engine's user would. Render-only runs in child processes (killable);
faults in the commit step come from tests/support/catalog_faults.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from pipelines.tables import sql
from schemas import layout, tables
from tests.support import docmaker

pytest.importorskip("pyiceberg")

ROOT = Path(__file__).resolve().parents[2]
RENDER_ONLY = ["--extract", "false", "--nsfw-classifier", "none", "--hints", "none", "--workers", "1",
               "--progress-every-s", "0", "--document-timeout-s", "0", "--page-timeout-s", "0"]
WAVE_OBJECTS = 4  # 9 objects: waves of 1, 4 and 4 (transforms/store/listing_file.py first_wave)
WAVES = 3



def command(inputs: Path, output: Path, run_id: str, *extra: str, fault: tuple[str, int] | None = None) -> list[str]:
    head = ["-m", "tests.support.catalog_faults", fault[0], str(fault[1])] if fault else ["-m", "pipelines.cli"]
    return [sys.executable, *head, "run", "--input", str(inputs), "--output", str(output), "--run-id", run_id,
            "--wave-objects", str(WAVE_OBJECTS), "--catalog", "sqlite", *RENDER_ONLY, *extra]


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=600)


def reader(output: Path):
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog("pagemill", uri=f"sqlite:///{output / 'catalog.db'}")


def committed(output: Path, table: str) -> list[dict]:
    """The table's rows in the catalog's current snapshot, read by pyiceberg alone."""
    data = reader(output).load_table(f"pagemill.{table}").scan().to_arrow()
    return data.select(tables.SCHEMAS[table].names).cast(tables.SCHEMAS[table]).to_pylist()


def wave_snapshots(output: Path, table: str, tenant: str = "default") -> Counter[int]:
    """How many snapshots of the table commit each wave of `tenant`'s runs."""
    snaps = reader(output).load_table(f"pagemill.{table}").snapshots()
    props = [s.summary.additional_properties for s in snaps]
    return Counter(int(p["pagemill.wave"]) for p in props if "pagemill.wave" in p and p["pagemill.tenant"] == tenant)


def keys(rows: list[dict], table: str) -> list[tuple]:
    return [tuple(r[k] for k in layout.TABLE_KEYS[table]) for r in rows]


def by_key(rows: list[dict], table: str) -> dict[tuple, dict]:
    return dict(zip(keys(rows, table), rows, strict=True))


def test_each_wave_is_one_snapshot_a_table_and_pyiceberg_reads_what_pagemill_sql_shows(tmp_path: Path) -> None:
    """A bundle of wave 1 replayed before its commit (its pages and ledger rows written twice): the catalog still
    holds one row per key, the same rows `pagemill sql` shows over the part files, one snapshot per table per
    wave; `pagemill sql --catalog --snapshot` reads the tables as that snapshot left them."""
    pages = docmaker.pdf_folder(tmp_path / "in", 9)
    output = tmp_path / "out"
    done = run(command(tmp_path / "in", output, "r1", fault=("replay", 1)))
    assert done.returncode == 0, done.stderr[-3000:]
    con = sql.connect(str(output), typed=False)
    try:
        for table in tables.TABLES:
            shown = con.execute(f"SELECT * FROM {table}").to_arrow_table().cast(tables.SCHEMAS[table]).to_pylist()
            rows = committed(output, table)
            assert len(set(keys(rows, table))) == len(rows), f"{table}: a key twice in the catalog"
            assert by_key(rows, table) == by_key(shown, table), table
    finally:
        con.close()
    assert sorted(r["source_uri"] for r in committed(output, "documents")) == sorted(pages)
    assert sorted(keys(committed(output, "pages"), "pages")) == sorted(
        ("default", "r1", d["doc_sha256"], i) for d in committed(output, "documents")
        for i in range(pages[d["source_uri"]]))
    assert wave_snapshots(output, "documents") == Counter(range(WAVES))  # one each, every wave
    for table in ("pages", "ledger"):
        assert wave_snapshots(output, table) == Counter(range(WAVES))
    manifest = json.loads((output / "runs" / "tenant=default" / "r1.json").read_text())
    assert sorted(manifest["catalog"]["commit_seconds"]) == [str(w) for w in range(WAVES)]
    # Pinned to wave 0's documents snapshot: the first wave's one object, nothing of the later waves.
    first = next(s for s in reader(output).load_table("pagemill.documents").snapshots()
                 if s.summary.additional_properties.get("pagemill.wave") == "0")
    pinned = run([sys.executable, "-m", "pipelines.cli", "sql", "--output", str(output), "--catalog", "sqlite",
                  "--snapshot", str(first.snapshot_id), "--format", "json",
                  "SELECT (SELECT count(*) FROM documents) AS d, (SELECT count(*) FROM pages) AS p"])
    assert pinned.returncode == 0, pinned.stderr
    first_uri = sorted(pages)[0]
    assert json.loads(pinned.stdout) == [{"d": 1, "p": pages[first_uri]}]


def test_killed_around_a_commit_each_wave_is_committed_once(tmp_path: Path) -> None:
    """kill -9 after wave 1's files are written and before its commit; resume, killed right after wave 2's commit
    (before the wave is marked done); resume again: every key once in the catalog, one snapshot per wave, and
    wave 2 is not run again (the catalog says it is in)."""
    pages = docmaker.pdf_folder(tmp_path / "in", 9)
    output = tmp_path / "out"
    first = run(command(tmp_path / "in", output, "k", fault=("kill-before-commit", 1)))
    assert first.returncode == -9, first.stderr[-3000:]
    assert wave_snapshots(output, "documents") == Counter([0])
    on_disk = [p for p in (output / "documents").rglob("*.parquet") if p.name.startswith("part-w00001-")]
    assert on_disk, "wave 1's files were written before the kill"
    second = run(command(tmp_path / "in", output, "k", fault=("kill-after-commit", 2)))
    assert second.returncode == -9, second.stderr[-3000:]
    assert wave_snapshots(output, "documents") == Counter(range(WAVES))
    third = run(command(tmp_path / "in", output, "k"))
    assert third.returncode == 0, third.stderr[-3000:]
    manifest = json.loads((output / "runs" / "tenant=default" / "k.json").read_text())
    assert manifest["waves"]["ran"] == 0 and manifest["waves"]["skipped"] == WAVES
    for table in tables.TABLES:
        rows = committed(output, table)
        if table == "evidence" and not rows:  # a render-only run extracts no values: nothing to commit
            continue
        assert Counter(keys(rows, table)).most_common(1)[0][1] == 1, table
        assert wave_snapshots(output, table) == Counter(range(WAVES)), table
    assert sorted(r["source_uri"] for r in committed(output, "documents")) == sorted(pages)
    assert len(committed(output, "pages")) == sum(pages.values())


def test_two_tenants_on_one_catalog_both_commit_every_wave(tmp_path: Path) -> None:
    pages = {t: docmaker.pdf_folder(tmp_path / t, 9, tag=t) for t in ("alpha", "bravo")}
    output = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = {t: subprocess.Popen(command(tmp_path / t, output, "shared", "--tenant", t), cwd=ROOT, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for t in pages}
    logs = {t: p.communicate(timeout=600)[0] for t, p in procs.items()}
    for t, p in procs.items():
        assert p.returncode == 0, logs[t][-3000:]
    rows = committed(output, "documents")
    for tenant, mine in pages.items():
        assert sorted(r["source_uri"] for r in rows if r["tenant"] == tenant) == sorted(mine)
        assert wave_snapshots(output, "documents", tenant) == Counter(range(WAVES))
    assert sum(1 for r in committed(output, "pages")) == sum(sum(p.values()) for p in pages.values())

