"""A run's partitions under the output root (schemas/layout.py): which files and tenants are there,
`--force`'s clearing, the compaction of a resumed run, and the one line that says why a run failed."""
from __future__ import annotations

import errno
import os
import re
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from schemas import kept_row, layout, tables
from transforms.output.write import write_rows


def _matches(pattern: str) -> list[str]:
    return sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)


def _root(output: str) -> str:
    """`output`, once it is known to be a path and not a pattern (layout.root_problems): every pattern below
    is built on it, so a wildcard in it would list, merge or delete other roots' files."""
    problems = layout.root_problems(output)
    if problems:
        raise ValueError(problems[0])
    return output


def run_files(output: str, table: str, tenant: str, run_id: str) -> list[str]:
    """The finished part files of one run of one tenant in one table."""
    return _matches(layout.part_glob(_root(output), table, tenant, run_id))


def tenant_files(output: str, table: str, tenant: str) -> list[str]:
    """This tenant's finished part files of one table, every run (`pages`: the result cache's source)."""
    pattern = layout.part_glob(_root(output), table, tenant)
    try:
        return _matches(pattern)
    except Exception:  # noqa: BLE001 - no output yet
        return []


def run_tenants(output: str, run_id: str, tenant: str = "*") -> set[str]:
    """Tenants that have rows under this run id in any table (`tenant`: look in that tenant's folders only).
    Each tenant's run ids are its own: two tenants may hold the same one, in separate partitions."""
    found = set()
    for table in tables.TABLES:
        pattern = layout.part_glob(_root(output), table, tenant, run_id)
        try:
            paths = _matches(pattern)
        except Exception:  # noqa: BLE001 - nothing written yet
            continue
        found.update(t for t in map(layout.tenant_of, paths) if t is not None)
    return found


def clear_run(output: str, tenant: str, run_id: str) -> int:
    """Delete this run's partitions (`--force` over an existing run id starts it afresh)."""
    removed = 0
    for table in tables.TABLES:
        matches = _matches(layout.join_uri(layout.partition(_root(output), table, tenant, run_id), "*"))
        if matches:
            FileSystems.delete(matches)
            removed += len(matches)
    return removed


def compact_run(output: str, tenant: str, run_id: str, only: list[str] | None = None) -> dict[str, int]:
    """Rewrite a run's partitions (`only` these tables) with one row per key, kept by schemas/kept_row.py's
    rule (the ledger's with every attempt's spend), and delete the old files, so no (run, document, page)
    ever has two rows. The new file is written before the old ones go. Files written before a column was
    added read it as null (the schema fills it)."""
    kept: dict[str, int] = {}
    for table in tables.TABLES if only is None else only:
        files = run_files(output, table, tenant, run_id)
        if len(files) >= 2:
            kept[table] = compact_files(output, table, tenant, run_id, files, "part-compacted-")
    return kept


def compact_files(output: str, table: str, tenant: str, run_id: str, files: list[str], prefix: str) -> int:
    """`files` of one run partition as one file `<prefix><uuid>.parquet` of one row per key (kept by the rule);
    the new file is written before the old ones go. Returns the rows kept."""
    schema = tables.SCHEMAS[table]
    by_key: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in read_rows(files, table):
        by_key.setdefault(tuple(row[k] for k in layout.TABLE_KEYS[table]), []).append(row)
    rows = [kept_row.keep(table, same) for same in by_key.values()]
    write_rows(layout.partition(output, table, tenant, run_id), schema, rows,
               name=f"{prefix}{uuid.uuid4().hex}{layout.PART_SUFFIX}")
    FileSystems.delete(files)
    return len(rows)


def read_rows(files: list[str], table: str) -> list[dict[str, Any]]:
    """Every row of `files`, in the table's schema (a column a file predates reads as null)."""
    rows: list[dict[str, Any]] = []
    for path in files:
        with FileSystems.open(path) as handle:
            rows += pq.read_table(pa.BufferReader(handle.read()), schema=tables.SCHEMAS[table]).to_pylist()
    return rows


def key_problems(rows: list[dict[str, Any]], table: str, identity: str | None) -> tuple[bool, int]:
    """Pure: (whether some key has two rows, how many keys have rows that name different `identity` values:
    contradictions, which are kept as they are, the evidence of an error)."""
    seen: dict[tuple[Any, ...], set[Any]] = {}
    twice = False
    for row in rows:
        key = tuple(row[k] for k in layout.TABLE_KEYS[table])
        twice = twice or key in seen
        values = seen.setdefault(key, set())
        if identity and row.get(identity) is not None:
            values.add(row[identity])
    return twice, sum(1 for v in seen.values() if len(v) > 1)


def run_failure(err: BaseException) -> str:
    """One line for a run that failed: what went wrong at its root, in words. Pure. Runners wrap a
    DoFn's exception (in-process as its __cause__, across processes only as text), so both are read."""
    chain: list[BaseException] = []
    seen: BaseException | None = err
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    for exc in chain:
        if isinstance(exc, OSError) and exc.errno in _STORAGE_ERRNOS:
            where = f" ({exc.filename})" if exc.filename else ""
            return f"{_STORAGE_ERRNOS[exc.errno]}{where}"
    text = " ".join(str(e) for e in chain)
    for code, words in _STORAGE_ERRNOS.items():
        if f"[Errno {code}]" in text or os.strerror(code) in text:
            return words
    root = chain[-1]
    raised = _RAISED.findall(str(root)) if _TRACEBACK in str(root) else []
    if raised:  # a worker process's traceback as text: its last exception line says what happened
        return raised[-1].strip()[:300]
    first = (str(root).strip().splitlines() or [""])[0]
    return f"{type(root).__name__}: {first}"[:300]


_TRACEBACK = "Traceback (most recent call last)"
_RAISED = re.compile(r"^\s*((?:\w+\.)*\w*(?:Error|Exception|Exit|Interrupt)\b.*)$", re.MULTILINE)

_STORAGE_ERRNOS = {errno.ENOSPC: "no space left on the output's storage",
                   errno.EDQUOT: "the output's storage quota is exhausted",
                   errno.EROFS: "the output's storage is read-only"}
