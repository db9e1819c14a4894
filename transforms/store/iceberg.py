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

A file is registered under the partition its folder names, stated (never inferred from its statistics), and only
when its rows are that partition's (transforms/store/part_check.py); a reader reads only committed files whose
folder, partition and rows agree. A table not partitioned as pagemill makes it is refused (`table_problems`).
The catalog itself is opened by transforms/store/catalog.py (which classes a catalog may make pagemill run).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from schemas import layout, tables
from transforms.store import part_check
from transforms.store.catalog import CATALOG_NAME as CATALOG_NAME
from transforms.store.catalog import COMMIT_ATTEMPTS, CatalogRefused, data_path, open_catalog, sql_busy
from transforms.store.catalog import DEFAULT_NAMESPACE as DEFAULT_NAMESPACE
from transforms.store.catalog import EMBEDDED as EMBEDDED
from transforms.store.catalog import EMBEDDED_FILE as EMBEDDED_FILE
from transforms.store.catalog import WAREHOUSE as WAREHOUSE
from transforms.store.catalog import CatalogConfig as CatalogConfig
from transforms.store.catalog import backoff_s as backoff_s
from transforms.store.catalog import catalog_config as catalog_config
from transforms.store.catalog import catalog_kind as catalog_kind
from transforms.store.catalog import catalog_problems as catalog_problems
from transforms.store.catalog import made_once as made_once

log = logging.getLogger(__name__)

PROPERTY = "pagemill."
PARTITION = ("tenant", "run_id")


def existing_table(catalog: Any, namespace: str, table: str) -> Any:
    """The table, or None when no run has committed it yet (a reader creates nothing). A table that is not as
    pagemill makes it raises CatalogRefused (`table_problems`)."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        found = catalog.load_table(f"{namespace}.{table}")
    except (NoSuchTableError, NoSuchNamespaceError):
        return None
    problems = table_problems(found, table)
    if problems:
        raise CatalogRefused(f"iceberg: {namespace}.{table} is not a table pagemill made: {'; '.join(problems)} "
                             "(pagemill commits only to tables partitioned by identity(tenant), identity(run_id); "
                             "give another --catalog-namespace, or drop the table)")
    return found


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
                             transform=IdentityTransform(), name=name) for i, name in enumerate(PARTITION)]
    return PartitionSpec(*fields)


def table_problems(tbl: Any, table: str) -> list[str]:
    """Why a catalog table is not pagemill's: a partition spec (any of its specs: files committed under an older
    one keep it) other than identity(tenant), identity(run_id), or key columns missing or of another type. On
    such a table a run's files cannot be told from another run's by partition."""
    from pyiceberg.transforms import IdentityTransform

    schema, expected = tbl.schema(), iceberg_schema(tables.SCHEMAS[table])
    problems = []
    for key in dict.fromkeys([*PARTITION, *layout.TABLE_KEYS[table]]):
        found = {f.name: f for f in schema.fields}.get(key)
        want = expected.find_field(key).field_type
        if found is None:
            problems.append(f"it has no {key} column")
        elif found.field_type != want:
            problems.append(f"its {key} column is {found.field_type}, not {want}")
    if problems:
        return problems
    ids = {schema.find_field(name).field_id: name for name in PARTITION}
    for spec in tbl.specs().values():
        shape = [(ids.get(f.source_id), isinstance(f.transform, IdentityTransform)) for f in spec.fields]
        if shape != [(name, True) for name in PARTITION]:
            said = ", ".join(f"{f.transform}({schema.find_column_name(f.source_id)})" for f in spec.fields)
            problems.append(f"it is partitioned by [{said or 'nothing'}]")
            break
    return problems


def table_for(catalog: Any, namespace: str, table: str) -> Any:
    """The Iceberg table of one pagemill table: loaded, or created (partitioned by tenant and run id) when missing,
    and evolved to the current columns when an older pagemill made it (columns are added, never dropped).
    Loaded before any creation is tried: a creation writes a metadata file first, even when the table is there."""
    from pyiceberg.exceptions import CommitFailedException

    arrow = tables.SCHEMAS[table]
    ident = f"{namespace}.{table}"
    found = existing_table(catalog, namespace, table)
    if found is None:
        schema = iceberg_schema(arrow)
        made_once(lambda: catalog.create_table_if_not_exists(ident, schema=schema,
                                                             partition_spec=partition_spec_of(schema)),
                  f"table {ident}")
        found = existing_table(catalog, namespace, table)  # checked, whoever made it
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


def partition_of(data_file: Any) -> tuple[Any, ...]:
    """The (tenant, run id) a committed file was registered under (pagemill's spec: `table_problems`)."""
    return tuple(data_file.partition[i] for i in range(len(PARTITION)))


def committed_files(tbl: Any, tenant: str, run_id: str) -> dict[str, Any]:
    """The data files that the table's current snapshot holds in the partition (tenant, run id): path ->
    DataFile. Selected by the partition each file was registered under, exactly: the filter only prunes (a
    file's string statistics are cut to 16 characters, so `customer-000001-alpha` does not exclude `...-bravo`)."""
    if tbl.current_snapshot() is None:
        return {}
    tasks = tbl.scan(row_filter=_partition_filter(tenant, run_id)).plan_files()
    return {t.file.file_path: t.file for t in tasks if partition_of(t.file) == (tenant, run_id)}


def file_diff(on_disk: Sequence[str], committed: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """Pure: (files to add, committed files to remove) that make the commit equal what is on disk."""
    disk = {data_path(p) for p in on_disk}
    return sorted(disk - set(committed)), sorted(set(committed) - disk)


def snapshot_properties(tenant: str, run_id: str, action: str, wave: int | None) -> dict[str, str]:
    props = {f"{PROPERTY}tenant": tenant, f"{PROPERTY}run_id": run_id, f"{PROPERTY}action": action}
    if wave is not None:
        props[f"{PROPERTY}wave"] = str(wave)
    return props


def data_file(tbl_io: Any, metadata: Any, path: str, tenant: str, run_id: str) -> Any:
    """The DataFile that registers a part file under (tenant, run id), stated, never inferred from the file's
    statistics; from one read of its footer. A file whose rows are not (tenant, run id)'s, or not in that
    partition's folder, raises CatalogRefused (transforms/store/part_check.py)."""
    from pyiceberg.io import pyarrow as pyio
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    if part_check.folder_partition(path) != (tenant, run_id):
        raise CatalogRefused(f"{path}: not in the folder of tenant {tenant}, run {run_id}")
    source = tbl_io.new_input(path)
    with source.open() as stream:
        parquet = pq.ParquetFile(stream)
        problem = part_check.rows_problem(parquet, tenant, run_id)
        footer = parquet.metadata
    if problem:
        part_check.warn(path, problem)
        raise CatalogRefused(f"{path}: {problem}")
    schema = metadata.schema()
    pyio._check_pyarrow_schema_compatible(schema, footer.schema.to_arrow_schema(),
                                          format_version=metadata.format_version)
    stats = pyio.data_file_statistics_from_parquet_metadata(
        parquet_metadata=footer, stats_columns=pyio.compute_statistics_plan(schema, metadata.properties),
        parquet_column_mapping=pyio.parquet_path_to_id_mapping(schema))
    return DataFile.from_args(content=DataFileContent.DATA, file_path=path, file_format=FileFormat.PARQUET,
                              partition=Record(tenant, run_id), file_size_in_bytes=len(source), sort_order_id=None,
                              spec_id=metadata.default_spec_id, equality_ids=None, key_metadata=None,
                              **stats.to_serialized_dict())


def sync(catalog: Any, namespace: str, table: str, tenant: str, run_id: str, on_disk: Sequence[str],
         action: str, wave: int | None = None) -> int | None:
    """Make the table's committed files of (tenant, run id) equal `on_disk`, in one snapshot: an append when
    files only arrive, an overwrite when some go (a compaction's replacement). Returns the new snapshot's id,
    or None when the catalog already held exactly these files (nothing to commit: idempotent). A commit that
    lost a race with another writer is retried on the reloaded table. A file of `on_disk` whose rows are not
    the partition's raises CatalogRefused and nothing is committed (transforms/store/files.py lists none)."""
    from pyiceberg.exceptions import CommitFailedException

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
                        snap.append_data_file(data_file(tbl.io, tx.table_metadata, path, tenant, run_id))
            return catalog.load_table(f"{namespace}.{table}").current_snapshot().snapshot_id
        except (CommitFailedException, sql_busy()) as err:
            time.sleep(backoff_s(attempt))
            log.info("iceberg: %s commit retried (%s)", table, type(err).__name__)
            tbl = catalog.load_table(f"{namespace}.{table}")
    raise RuntimeError(f"iceberg: {namespace}.{table} could not be committed after {COMMIT_ATTEMPTS} attempts "
                       "(other writers kept committing first)")


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
    now, in pagemill's own Arrow schema (a column an older snapshot lacks reads as null). A committed file whose
    folder is not the partition it was registered under, or whose rows are not (rewritten since its commit, say),
    is left out with a warning (transforms/store/part_check.py)."""
    from pyiceberg.expressions import AlwaysTrue, EqualTo
    from pyiceberg.io.pyarrow import ArrowScan

    schema = tables.SCHEMAS[table]
    tbl = existing_table(catalog, namespace, table)
    if tbl is None:
        return pa.Table.from_batches([], schema=schema)
    snapshot_id = snapshot_at(tbl, as_of_ms) if as_of_ms is not None else \
        (tbl.current_snapshot().snapshot_id if tbl.current_snapshot() else None)
    if snapshot_id is None:
        return pa.Table.from_batches([], schema=schema)
    scan = tbl.scan(row_filter=EqualTo("tenant", tenant) if tenant else AlwaysTrue(), snapshot_id=snapshot_id)
    tasks = [t for t in scan.plan_files() if _committed_file_problem(tbl.io, t.file) is None]
    found = ArrowScan(tbl.metadata, tbl.io, scan.projection(), scan.row_filter).to_table(tasks)
    columns = [found.column(n).cast(f.type) if n in found.column_names else pa.nulls(found.num_rows, f.type)
               for n, f in zip(schema.names, schema, strict=True)]
    return pa.Table.from_arrays(columns, schema=schema)


def _committed_file_problem(io: Any, committed: Any) -> str | None:
    """Why a committed file's rows are not shown (warned), or None."""
    path, registered = committed.file_path, partition_of(committed)
    folder = part_check.folder_partition(path)
    problem = f"it lies in the folder of {folder} and was committed as partition {registered}" \
        if folder != registered else part_check.file_problem(path, lambda: io.new_input(path).open())
    if problem is not None:
        part_check.warn(path, problem)
    return problem
