"""The catalog's account of a run's waves and its retry after a lost race (transforms/store/iceberg.py,
transforms/store/commits.py; issue 43, each test fails under a planted bug no other test saw): the waves a run finds
committed are its own run's, not another run's of the same tenant; a commit that lost a race is retried on the
table as the catalog now holds it (not on the stale table object), even where pyiceberg itself does not retry.
A real pyiceberg SQL catalog on SQLite (the embedded `--catalog sqlite`) and part files written here."""
from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from schemas import layout, tables
from transforms.store import iceberg
from transforms.store.commits import Commits

pytest.importorskip("pyiceberg")

NS = "pagemill"


def rows(table: str, tenant: str, run_id: str, names: list[str]) -> list[dict[str, Any]]:
    now = dt.datetime(2026, 12, 7, tzinfo=dt.UTC)
    if table == "documents":
        return [{"tenant": tenant, "run_id": run_id, "source_uri": f"/in/{n}.pdf", "doc_sha256": n,
                 "outcome": "ok"} for n in names]
    return [{"tenant": tenant, "run_id": run_id, "doc_sha256": n, "page_index": 0, "route": "model",
             "image_tokens": 7, "created_at": now} for n in names]


def part_file(root: Path, table: str, tenant: str, run_id: str, names: list[str]) -> str:
    folder = Path(layout.partition(str(root), table, tenant, run_id))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"part-{uuid.uuid4().hex}.parquet"
    pq.write_table(pa.Table.from_pylist(rows(table, tenant, run_id, names), schema=tables.SCHEMAS[table]), path)
    return str(path)


def config() -> iceberg.CatalogConfig:
    return iceberg.CatalogConfig(uri=iceberg.EMBEDDED, namespace=NS)


def reader(root: Path) -> Any:
    """The catalog opened with pyiceberg alone, as another engine's user would."""
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog(iceberg.CATALOG_NAME, uri=f"sqlite:///{root / iceberg.EMBEDDED_FILE}",
                      warehouse=f"file://{root}/w")


def test_the_waves_a_run_finds_committed_are_its_own_runs(tmp_path: Path) -> None:
    """Run r1 of tenant alpha committed waves 0 and 1; a second run of alpha (r2) on the same catalog has
    committed none (it would otherwise skip r1's waves as done), and bravo's r1 none either."""
    catalog = iceberg.open_catalog(config(), str(tmp_path))
    done: list[str] = []
    for wave in (0, 1):
        done.append(part_file(tmp_path, "documents", "alpha", "r1", [f"a{wave}"]))
        iceberg.sync(catalog, NS, "documents", "alpha", "r1", list(done), "wave", wave)
    assert iceberg.committed_waves(catalog, NS, "documents", "alpha", "r1") == {0, 1}
    assert iceberg.committed_waves(catalog, NS, "documents", "alpha", "r2") == set()
    assert iceberg.committed_waves(catalog, NS, "documents", "bravo", "r1") == set()
    # As the launcher asks (transforms/store/commits.py): each run its own.
    assert Commits(config(), str(tmp_path), None, "alpha", "r2").committed_waves() == set()
    assert Commits(config(), str(tmp_path), None, "alpha", "r1").committed_waves() == {0, 1}
    # r2's own wave 0 is then r2's alone.
    iceberg.sync(catalog, NS, "documents", "alpha", "r2", [part_file(tmp_path, "documents", "alpha", "r2", ["b"])],
                 "wave", 0)
    assert Commits(config(), str(tmp_path), None, "alpha", "r2").committed_waves() == {0}


def test_a_commit_that_lost_a_race_is_retried_on_the_table_as_it_now_is(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault: between alpha's look at the table and its commit, another writer (bravo's run, through its own
    catalog connection) commits. The table's `commit.retry.num-retries` is 0, so pyiceberg neither retries nor
    refreshes the table object: alpha's first commit fails, and only a retry on the table reloaded from the
    catalog lands. Both tenants' rows are then in, each once, in three snapshots."""
    catalog = iceberg.open_catalog(config(), str(tmp_path))
    other = iceberg.open_catalog(config(), str(tmp_path))  # the other writer's own connection
    b0 = part_file(tmp_path, "ledger", "bravo", "r1", ["b0"])
    iceberg.sync(other, NS, "ledger", "bravo", "r1", [b0], "wave", 0)
    with other.load_table(f"{NS}.ledger").transaction() as tx:
        tx.set_properties(**{"commit.retry.num-retries": "0"})
    b1 = part_file(tmp_path, "ledger", "bravo", "r1", ["b1"])
    mine = part_file(tmp_path, "ledger", "alpha", "r1", ["a0", "a1"])

    real, raced = iceberg.committed_files, []

    def committed_then_raced(tbl: Any, tenant: str, run_id: str) -> dict[str, Any]:
        found = real(tbl, tenant, run_id)
        if tenant == "alpha" and not raced:
            raced.append(1)
            iceberg.sync(other, NS, "ledger", "bravo", "r1", [b0, b1], "wave", 1)  # commits first
        return found

    monkeypatch.setattr(iceberg, "committed_files", committed_then_raced)
    monkeypatch.setattr(iceberg, "backoff_s", lambda attempt: 0.0, raising=False)  # no waiting between tries
    snapshot = iceberg.sync(catalog, NS, "ledger", "alpha", "r1", [mine], "wave", 0)
    assert raced and snapshot is not None
    tbl = reader(tmp_path).load_table(f"{NS}.ledger")
    found = tbl.scan().to_arrow()
    assert sorted(zip(found.column("tenant").to_pylist(), found.column("doc_sha256").to_pylist(), strict=True)) == \
        [("alpha", "a0"), ("alpha", "a1"), ("bravo", "b0"), ("bravo", "b1")]
    assert tbl.current_snapshot().snapshot_id == snapshot
    props = [s.summary.additional_properties for s in tbl.snapshots()]
    assert [(p["pagemill.tenant"], p["pagemill.wave"]) for p in props] == [("bravo", "0"), ("bravo", "1"),
                                                                           ("alpha", "0")]


def test_a_tenants_read_holds_only_its_rows(tmp_path: Path) -> None:
    catalog = iceberg.open_catalog(config(), str(tmp_path))
    for tenant, names in (("alpha", ["a0", "a1"]), ("bravo", ["b0"])):
        iceberg.sync(catalog, NS, "ledger", tenant, "r1", [part_file(tmp_path, "ledger", tenant, "r1", names)],
                     "wave", 0)
    mine = iceberg.read_table(catalog, NS, "ledger", tenant="alpha")
    assert sorted(mine.column("doc_sha256").to_pylist()) == ["a0", "a1"]
    assert set(mine.column("tenant").to_pylist()) == {"alpha"}
    assert iceberg.read_table(catalog, NS, "ledger").num_rows == 3


def test_the_catalogs_metadata_lies_under_the_output_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedded catalog's warehouse is `<output>/iceberg` (metadata files only; the data stays where pagemill
    wrote it), wherever the launcher's working directory is."""
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    out = tmp_path / "out"
    catalog = iceberg.open_catalog(config(), str(out))
    iceberg.sync(catalog, NS, "ledger", "alpha", "r1", [part_file(out, "ledger", "alpha", "r1", ["a"])], "wave", 0)
    location = reader(out).load_table(f"{NS}.ledger").metadata_location
    assert location.removeprefix("file://").startswith(str(out / iceberg.WAREHOUSE) + "/"), location
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize(("properties", "bad"), [(["token=abc"], False), (["a=b=c"], False), (["token"], True),
                                                 (["=abc"], True), (["ok=1", "nope"], True)])
def test_a_catalog_property_is_key_equals_value(tmp_path: Path, properties: list[str], bad: bool) -> None:
    problems = iceberg.catalog_problems("sqlite", str(tmp_path), properties)
    assert bool(problems) is bad
    assert all("expected KEY=VALUE" in p for p in problems)
