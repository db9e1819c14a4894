"""`pagemill expire`: a catalog's old snapshots expired, and the files no snapshot names any more deleted.

With `--catalog`, a compaction commits its replacement and keeps the files it replaced (a reader pinned to an
earlier snapshot, or one that planned its scan a moment before, still reads them; transforms/store/compaction.py
names them in a `.replaces.json` beside the new file, and every listing leaves them out). This command is where
they go: each table's snapshots older than `--older-than-days` (never the current one) are expired through
pyiceberg, then every replaced part file that no remaining snapshot names is deleted (its `.replaces.json` once
all of its files are gone), and so are the table's metadata files that nothing remaining points to (the manifest
lists and manifests of expired snapshots, metadata files left by a lost race) when they are older than the cutoff
too (a writer's newest files are never touched). A part file that was never replaced is never deleted here."""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

import pyarrow.fs as pafs

from pipelines.config.storage import StorageConfig, arrow_filesystem
from pipelines.tables import sql
from schemas import layout, tables
from transforms.store import iceberg
from transforms.store.catalog import WAREHOUSE, CatalogConfig, data_path
from transforms.store.files import replaced_files

DAY_MS = 86_400_000


def expire(config: CatalogConfig, output: str, storage: StorageConfig | None, older_than_ms: int,
           dry_run: bool = False) -> dict[str, dict[str, int]]:
    """Per table: snapshots expired, replaced part files deleted, metadata files deleted (counted, not done,
    with `dry_run`). `older_than_ms`: an epoch time; snapshots and orphans older than it go."""
    storage = storage or StorageConfig()
    catalog = iceberg.open_catalog(config, output, storage, create=False)
    fs, root = arrow_filesystem(output, storage)
    done: dict[str, dict[str, int]] = {}
    for table in tables.TABLES:
        tbl = iceberg.existing_table(catalog, config.namespace, table)
        if tbl is None:
            continue
        current = tbl.current_snapshot()
        old = [s.snapshot_id for s in tbl.snapshots()
               if s.timestamp_ms < older_than_ms and (current is None or s.snapshot_id != current.snapshot_id)]
        if old and not dry_run:
            tbl.maintenance.expire_snapshots().by_ids(old).commit()
            tbl = catalog.load_table(f"{config.namespace}.{table}")
        kept = [s for s in tbl.snapshots() if s.snapshot_id not in old]  # (a dry run has not expired them)
        named = {task.file.file_path for s in kept for task in tbl.scan(snapshot_id=s.snapshot_id).plan_files()}
        parts = 0
        for sidecar, replaced in replaced_files(fs, root, table).items():
            unnamed = [p for p in replaced if _catalog_path(output, p) not in named]
            parts += len(unnamed)
            if not dry_run:
                for path in unnamed:
                    fs.delete_file(path)
                if len(unnamed) == len(replaced):  # nothing of it is left to hide: the sidecar goes too
                    fs.delete_file(sidecar)
        orphans = _metadata_orphans(tbl, kept, fs, root, output, older_than_ms)
        if not dry_run:
            for path in orphans:
                fs.delete_file(path)
        done[table] = {"snapshots": len(old), "replaced_files": parts, "metadata_files": len(orphans)}
    return done


def _catalog_path(output: str, fs_path: str) -> str:
    """A path of the output's filesystem as the catalog records a data file (iceberg.data_path)."""
    return f"s3://{fs_path}" if output.startswith("s3://") else data_path(fs_path)


def _metadata_orphans(tbl: Any, kept: list[Any], fs: pafs.FileSystem, root: str, output: str,
                      older_than_ms: int) -> list[str]:
    """The table's metadata files (under the output's warehouse only) that no remaining snapshot, the current
    metadata or its log names, older than the cutoff."""
    location = tbl.metadata.location.rstrip("/")
    warehouse = layout.join_uri(data_path(output) if not output.startswith("s3://") else output, WAREHOUSE)
    local = location.removeprefix("file://")
    if not local.startswith(warehouse.rstrip("/") + "/"):
        return []  # a REST catalog's own storage: its maintenance is the server's
    folder = layout.join_uri(root, WAREHOUSE, local[len(warehouse.rstrip("/")) + 1:], "metadata")
    named = {tbl.metadata_location, *(entry.metadata_file for entry in tbl.metadata.metadata_log)}
    for snap in kept:
        named.add(snap.manifest_list)
        named.update(m.manifest_path for m in snap.manifests(tbl.io))
    named = {n.removeprefix("file://").removeprefix("s3://") for n in named}
    infos = fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    return sorted(i.path for i in infos if i.type == pafs.FileType.File and i.path not in named
                  and i.mtime_ns is not None and i.mtime_ns // 1_000_000 < older_than_ms)


def command(argv: Sequence[str]) -> int:
    from pipelines.config.storage import add_storage_args, storage_from

    parser = argparse.ArgumentParser(prog="pagemill expire", description="Expire a catalog's old snapshots and "
                                     "delete the files that no remaining snapshot names (docs/lakehouse.md).")
    parser.add_argument("--output", required=True, help="output root that `pagemill run --catalog` wrote")
    parser.add_argument("--older-than-days", type=float, default=7.0,
                        help="expire snapshots older than this (the current one never); default 7")
    parser.add_argument("--dry-run", action="store_true", help="say what would go, delete nothing")
    sql.add_catalog_args(parser)
    add_storage_args(parser)
    args = parser.parse_args(argv)
    if not args.catalog:
        print("pagemill expire: --catalog is required (without one, a compaction deletes what it replaced)",
              file=sys.stderr)
        return 2
    if args.older_than_days < 0:
        print("pagemill expire: --older-than-days is negative", file=sys.stderr)
        return 2
    try:
        source = sql.TableSource.from_args(args)
        cutoff = int(time.time() * 1000 - args.older_than_days * DAY_MS)
        done = expire(source.catalog, args.output, storage_from(vars(args)), cutoff, args.dry_run)
    except ValueError as err:  # CatalogRefused too: a usage error
        print(f"pagemill expire: {err}", file=sys.stderr)
        return 2
    verb = "would expire" if args.dry_run else "expired"
    for table, n in done.items():
        print(f"{table}: {verb} {n['snapshots']} snapshot(s); replaced part files deleted: {n['replaced_files']}; "
              f"metadata files deleted: {n['metadata_files']}")
    return 0
