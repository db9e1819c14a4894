"""A run's partitions rewritten: `--force`'s clearing and the compaction of retried rows to one row per key, by
schemas/kept_row.py's rule (pipelines/run/retries.py for a whole run, transforms/store/commits.py for a wave)."""
from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from schemas import kept_row, layout, tables
from transforms.store.duplicates import duplicate_keys
from transforms.store.files import partition_files, run_files, sidecar_text
from transforms.store.part_names import compacted_prefix, new_stem, part_name, replaces_name
from transforms.store.write import write_rows


def clear_run(output: str, tenant: str, run_id: str) -> int:
    """Delete this run's partitions (`--force` over an existing run id starts it afresh)."""
    removed = 0
    for table in tables.TABLES:
        matches = partition_files(output, table, tenant, run_id)
        if matches:
            FileSystems.delete(matches)
            removed += len(matches)
    return removed


def compact_run(output: str, tenant: str, run_id: str, only: list[str] | None = None,
                keep_replaced: bool = False) -> dict[str, int]:
    """Rewrite a run's partitions (`only` these tables) with one row per key, kept by schemas/kept_row.py's
    rule (the ledger's with every attempt's spend), and delete the old files, so no (run, document, page)
    ever has two rows. The new file is written before the old ones go. Files written before a column was
    added read it as null (the schema fills it). `keep_replaced` (a run with a catalog): the old files stay for
    the snapshots that name them (`compact_files`)."""
    kept: dict[str, int] = {}
    for table in tables.TABLES if only is None else only:
        files = run_files(output, table, tenant, run_id)
        if len(files) >= 2:
            kept[table] = compact_files(output, table, tenant, run_id, files, compacted_prefix(None),
                                         keep_replaced)
    return kept


def compact_files(output: str, table: str, tenant: str, run_id: str, files: list[str], prefix: str,
                  keep_replaced: bool = False) -> int:
    """`files` of one run partition as one file `<prefix><uuid>.parquet` (part_names.py) of one row per key
    (kept by the rule); the new file is written before the old ones go. Returns the rows kept. With
    `keep_replaced` (a catalog's earlier snapshots may name the old files: a reader pinned to one, or one that
    planned its scan a moment ago, reads them) the old files stay and `<prefix><uuid>.replaces.json` beside the
    new one names them: every listing leaves them out from then on, and `pagemill expire` deletes them once no
    snapshot names them."""
    schema = tables.SCHEMAS[table]
    by_key: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in read_rows(files, table):
        by_key.setdefault(tuple(row[k] for k in layout.TABLE_KEYS[table]), []).append(row)
    rows = [kept_row.keep(table, same) for same in by_key.values()]
    folder, stem = layout.partition(output, table, tenant, run_id), new_stem(prefix)
    write_rows(folder, schema, rows, name=part_name(stem))
    if not keep_replaced:
        FileSystems.delete(files)
        return len(rows)
    final = layout.join_uri(folder, replaces_name(stem))  # after the new file: see files.replaced_by
    local = "://" not in final or final.startswith("file://")
    with FileSystems.create(final + ".inprogress" if local else final) as handle:  # whole, or not there
        handle.write(sidecar_text(files).encode())
    if local:
        FileSystems.rename([final + ".inprogress"], [final])
    return len(rows)


def read_rows(files: list[str], table: str, columns: list[str] | None = None) -> list[dict[str, Any]]:
    """Every row of `files` (only `columns`, when given), in the table's schema (a column a file predates reads
    as null)."""
    rows: list[dict[str, Any]] = []
    for path in files:
        with FileSystems.open(path) as handle:
            rows += pq.read_table(pa.BufferReader(handle.read()), schema=tables.SCHEMAS[table],
                                  columns=columns).to_pylist()
    return rows


def key_problems(rows: list[dict[str, Any]], table: str, identity: str | None) -> tuple[bool, int]:
    """Pure: (whether some key has two rows (transforms/store/duplicates.py's rule), how many keys have rows that
    name different `identity` values: contradictions, which are kept as they are, the evidence of an error)."""
    seen: dict[tuple[Any, ...], set[Any]] = {}
    twice = bool(duplicate_keys(rows, table))
    for row in rows:
        key = tuple(row[k] for k in layout.TABLE_KEYS[table])
        values = seen.setdefault(key, set())
        if identity and row.get(identity) is not None:
            values.add(row[identity])
    return twice, sum(1 for v in seen.values() if len(v) > 1)
