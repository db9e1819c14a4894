"""A part file belongs to the folder it lies in: its `tenant` and `run_id` columns hold one value each, the values
its `tenant=<t>/run_id=<r>/` folders name. A file that disagrees (planted in a tenant's own prefix with another
tenant's rows, say) is refused: never committed to a catalog, never read by `pagemill sql`, a report or an export,
never compacted into a run's rows. Folders are the trust boundary (a tenant writes only under its own prefix);
a file's contents and its footer are what whoever wrote the file says, so the check reads the two columns
themselves (dictionary-encoded, a few bytes a row group), never only the footer's statistics, which the file's
writer chooses too. transforms/store/files.py asks here for every listing; iceberg.py again for every commit
and every catalog read (a file may be rewritten after it was committed)."""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

log = logging.getLogger(__name__)
PARTITION_COLUMNS = ("tenant", "run_id")
CHECKS_AT_ONCE = 16
# (path, size, mtime) -> the problem (None: the file is its folder's). A part file is written once under a fresh
# name; a rewrite changes its size or time and is checked again. Keeps a run's repeated listings cheap.
_checked: dict[tuple[str, int, float], str | None] = {}
_warned: set[str] = set()


def folder_partition(path: str) -> tuple[str, str] | None:
    """Pure: the (tenant, run id) that a part file's own folders name: its parent `run_id=<r>` and that folder's
    parent `tenant=<t>` (the layout of schemas/layout.py partition), or None for a file anywhere else."""
    parts = path.rstrip("/").split("/")
    if len(parts) < 3 or not parts[-2].startswith("run_id=") or not parts[-3].startswith("tenant="):
        return None
    return parts[-3].removeprefix("tenant="), parts[-2].removeprefix("run_id=")


def rows_problem(parquet: pq.ParquetFile, tenant: str, run_id: str) -> str | None:
    """Why a Parquet file's rows are not all (tenant, run_id)'s, or None. The footer's statistics turn a file away
    without reading its columns; agreeing statistics prove nothing (the writer wrote them), so the two columns
    are read, dictionary-encoded, and every value compared."""
    names = set(parquet.schema_arrow.names)
    missing = [c for c in PARTITION_COLUMNS if c not in names]
    if missing:
        return f"it has no {' or '.join(missing)} column"
    if parquet.metadata.num_rows == 0:
        return None
    want = {"tenant": tenant, "run_id": run_id}
    said = _statistics_problem(parquet.metadata, want)
    if said:
        return said
    data = parquet.read(columns=list(PARTITION_COLUMNS), use_threads=False)
    for column in PARTITION_COLUMNS:
        values = data.column(column)
        if values.null_count:
            return f"{values.null_count} of its rows have no {column}"
        try:
            found = pc.unique(values.cast(pa.string())).to_pylist()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return f"its {column} column is not text"
        others = sorted(str(v) for v in found if v != want[column])
        if others:
            return f"its rows say {column}={', '.join(others[:3])} (its folder: {want[column]})"
    return None


def _statistics_problem(metadata: pq.FileMetaData, want: dict[str, str]) -> str | None:
    """A disagreement that the footer's statistics already show, or None (which proves nothing)."""
    schema = metadata.schema
    index = {schema.column(i).path: i for i in range(metadata.num_columns)}
    for group in range(metadata.num_row_groups):
        for column, value in want.items():
            if column not in index:
                continue
            stats = metadata.row_group(group).column(index[column]).statistics
            if stats is None or not stats.has_min_max:
                continue
            low, high = (v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
                         for v in (stats.min, stats.max))
            if low != value or high != value:
                other = low if low != value else high
                return f"its rows say {column}={other} (its folder: {value})"
    return None


def file_problem(path: str, opener: Callable[[], Any], size: int = -1, mtime: float = -1.0) -> str | None:
    """Why the part file at `path` is not its folder's, or None; `opener()` gives a seekable binary file.
    A file that cannot be read as Parquet is refused too (its rows cannot be shown as anyone's)."""
    key = (path, size, mtime)
    if size >= 0 and key in _checked:
        return _checked[key]
    folder = folder_partition(path)
    if folder is None:
        problem: str | None = "it is not in a tenant=/run_id= folder"
    else:
        try:
            with opener() as handle:
                problem = rows_problem(pq.ParquetFile(handle), *folder)
        except (OSError, pa.ArrowException) as err:
            problem = f"it cannot be read as Parquet ({type(err).__name__})"
    if size >= 0:
        _checked[key] = problem
    return problem


def warn(path: str, problem: str) -> None:
    """One warning line a file and process: the refused file, and why."""
    if path not in _warned:
        _warned.add(path)
        log.warning("pagemill: part file %s is refused: %s; its rows are not its folder's and are neither "
                    "committed nor shown", path, problem)


def misfiled(found: list[tuple[str, Callable[[], Any], int, float]]) -> dict[str, str]:
    """path -> problem, for each (path, opener, size, mtime) whose rows are not its folder's (each warned). The
    files are checked a few at a time: on object storage each check is two or three small ranged reads."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(CHECKS_AT_ONCE, max(1, len(found)))) as pool:
        problems = list(pool.map(lambda f: file_problem(*f), found))
    refused = {}
    for (path, *_), problem in zip(found, problems, strict=True):
        if problem is not None:
            warn(path, problem)
            refused[path] = problem
    return refused
