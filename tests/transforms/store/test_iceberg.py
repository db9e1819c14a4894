"""Iceberg commits (transforms/store/iceberg.py) against a real pyiceberg SQL catalog on SQLite: the part files
already on disk are registered, once, one snapshot per sync; a replacement is one overwrite; older tables gain
columns; two writers both land. Read back with pyiceberg alone where the test is about what a reader sees."""
from __future__ import annotations

import datetime as dt
import threading
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from schemas import layout, tables
from transforms.store import iceberg

pytest.importorskip("pyiceberg")


def _ledger_rows(tenant: str, run_id: str, n: int, start: int = 0, tokens: int = 7) -> list[dict]:
    now = dt.datetime(2026, 12, 3, tzinfo=dt.UTC)
    return [{"run_id": run_id, "tenant": tenant, "doc_sha256": f"d{i}", "page_index": 0, "route": "model",
             "image_tokens": tokens, "created_at": now} for i in range(start, start + n)]


def _write(root: Path, table: str, rows: list[dict], tenant: str = "alpha", run_id: str = "r1",
           schema: pa.Schema | None = None) -> str:
    folder = Path(layout.partition(str(root), table, tenant, run_id))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"part-{uuid.uuid4().hex}.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=schema or tables.SCHEMAS[table]), path)
    return str(path)


def _config() -> iceberg.CatalogConfig:
    return iceberg.CatalogConfig(uri=iceberg.EMBEDDED)


def _reader(root: Path):
    """A catalog opened with pyiceberg alone, as another engine's user would."""
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog(iceberg.CATALOG_NAME, uri=f"sqlite:///{root / iceberg.EMBEDDED_FILE}", warehouse=f"file://{root}/w")


def test_a_sync_registers_the_files_on_disk_once_with_the_run_in_its_properties(tmp_path: Path) -> None:
    first = _write(tmp_path, "ledger", _ledger_rows("alpha", "r1", 3))
    second = _write(tmp_path, "ledger", _ledger_rows("alpha", "r1", 2, start=3))
    ids = iceberg.sync_run(_config(), str(tmp_path), None, "alpha", "r1", {"ledger": [first, second]}, "wave", 0)
    assert ids["ledger"] is not None
    again = iceberg.sync_run(_config(), str(tmp_path), None, "alpha", "r1", {"ledger": [first, second]}, "wave", 0)
    assert again == {"ledger": None}  # nothing new: no second snapshot
    tbl = _reader(tmp_path).load_table("pagemill.ledger")
    assert len(tbl.snapshots()) == 1
    props = tbl.snapshots()[0].summary.additional_properties
    assert (props["pagemill.tenant"], props["pagemill.run_id"], props["pagemill.wave"]) == ("alpha", "r1", "0")
    rows = tbl.scan().to_arrow()
    assert sorted(rows.column("doc_sha256").to_pylist()) == [f"d{i}" for i in range(5)]
    assert [f.name for f in tbl.spec().fields] == ["tenant", "run_id"]


def test_a_replacement_is_one_overwrite_and_a_reader_never_sees_both(tmp_path: Path) -> None:
    old = [_write(tmp_path, "ledger", _ledger_rows("alpha", "r1", 2)) for _ in range(2)]  # the same keys twice
    iceberg.sync_run(_config(), str(tmp_path), None, "alpha", "r1", {"ledger": old}, "wave", 0)
    new = _write(tmp_path, "ledger", _ledger_rows("alpha", "r1", 2))
    iceberg.sync_run(_config(), str(tmp_path), None, "alpha", "r1", {"ledger": [new]}, "compaction")
    tbl = _reader(tmp_path).load_table("pagemill.ledger")
    ops = [s.summary.operation.value for s in tbl.snapshots()]
    assert ops == ["append", "overwrite"]
    assert tbl.scan().to_arrow().num_rows == 2
    before = tbl.scan(snapshot_id=tbl.snapshots()[0].snapshot_id).to_arrow()
    assert before.num_rows == 4  # the history keeps what was committed


def test_another_partition_is_left_alone(tmp_path: Path) -> None:
    mine = _write(tmp_path, "ledger", _ledger_rows("alpha", "r1", 2))
    theirs = _write(tmp_path, "ledger", _ledger_rows("bravo", "r1", 3), tenant="bravo")
    iceberg.sync_run(_config(), str(tmp_path), None, "bravo", "r1", {"ledger": [theirs]}, "wave", 0)
    iceberg.sync_run(_config(), str(tmp_path), None, "alpha", "r1", {"ledger": [mine]}, "wave", 0)
    iceberg.sync_run(_config(), str(tmp_path), None, "alpha", "r1", {"ledger": []}, "compaction")
    left = _reader(tmp_path).load_table("pagemill.ledger").scan().to_arrow()
    assert sorted(set(left.column("tenant").to_pylist())) == ["bravo"]
    assert left.num_rows == 3


def test_a_table_an_older_release_made_gains_the_new_columns(tmp_path: Path) -> None:
    older = pa.schema([f for f in tables.LEDGER if f.name != "cached_prompt_tokens"])
    catalog = iceberg.open_catalog(_config(), str(tmp_path))
    schema = iceberg.iceberg_schema(older)
    catalog.create_table("pagemill.ledger", schema=schema, partition_spec=iceberg.partition_spec_of(schema))
    old_file = _write(tmp_path, "ledger", [{k: v for k, v in r.items()} for r in _ledger_rows("alpha", "r0", 1)],
                      run_id="r0", schema=older)
    iceberg.sync_run(_config(), str(tmp_path), None, "alpha", "r0", {"ledger": [old_file]}, "wave", 0)
    rows = _ledger_rows("alpha", "r1", 1)
    rows[0]["cached_prompt_tokens"] = 11
    iceberg.sync_run(_config(), str(tmp_path), None, "alpha", "r1", {"ledger": [_write(tmp_path, "ledger", rows)]},
                     "wave", 0)
    tbl = _reader(tmp_path).load_table("pagemill.ledger")
    names = [f.name for f in tbl.schema().fields]
    assert names == [*older.names, "cached_prompt_tokens"]  # the new column added (at the end), nothing dropped
    got = {r["run_id"]: r["cached_prompt_tokens"] for r in tbl.scan().to_arrow().to_pylist()}
    assert got == {"r0": None, "r1": 11}


def test_two_writers_of_different_tenants_both_land(tmp_path: Path) -> None:
    iceberg.open_catalog(_config(), str(tmp_path))
    files = {t: [_write(tmp_path, "ledger", _ledger_rows(t, "r1", 2, start=i * 2), tenant=t) for i in range(4)]
             for t in ("alpha", "bravo")}
    errors: list[BaseException] = []

    def commit(tenant: str) -> None:
        try:
            for i in range(4):  # one commit a wave, racing the other tenant's
                iceberg.sync_run(_config(), str(tmp_path), None, tenant, "r1", {"ledger": files[tenant][: i + 1]},
                                 "wave", i)
        except BaseException as err:  # noqa: BLE001 - reported by the assertion below
            errors.append(err)

    threads = [threading.Thread(target=commit, args=(t,)) for t in files]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    tbl = _reader(tmp_path).load_table("pagemill.ledger")
    got = tbl.scan().to_arrow()
    assert sorted(zip(got.column("tenant").to_pylist(), got.column("doc_sha256").to_pylist(), strict=True)) == \
        sorted((t, f"d{i}") for t in files for i in range(8))
    catalog = iceberg.open_catalog(_config(), str(tmp_path))
    for tenant in files:
        assert iceberg.committed_waves(catalog, "pagemill", "ledger", tenant, "r1") == {0, 1, 2, 3}


def test_read_table_pins_every_table_to_a_snapshots_time(tmp_path: Path) -> None:
    first = _write(tmp_path, "ledger", _ledger_rows("alpha", "r1", 1))
    ids = iceberg.sync_run(_config(), str(tmp_path), None, "alpha", "r1", {"ledger": [first]}, "wave", 0)
    second = _write(tmp_path, "ledger", _ledger_rows("alpha", "r1", 2, start=1))
    iceberg.sync_run(_config(), str(tmp_path), None, "alpha", "r1", {"ledger": [first, second]}, "wave", 1)
    catalog = iceberg.open_catalog(_config(), str(tmp_path))
    pinned = iceberg.read_table(catalog, "pagemill", "ledger", as_of_ms=iceberg.pinned_time(catalog, "pagemill",
                                                                                         ids["ledger"]))
    assert pinned.num_rows == 1 and pinned.schema == tables.LEDGER
    assert iceberg.read_table(catalog, "pagemill", "ledger").num_rows == 3
    assert iceberg.read_table(catalog, "pagemill", "pages").num_rows == 0
    with pytest.raises(ValueError, match="no table"):
        iceberg.pinned_time(catalog, "pagemill", 12345)


@pytest.mark.parametrize(("uri", "output", "bad"), [
    ("sqlite", "out", False), ("sqlite", "s3://bucket/out", True), ("postgresql+psycopg2://h/db", "s3://b/o", False),
    ("https://catalog.example/api", "s3://b/o", False), ("catalog.db", "out", True)])
def test_catalog_problems(uri: str, output: str, bad: bool) -> None:
    assert bool(iceberg.catalog_problems(uri, output)) is bad


def test_a_run_that_loses_the_race_to_make_the_namespace_goes_on(tmp_path: Path, monkeypatch) -> None:
    """Two runs opening a new catalog at once both see the namespace missing; the SQL catalog fails the second
    insert with an IntegrityError (CI saw it: `UNIQUE constraint failed: iceberg_namespace_properties...`).
    Replayed here without timing: the other run made the namespace after this one looked."""
    from pyiceberg.catalog.sql import SqlCatalog

    iceberg.open_catalog(_config(), str(tmp_path))  # the other run, first
    looked = []
    real = SqlCatalog.namespace_exists

    def stale_first_look(self, namespace):  # this run's look happened before the other run's insert
        looked.append(namespace)
        return False if len(looked) == 1 else real(self, namespace)

    monkeypatch.setattr(SqlCatalog, "namespace_exists", stale_first_look)
    catalog = iceberg.open_catalog(_config(), str(tmp_path))
    assert len(looked) >= 2  # the lost race happened and was looked at again
    assert real(catalog, "pagemill")
    first = _write(tmp_path, "ledger", _ledger_rows("alpha", "r1", 2))
    assert iceberg.sync_run(_config(), str(tmp_path), None, "alpha", "r1", {"ledger": [first]}, "wave", 0)["ledger"]


def test_a_run_that_loses_the_race_to_make_the_catalogs_tables_goes_on(tmp_path: Path, monkeypatch) -> None:
    """The other race of two runs opening a new SQLite catalog (CI saw it: `OperationalError: table
    iceberg_namespace_properties already exists`): both find the catalog's tables absent, the second CREATE fails.
    Replayed without timing: the other run made them between this run's look and its CREATE."""
    from pyiceberg.catalog.sql import SqlCatalog
    from sqlalchemy.exc import OperationalError

    real, creates = SqlCatalog.create_tables, []

    def made_by_the_other_run_first(self):
        creates.append(1)
        real(self)  # the other run's CREATE lands first...
        if len(creates) == 1:  # ...and this run's own then fails, as SQLite fails it
            raise OperationalError("CREATE TABLE iceberg_namespace_properties", {}, Exception("already exists"))

    monkeypatch.setattr(SqlCatalog, "create_tables", made_by_the_other_run_first)
    catalog = iceberg.open_catalog(_config(), str(tmp_path))
    assert creates and catalog.namespace_exists("pagemill")
    first = _write(tmp_path, "ledger", _ledger_rows("alpha", "r1", 2))
    assert iceberg.sync_run(_config(), str(tmp_path), None, "alpha", "r1", {"ledger": [first]}, "wave", 0)["ledger"]
