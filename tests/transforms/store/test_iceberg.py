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


def test_a_table_not_partitioned_as_pagemill_makes_it_is_refused_with_the_reason(tmp_path: Path) -> None:
    """Issue 42 row 4: on a table partitioned by nothing, "this run's files" chosen by a row filter over string
    statistics cut to 16 characters took bravo's file for alpha's (`customer-000001-alpha` vs `...-bravo`)."""
    alpha, bravo = "customer-000001-alpha", "customer-000001-bravo"
    catalog = iceberg.open_catalog(_config(), str(tmp_path))
    catalog.create_table("pagemill.ledger", schema=iceberg.iceberg_schema(tables.LEDGER))  # no partition spec
    theirs = _write(tmp_path, "ledger", _ledger_rows(bravo, "r1", 3), tenant=bravo)
    with pytest.raises(iceberg.CatalogRefused, match=r"partitioned by \[nothing\]"):
        iceberg.sync_run(_config(), str(tmp_path), None, bravo, "r1", {"ledger": [theirs]}, "wave", 0)
    mine = _write(tmp_path, "ledger", _ledger_rows(alpha, "r1", 2), tenant=alpha)
    with pytest.raises(iceberg.CatalogRefused, match="not a table pagemill made"):
        iceberg.sync_run(_config(), str(tmp_path), None, alpha, "r1", {"ledger": [mine]}, "wave", 0)
    assert _reader(tmp_path).load_table("pagemill.ledger").current_snapshot() is None  # nothing committed
    with pytest.raises(iceberg.CatalogRefused, match="not a table pagemill made"):
        iceberg.read_table(catalog, "pagemill", "ledger")


def test_a_table_whose_key_column_has_another_type_is_refused(tmp_path: Path) -> None:
    catalog = iceberg.open_catalog(_config(), str(tmp_path))
    other = pa.schema([pa.field("page_index", pa.string()) if f.name == "page_index" else f for f in tables.LEDGER])
    schema = iceberg.iceberg_schema(other)
    catalog.create_table("pagemill.ledger", schema=schema, partition_spec=iceberg.partition_spec_of(schema))
    mine = _write(tmp_path, "ledger", _ledger_rows("alpha", "r1", 1))
    with pytest.raises(iceberg.CatalogRefused, match="page_index column is string"):
        iceberg.sync_run(_config(), str(tmp_path), None, "alpha", "r1", {"ledger": [mine]}, "wave", 0)


def test_long_tenant_names_that_share_16_characters_keep_their_own_files(tmp_path: Path) -> None:
    """The run's committed files are chosen by the partition each was registered under, exactly."""
    alpha, bravo = "customer-000001-alpha", "customer-000001-bravo"
    theirs = _write(tmp_path, "ledger", _ledger_rows(bravo, "r1", 3), tenant=bravo)
    mine = _write(tmp_path, "ledger", _ledger_rows(alpha, "r1", 2), tenant=alpha)
    iceberg.sync_run(_config(), str(tmp_path), None, bravo, "r1", {"ledger": [theirs]}, "wave", 0)
    iceberg.sync_run(_config(), str(tmp_path), None, alpha, "r1", {"ledger": [mine]}, "wave", 0)
    iceberg.sync_run(_config(), str(tmp_path), None, alpha, "r1", {"ledger": []}, "clear")
    left = _reader(tmp_path).load_table("pagemill.ledger")
    assert [t.file.file_path for t in left.scan().plan_files()] == [theirs]
    assert [t.file.partition[0] for t in left.scan().plan_files()] == [bravo]


def test_commits_write_no_version_0_metadata_file_after_the_first(tmp_path: Path) -> None:
    """Issue 42 row 8: the table is loaded before a creation is tried (a creation writes `00000-*` first)."""
    files = []
    for wave in range(3):
        files.append(_write(tmp_path, "ledger", _ledger_rows("alpha", "r1", 1, start=wave)))
        iceberg.sync_run(_config(), str(tmp_path), None, "alpha", "r1", {"ledger": list(files)}, "wave", wave)
        catalog = iceberg.open_catalog(_config(), str(tmp_path))
        iceberg.committed_waves(catalog, "pagemill", "ledger", "alpha", "r1")  # a resume's look
    metadata = tmp_path / iceberg.WAREHOUSE / "pagemill" / "ledger" / "metadata"  # docs/lakehouse.md's path
    assert len(list(metadata.glob("00000-*.metadata.json"))) == 1
    assert len(list(metadata.glob("*.metadata.json"))) == 1 + 3  # created, then one a commit


def test_a_snapshot_from_before_a_compaction_still_reads_and_expire_then_removes_the_old_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 42 row 7: with a catalog, a compaction commits its replacement and keeps the replaced files for the
    snapshots that name them; `pagemill sql` without the catalog still shows one row per key;
    `pagemill expire` then deletes them with the old snapshots."""
    from pipelines import cli
    from pipelines.tables import sql
    from transforms.store.compaction import compact_run

    out = str(tmp_path)
    old = [_write(tmp_path, "ledger", _ledger_rows("alpha", "r1", 2, tokens=t)) for t in (1, 2)]  # keys twice
    first = iceberg.sync_run(_config(), out, None, "alpha", "r1", {"ledger": old}, "wave", 0)["ledger"]
    assert compact_run(out, "alpha", "r1", keep_replaced=True) == {"ledger": 2}
    from transforms.store.files import run_files

    (new,) = run_files(out, "ledger", "alpha", "r1")
    assert iceberg.sync_run(_config(), out, None, "alpha", "r1", {"ledger": [new]}, "compaction")["ledger"]
    assert all(Path(p).exists() for p in old)
    pinned = sql.TableSource.of(out, "sqlite", snapshot=first)
    _, before = sql.query(out, "SELECT count(*) FROM ledger_all", source=pinned)
    assert before == [(4,)]  # both replaced files, read as that snapshot committed them
    for source in (None, sql.TableSource.of(out, "sqlite")):
        _, now = sql.query(out, "SELECT count(*), count(DISTINCT doc_sha256) FROM ledger_all", source=source)
        assert now == [(2, 2)]  # one row per key, with and without the catalog
    expired_list = Path(_reader(tmp_path).load_table("pagemill.ledger").snapshot_by_id(first).manifest_list
                        .removeprefix("file://"))
    assert expired_list.exists()
    assert cli.main(["expire", "--output", out, "--catalog", "sqlite", "--older-than-days", "0"]) == 0
    assert not expired_list.exists()  # the expired snapshot's manifest list: named by nothing left
    assert "ledger: expired 1 snapshot(s); replaced part files deleted: 2" in capsys.readouterr().out
    assert not any(Path(p).exists() for p in old)
    assert not list(Path(new).parent.glob("*.replaces.json"))
    _, after = sql.query(out, "SELECT count(*) FROM ledger_all", source=sql.TableSource.of(out, "sqlite"))
    assert after == [(2,)]
    with pytest.raises(ValueError, match="no table"):
        sql.query(out, "SELECT 1", source=pinned)
