"""The launcher's commits of a wave (transforms/store/commits.py `Commits`) in the test process, not only through a
killed child run (tests/pipelines/test_catalog.py): mutants of `wave_done`, `run_settled` and `cleared` had no test
that reached them (issue 43, docs/development.md "Mutation score"). Part files written here in the tables'
layout, a real pyiceberg SQL catalog on SQLite; what each test expects is the module's documented rule: a wave's
own files that hold a key twice are compacted before its commit, rows that contradict each other are never
committed, each table is one snapshot a wave with `documents` last, and `--force` lets go of the run's files."""
from __future__ import annotations

import shutil
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from schemas import layout, tables
from transforms.store import iceberg
from transforms.store.commits import Commits
from transforms.store.write import part_prefix

pytest.importorskip("pyiceberg")

TENANT, RUN = "alpha", "r1"
TABLES = ("pages", "ledger", "documents")


def rows(table: str, names: list[str], page_hash: str = "h") -> list[dict[str, Any]]:
    common = {"tenant": TENANT, "run_id": RUN}
    if table == "documents":
        return [{**common, "source_uri": f"/in/{n}.pdf", "doc_sha256": n, "outcome": "ok"} for n in names]
    if table == "pages":
        return [{**common, "doc_sha256": n, "page_index": 0, "page_hash": f"{page_hash}{n}", "status": "ok"}
                for n in names]
    return [{**common, "doc_sha256": n, "page_index": 0, "route": "model", "image_tokens": 7} for n in names]


def part(root: Path, table: str, wave: int, data: list[dict[str, Any]]) -> Path:
    folder = Path(layout.partition(str(root), table, TENANT, RUN))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{part_prefix(wave)}{uuid.uuid4().hex}.parquet"
    pq.write_table(pa.Table.from_pylist(data, schema=tables.SCHEMAS[table]), path)
    return path


def wave(root: Path, number: int, names: list[str]) -> None:
    for table in TABLES:
        part(root, table, number, rows(table, names))


def commits(root: Path) -> Commits:
    return Commits(iceberg.CatalogConfig(uri=iceberg.EMBEDDED), str(root), None, TENANT, RUN)


def catalog_table(root: Path, table: str) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog(iceberg.CATALOG_NAME, uri=f"sqlite:///{root / iceberg.EMBEDDED_FILE}",
                         warehouse=f"file://{root}/w")
    return catalog.load_table(f"pagemill.{table}")


def keys(root: Path, table: str) -> list[tuple]:
    found = catalog_table(root, table).scan().to_arrow().to_pylist()
    return sorted(tuple(r[k] for k in layout.TABLE_KEYS[table]) for r in found)


def names(root: Path, table: str) -> list[str]:
    """The documents of the table's committed rows, one entry a key (each key once: checked)."""
    found = keys(root, table)
    assert len(found) == len(set(found)), f"{table}: a key twice"
    return sorted(r["doc_sha256"] for r in catalog_table(root, table).scan().to_arrow().to_pylist())


def waves_of(root: Path, table: str) -> Counter[int]:
    props = [s.summary.additional_properties for s in catalog_table(root, table).snapshots()]
    return Counter(int(p["pagemill.wave"]) for p in props if "pagemill.wave" in p)


def test_each_wave_is_one_snapshot_a_table_documents_last(tmp_path: Path) -> None:
    c = commits(tmp_path)
    wave(tmp_path, 0, ["a"])
    c.wave_done(0)
    wave(tmp_path, 1, ["b", "c"])
    c.wave_done(1)
    for table in TABLES:
        assert waves_of(tmp_path, table) == Counter([0, 1]), table
    assert names(tmp_path, "ledger") == ["a", "b", "c"]
    assert c.committed_waves() == {0, 1}
    for number in (0, 1):  # documents' snapshot of a wave is committed after the others'
        at = {t: next(s.timestamp_ms for s in catalog_table(tmp_path, t).snapshots()
                      if s.summary.additional_properties.get("pagemill.wave") == str(number)) for t in TABLES}
        assert at["documents"] >= max(at["pages"], at["ledger"]), at
    assert sorted(c.record()["commit_seconds"]) == ["0", "1"] and c.record()["not_committed"] == []
    c.wave_done(1)  # again (a resume after a kill before the wave was marked done): nothing new
    assert all(waves_of(tmp_path, t) == Counter([0, 1]) for t in TABLES)


def test_a_waves_bundle_written_twice_is_compacted_before_its_commit(tmp_path: Path) -> None:
    """The ledger and pages rows of wave 0 written twice (a retried bundle): the catalog holds each key once, in
    one snapshot of the wave."""
    wave(tmp_path, 0, ["a", "b"])
    for table in ("pages", "ledger"):
        (first,) = Path(layout.partition(str(tmp_path), table, TENANT, RUN)).glob("*.parquet")
        shutil.copyfile(first, first.with_name(f"{part_prefix(0)}{uuid.uuid4().hex}.parquet"))
    c = commits(tmp_path)
    c.wave_done(0)
    for table in TABLES:
        assert names(tmp_path, table) == ["a", "b"], table
        assert waves_of(tmp_path, table) == Counter([0]), table


def test_contradicting_rows_are_not_committed_and_the_run_says_so(tmp_path: Path) -> None:
    """Two wave-0 files of `pages` give page (a, 0) two different page hashes: `pages` is held (never in the
    catalog), the other tables are committed, and the manifest's record names it."""
    wave(tmp_path, 0, ["a"])
    part(tmp_path, "pages", 0, rows("pages", ["a"], page_hash="other"))
    c = commits(tmp_path)
    c.wave_done(0)
    assert c.record()["not_committed"] == ["pages"]
    assert iceberg.existing_table(c.catalog, "pagemill", "pages") is None or keys(tmp_path, "pages") == []
    assert waves_of(tmp_path, "ledger") == waves_of(tmp_path, "documents") == Counter([0])


def test_the_runs_end_holds_the_tables_its_errors_name(tmp_path: Path) -> None:
    wave(tmp_path, 0, ["a"])
    c = commits(tmp_path)
    c.wave_done(0)
    wave(tmp_path, 1, ["b"])  # written after the last wave's commit (a run's end commits what changed)
    c.run_settled(["ledger: 1 key(s) whose rows contradict each other"], 1)
    assert c.record()["not_committed"] == ["ledger"]
    assert names(tmp_path, "ledger") == ["a"]  # held: wave 1's ledger rows not committed
    assert names(tmp_path, "documents") == ["a", "b"]
    assert waves_of(tmp_path, "documents") == Counter([0, 1]) and "1" in c.record()["commit_seconds"]
    actions = [s.summary.additional_properties.get("pagemill.action")
               for s in catalog_table(tmp_path, "documents").snapshots()]
    assert actions == ["wave", "wave"]  # the last wave's run-end commit is that wave's, not a compaction's


def test_force_lets_go_of_the_runs_files(tmp_path: Path) -> None:
    wave(tmp_path, 0, ["a"])
    c = commits(tmp_path)
    c.wave_done(0)
    for table in TABLES:  # `--force` deleted the run's files
        shutil.rmtree(layout.partition(str(tmp_path), table, TENANT, RUN))
    c.cleared()
    for table in TABLES:
        assert keys(tmp_path, table) == [], table
        actions = [s.summary.additional_properties.get("pagemill.action") for s in
                   catalog_table(tmp_path, table).snapshots()]
        assert actions == ["wave", "clear"], (table, actions)
