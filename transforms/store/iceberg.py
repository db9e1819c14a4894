"""Iceberg commits of a run's tables (`--catalog`): the Parquet part files pagemill already wrote are registered
in an Iceberg catalog (pyiceberg; the data is never rewritten), one snapshot per table per wave, so that any
engine that reads Iceberg (Trino, Spark, Athena, Snowflake, DuckDB, polars) sees a wave's rows all at once and
never half a wave, and a reader can pin a snapshot.

The rule: the committed files of a (tenant, run id) partition are made equal to the part files on disk, in one
snapshot (`sync`). A wave's end adds its files; a compaction that replaced files removes the old ones and adds
the new one in the same snapshot (an overwrite), so a reader never sees a key twice. The diff makes it
idempotent: a resume after a kill between writing files and committing them commits them once; a wave already
committed adds nothing. Snapshot properties (`pagemill.tenant`, `pagemill.run_id`, `pagemill.wave`,
`pagemill.action`) say which run and wave a snapshot holds. Commits that lose a race with another writer
(another tenant's run on the same catalog) are retried on the reloaded table.
"""
from __future__ import annotations

import logging
import os
import random
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from schemas import layout, tables

log = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "pagemill"
# A SQL catalog keys its tables by the catalog's name too: a reader opens it under this name.
CATALOG_NAME = "pagemill"
# `--catalog sqlite`: an embedded SQL catalog in a file under a local output root (nothing to start).
EMBEDDED = "sqlite"
EMBEDDED_FILE = "catalog.db"
WAREHOUSE = "iceberg"  # where the catalog writes its metadata files, under the output root
PROPERTY = "pagemill."
COMMIT_ATTEMPTS = 20
NAMESPACE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,127}")


@dataclass(frozen=True)
class CatalogConfig:
    """Which catalog, which namespace, and the catalog's extra properties (a REST catalog's token, ...)."""

    uri: str
    namespace: str = DEFAULT_NAMESPACE
    properties: tuple[tuple[str, str], ...] = ()


def catalog_config(uri: str | None, namespace: str | None = None,
                   properties: Sequence[str] | None = None) -> CatalogConfig | None:
    """Pure: the options' catalog (None without `--catalog`); `properties` are `KEY=VALUE` strings."""
    if not uri:
        return None
    pairs = tuple(tuple(p.split("=", 1)) for p in properties or () if "=" in p[1:])
    return CatalogConfig(uri=uri, namespace=namespace or DEFAULT_NAMESPACE, properties=pairs)  # type: ignore[arg-type]


def catalog_problems(uri: str | None, output: str, properties: Sequence[str] = (),
                     namespace: str | None = None) -> list[str]:
    """Pure: why `--catalog URI` (with `--catalog-property KEY=VALUE`s, `--catalog-namespace`) cannot be used
    with `output`."""
    if not uri:
        return []
    problems = [f"--catalog-property {p!r}: expected KEY=VALUE" for p in properties if "=" not in p[1:]]
    if namespace is not None and not NAMESPACE.fullmatch(namespace):
        problems.append(f"--catalog-namespace {namespace!r}: letters, digits and '_', starting with a letter")
    if uri == EMBEDDED:
        if "://" in output and not output.startswith("file://"):
            problems.append(f"--catalog {EMBEDDED}: the embedded catalog is a file under a local output root, and "
                            f"--output {output} is object storage; give a catalog URI (postgresql://..., "
                            "https://... for a REST catalog)")
        return problems
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    if not scheme:
        problems.append(f"--catalog {uri!r}: expected '{EMBEDDED}', a SQLAlchemy URI (sqlite:///FILE, "
                        "postgresql+psycopg2://...) or a REST catalog's http(s):// URI")
    return problems


def catalog_kind(uri: str) -> str:
    """Pure: pyiceberg's catalog type for a URI: `rest` for http(s), else `sql` (any SQLAlchemy URI)."""
    return "rest" if uri.startswith(("http://", "https://")) else "sql"


def _local(output: str) -> bool:
    return "://" not in output or output.startswith("file://")


def data_path(path: str) -> str:
    """Pure: a part file's path as the catalog records it: absolute for a local file, the URI otherwise."""
    return os.path.abspath(path.removeprefix("file://")) if _local(path) else path


def catalog_properties(config: CatalogConfig, output: str, storage: Any = None) -> dict[str, str]:
    """Pure: pyiceberg's properties for the catalog: its type and URI, the warehouse under the output root
    (metadata files only: data files stay where pagemill wrote them), and S3 settings for object storage."""
    uri = config.uri
    if uri == EMBEDDED:
        uri = f"sqlite:///{data_path(layout.join_uri(output, EMBEDDED_FILE))}"
    root = data_path(output)
    warehouse = f"file://{layout.join_uri(root, WAREHOUSE)}" if _local(output) else layout.join_uri(root, WAREHOUSE)
    props = {"type": catalog_kind(uri), "uri": uri, "warehouse": warehouse}
    if storage is not None:
        for key, value in (("s3.endpoint", storage.s3_endpoint_url), ("s3.region", storage.s3_region),
                           ("s3.access-key-id", storage.s3_access_key_id),
                           ("s3.secret-access-key", storage.s3_secret_access_key),
                           ("s3.session-token", storage.s3_session_token)):
            if value:
                props[key] = value
    props.update(dict(config.properties))  # the user's word wins (a REST catalog's own warehouse, say)
    return props


def open_catalog(config: CatalogConfig, output: str, storage: Any = None, create: bool = True) -> Any:
    """The catalog; with `create` (a run), the embedded catalog's file and the namespace are made when missing.
    A reader (`create=False`) makes nothing: a missing embedded catalog is a ValueError that says so."""
    from pyiceberg.catalog import load_catalog

    if config.uri == EMBEDDED and _local(output):
        if create:
            os.makedirs(data_path(output), exist_ok=True)
        elif not os.path.exists(data_path(layout.join_uri(output, EMBEDDED_FILE))):
            raise ValueError(f"--catalog {EMBEDDED}: no catalog under {output} (a run with --catalog makes it)")
    props = catalog_properties(config, output, storage)
    # A SQL catalog makes its own tables when it opens a new database: two runs opening it at once race there too.
    catalog = made_once(lambda: load_catalog(CATALOG_NAME, **props), "the catalog's tables")
    if create:
        # Two runs opening a new catalog at once both may make the namespace.
        made_once(lambda: catalog.create_namespace_if_not_exists(config.namespace), f"namespace {config.namespace}")
    return catalog


def backoff_s(attempt: int) -> float:
    """How long a writer that lost a race waits before its next attempt: doubling from 50 ms to 2 s, jittered."""
    return min(2.0, 0.05 * 2 ** attempt) * (0.5 + random.random())


def made_once(make: Any, what: str) -> Any:
    """`make()` (an if-not-exists creation), tolerant of a lost race: two writers that both see a thing missing
    both insert it, and the SQL catalog fails the second (IntegrityError, or SQLite's `database is locked`)
    where an if-not-exists call should have found it made. Trying again finds it."""
    for attempt in range(COMMIT_ATTEMPTS):
        try:
            return make()
        except _sql_lost_race() as err:
            log.info("iceberg: making %s retried (%s)", what, type(err).__name__)
            time.sleep(backoff_s(attempt))
    raise RuntimeError(f"iceberg: {what} could not be made after {COMMIT_ATTEMPTS} attempts")


def existing_table(catalog: Any, namespace: str, table: str) -> Any:
    """The table, or None when no run has committed it yet (a reader creates nothing)."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        return catalog.load_table(f"{namespace}.{table}")
    except (NoSuchTableError, NoSuchNamespaceError):
        return None


def iceberg_schema(arrow: pa.Schema) -> Any:
    """An Arrow schema as an Iceberg schema with field ids (1, 2, ... in column order)."""
    from pyiceberg.catalog import Catalog
    from pyiceberg.schema import assign_fresh_schema_ids

    return assign_fresh_schema_ids(Catalog._convert_schema_if_needed(arrow))


def partition_spec_of(schema: Any) -> Any:
    """The partitioning of every pagemill table in the catalog: identity on tenant, then run_id."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    fields = [PartitionField(source_id=schema.find_field(name).field_id, field_id=1000 + i,
                             transform=IdentityTransform(), name=name) for i, name in enumerate(("tenant", "run_id"))]
    return PartitionSpec(*fields)


def table_for(catalog: Any, namespace: str, table: str) -> Any:
    """The Iceberg table of one pagemill table: created (partitioned by tenant and run id) when missing, and
    evolved to the current columns when an older pagemill made it (columns are added, never dropped)."""
    from pyiceberg.exceptions import CommitFailedException

    arrow = tables.SCHEMAS[table]
    ident = f"{namespace}.{table}"
    schema = iceberg_schema(arrow)
    found = made_once(lambda: catalog.create_table_if_not_exists(ident, schema=schema,
                                                                 partition_spec=partition_spec_of(schema)),
                      f"table {ident}")
    missing = [n for n in arrow.names if n not in {f.name for f in found.schema().fields}]
    for _ in range(COMMIT_ATTEMPTS):
        if not missing:
            return found
        try:
            with found.update_schema() as update:
                update.union_by_name(arrow)
            log.info("iceberg: %s gained the columns %s", ident, ", ".join(missing))
            return catalog.load_table(ident)
        except CommitFailedException:  # another writer evolved or committed it first: look again
            found = catalog.load_table(ident)
            missing = [n for n in arrow.names if n not in {f.name for f in found.schema().fields}]
    raise RuntimeError(f"iceberg: could not evolve {ident} after {COMMIT_ATTEMPTS} attempts")


def _partition_filter(tenant: str, run_id: str) -> Any:
    from pyiceberg.expressions import And, EqualTo

    return And(EqualTo("tenant", tenant), EqualTo("run_id", run_id))


def committed_files(tbl: Any, tenant: str, run_id: str) -> dict[str, Any]:
    """The data files that the table's current snapshot holds for one (tenant, run id): path -> DataFile."""
    if tbl.current_snapshot() is None:
        return {}
    return {task.file.file_path: task.file for task in tbl.scan(row_filter=_partition_filter(tenant, run_id))
            .plan_files()}


def file_diff(on_disk: Sequence[str], committed: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """Pure: (files to add, committed files to remove) that make the commit equal what is on disk."""
    disk = {data_path(p) for p in on_disk}
    return sorted(disk - set(committed)), sorted(set(committed) - disk)


def snapshot_properties(tenant: str, run_id: str, action: str, wave: int | None) -> dict[str, str]:
    props = {f"{PROPERTY}tenant": tenant, f"{PROPERTY}run_id": run_id, f"{PROPERTY}action": action}
    if wave is not None:
        props[f"{PROPERTY}wave"] = str(wave)
    return props


def sync(catalog: Any, namespace: str, table: str, tenant: str, run_id: str, on_disk: Sequence[str],
         action: str, wave: int | None = None) -> int | None:
    """Make the table's committed files of (tenant, run id) equal `on_disk`, in one snapshot: an append when
    files only arrive, an overwrite when some go (a compaction's replacement). Returns the new snapshot's id,
    or None when the catalog already held exactly these files (nothing to commit: idempotent). A commit that
    lost a race with another writer is retried on the reloaded table."""
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.io.pyarrow import parquet_file_to_data_file

    tbl = table_for(catalog, namespace, table)
    props = snapshot_properties(tenant, run_id, action, wave)
    for attempt in range(COMMIT_ATTEMPTS):
        committed = committed_files(tbl, tenant, run_id)
        added, removed = file_diff(on_disk, committed)
        if not added and not removed:
            return None
        try:
            with tbl.transaction() as tx:
                if tx.table_metadata.name_mapping() is None:  # how the Parquet files' columns map to fields
                    tx.set_properties(**{"schema.name-mapping.default":
                                         tx.table_metadata.schema().name_mapping.model_dump_json()})
                update = tx.update_snapshot(snapshot_properties=props)
                with (update.overwrite() if removed else update.fast_append()) as snap:
                    for path in removed:
                        snap.delete_data_file(committed[path])
                    for path in added:
                        snap.append_data_file(parquet_file_to_data_file(tbl.io, tx.table_metadata, path))
            return catalog.load_table(f"{namespace}.{table}").current_snapshot().snapshot_id
        except (CommitFailedException, _sql_busy()) as err:
            time.sleep(backoff_s(attempt))
            log.info("iceberg: %s commit retried (%s)", table, type(err).__name__)
            tbl = catalog.load_table(f"{namespace}.{table}")
    raise RuntimeError(f"iceberg: {namespace}.{table} could not be committed after {COMMIT_ATTEMPTS} attempts "
                       "(other writers kept committing first)")


def _sql_busy() -> type[BaseException]:
    """SQLite's `database is locked` under two writers: a lost race like any other."""
    try:
        from sqlalchemy.exc import OperationalError
    except ImportError:  # pragma: no cover - a REST-only install
        return CommitRetry
    return OperationalError


def _sql_lost_race() -> tuple[type[BaseException], ...]:
    """What a SQL catalog raises to the second of two writers inserting the same row."""
    try:
        from sqlalchemy.exc import IntegrityError
    except ImportError:  # pragma: no cover - a REST-only install
        return (CommitRetry,)
    return (IntegrityError, _sql_busy())


class CommitRetry(Exception):
    """Placeholder for a catalog kind without a busy error of its own."""


def sync_run(config: CatalogConfig, output: str, storage: Any, tenant: str, run_id: str,
             files: Mapping[str, Sequence[str]], action: str, wave: int | None = None) -> dict[str, int | None]:
    """`sync` for each table in `files` (table -> the run's part files on disk); the snapshot id per table."""
    catalog = open_catalog(config, output, storage)
    return {table: sync(catalog, config.namespace, table, tenant, run_id, paths, action, wave)
            for table, paths in files.items()}


def committed_waves(catalog: Any, namespace: str, table: str, tenant: str, run_id: str) -> set[int]:
    """The waves of (tenant, run id) that a snapshot of the table committed (its properties say so)."""
    tbl = table_for(catalog, namespace, table)
    waves = set()
    for snap in tbl.snapshots():
        props = snap.summary.additional_properties if snap.summary else {}
        if props.get(f"{PROPERTY}tenant") == tenant and props.get(f"{PROPERTY}run_id") == run_id \
                and f"{PROPERTY}wave" in props:
            waves.add(int(props[f"{PROPERTY}wave"]))
    return waves


def pinned_time(catalog: Any, namespace: str, snapshot_id: int) -> int:
    """`--snapshot ID`: the commit time (ms) of that snapshot, whichever of the tables it belongs to; every
    table is then read as it was at that moment, so the three agree (a wave commits them one after another)."""
    for table in tables.TABLES:
        tbl = existing_table(catalog, namespace, table)
        snap = tbl.snapshot_by_id(snapshot_id) if tbl is not None else None
        if snap is not None:
            return int(snap.timestamp_ms)
    raise ValueError(f"--snapshot {snapshot_id}: no table of namespace {namespace!r} has such a snapshot")


def snapshot_at(tbl: Any, timestamp_ms: int) -> int | None:
    """Pure over the table's history: the id of its last snapshot committed at or before `timestamp_ms`."""
    found = [s for s in tbl.snapshots() if s.timestamp_ms <= timestamp_ms]
    return max(found, key=lambda s: (s.timestamp_ms, s.sequence_number or 0)).snapshot_id if found else None


def read_table(catalog: Any, namespace: str, table: str, tenant: str | None = None,
               as_of_ms: int | None = None) -> pa.Table:
    """The committed rows of one table (`tenant`'s only, when given), as of `as_of_ms` (`pinned_time`) or
    now, in pagemill's own Arrow schema (a column an older snapshot lacks reads as null)."""
    from pyiceberg.expressions import AlwaysTrue, EqualTo

    schema = tables.SCHEMAS[table]
    tbl = existing_table(catalog, namespace, table)
    if tbl is None:
        return pa.Table.from_batches([], schema=schema)
    snapshot_id = snapshot_at(tbl, as_of_ms) if as_of_ms is not None else \
        (tbl.current_snapshot().snapshot_id if tbl.current_snapshot() else None)
    if snapshot_id is None:
        return pa.Table.from_batches([], schema=schema)
    found = tbl.scan(row_filter=EqualTo("tenant", tenant) if tenant else AlwaysTrue(),
                     snapshot_id=snapshot_id).to_arrow()
    columns = [found.column(n).cast(f.type) if n in found.column_names else pa.nulls(found.num_rows, f.type)
               for n, f in zip(schema.names, schema, strict=True)]
    return pa.Table.from_arrays(columns, schema=schema)
