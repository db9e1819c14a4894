"""Exactly once under retries: every run ends with one row per key, resumed or not.

A runner that retries a bundle after its writer flushed (Dataflow, Flink and Spark do, on preemption or a
lost worker) writes that bundle's rows again; a resumed run writes a `cached` copy of the pages its killed
attempt finished. Both are superseded by design: the run's tables that hold a key twice are compacted to one
row per key by schemas/kept_row.py's rule (a row that did the work beats a cached copy, which beats a failed
row; then the later attempt; the ledger's kept row sums every attempt's spend), in
transforms/store/compaction.py compact_run, and the manifest counts the rows removed as `retried_rows`. Only a
real contradiction fails the run (exit 1): two rows of one key that name different content, a `documents` key
with two `doc_sha256` or a `pages` key with two `page_hash` (the object changed under the run, or a bug); those
keys are reported in the manifest's `errors` and their table's rows stay as they are. The ledger has no content
column: its rows of a key are attempts at the page that `pages` names, so `pages` is where a contradiction
shows, and the ledger is compacted either way (the spend of both stays counted).
"""
from __future__ import annotations

from typing import Any

from schemas import layout
from transforms.store.duplicates import IDENTITY


def raw_rows(counts: dict[str, Any]) -> dict[str, int]:
    """Pure: the raw rows of each table in run_counts' figures."""
    return {"documents": int(counts["documents"]), "pages": sum(counts["pages"].values()),
            "ledger": int(counts["totals"]["pages"])}


def contradictions(output: str, tenant: str, run_id: str, storage: Any, tables: list[str]) -> list[str]:
    """The keys whose rows disagree on their content (IDENTITY), one line per table."""
    from pipelines.tables import sql

    lines = []
    con = sql.connect(output, storage, tenant, typed=False)
    try:
        for table in tables:
            column = IDENTITY.get(table)
            if column is None:
                continue
            keys = ", ".join(layout.TABLE_KEYS[table])
            (n,) = con.execute(f"SELECT count(*) FROM (SELECT {keys} FROM {table}_all WHERE tenant = ? AND "
                               f"run_id = ? GROUP BY ALL HAVING count(DISTINCT {column}) > 1)",
                               [tenant, run_id]).fetchone()
            if n:
                lines.append(f"{table}: {n} key(s) whose rows name different {column} (a contradiction, "
                             "not a retry)")
    finally:
        con.close()
    return lines


def settle(output: str, tenant: str, run_id: str, storage: Any,
           keep_replaced: bool = False) -> tuple[dict[str, Any], int]:
    """The run's counts after its superseded rows are compacted away, and how many raw rows were
    (`keep_replaced`: a run with a catalog keeps the replaced files, compaction.compact_files)."""
    from pipelines.tables.manifest import run_counts
    from transforms.store import compaction  # looked up at call time: a test breaks compaction there

    counts = run_counts(output, run_id, storage, tenant)
    twice = [t for t, n in counts["duplicate_keys"].items() if n]
    if not twice:
        return counts, 0
    contradicted = contradictions(output, tenant, run_id, storage, twice)
    before = raw_rows(counts)
    # A contradiction's rows stay as they are: the evidence for the error, until someone looks.
    compaction.compact_run(output, tenant, run_id, only=[t for t in twice if not any(c.startswith(f"{t}:")
                                                                                   for c in contradicted)],
                            keep_replaced=keep_replaced)
    counts = run_counts(output, run_id, storage, tenant)
    after = raw_rows(counts)
    counts["errors"] = counts["errors"] + contradicted
    return counts, sum(before[t] - after[t] for t in before)
