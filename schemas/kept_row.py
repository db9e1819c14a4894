"""Which row is *the* row of a key (layout.TABLE_KEYS), by one rule that a reader can be told:

    a row that did the work beats a reused (`cached`) copy, which beats a `failed` row; among equals the
    later attempt wins: the later invocation (`created_at`, its start), then the later write (`attempt_seq`,
    which the writer records), never a file name.

The ledger keeps what was spent: its kept row carries the sum of every attempt's spend (SPEND). An attempt is
one (`created_at`, `attempt_seq`): a row written twice by one attempt (a flush replayed) counts once.

One home for the rule: compaction (transforms/store/compaction.py) keeps rows with `keep`, the SQL views
(pipelines/tables/sql.py) with `view_sql`, the typed views' evidence columns with `rank_sql`; all order by the
same columns in the same way. Pure.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from schemas.layout import TABLE_KEYS
from schemas.statuses import CACHED, FAILED

ATTEMPT_SEQ = "attempt_seq"
# Per table: the column that says how a row ended, and its value for a reused copy ("failed" in all three).
# An `evidence` row carries its page's status, so its kept row is its page's attempt's.
ENDING = {"documents": "outcome", "pages": "status", "ledger": "route", "evidence": "status"}
REUSED = {"documents": CACHED, "pages": CACHED, "ledger": "cache", "evidence": CACHED}
# The ledger's spend: what every attempt cost, summed into the kept row (tokens saved by low detail too,
# so that they stay comparable with the image tokens spent).
SPEND = ("image_tokens", "text_tokens", "output_tokens", "image_tokens_saved", "cached_prompt_tokens", "attempts",
         "gpu_seconds", "cost_usd", "api_equivalent_usd")
_SQL_TYPES = {pa.int64(): "BIGINT", pa.float64(): "DOUBLE"}
# A missing created_at or attempt_seq (files written before the column) ranks below any value.
_NEVER = dt.datetime.min.replace(tzinfo=dt.UTC)


def work_rank(table: str, row: Mapping[str, Any]) -> int:
    """2: the row did the work; 1: a reused copy; 0: failed."""
    ending = row.get(ENDING[table])
    return 0 if ending == FAILED else 1 if ending == REUSED[table] else 2


def rank(table: str, row: Mapping[str, Any]) -> tuple[Any, ...]:
    """The rule as a sort key: the highest is kept. The same order as `order_sql`."""
    created, seq = row.get("created_at"), row.get(ATTEMPT_SEQ)
    return (work_rank(table, row), created is not None, created or _NEVER, seq is not None, seq or 0)


def attempt(row: Mapping[str, Any]) -> tuple[Any, Any]:
    """Which attempt wrote a row: the rows of one attempt are copies of each other."""
    return row.get("created_at"), row.get(ATTEMPT_SEQ)


def keep(table: str, rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The row of one key's rows; in the ledger, with the spend of every attempt summed into it."""
    best: dict[tuple[Any, Any], Mapping[str, Any]] = {}  # per attempt, its best row (copies are equal anyway)
    for row in rows:
        a = attempt(row)
        if a not in best or rank(table, row) > rank(table, best[a]):
            best[a] = row
    if not best:
        raise ValueError("a key has at least one row")
    kept = dict(max(best.values(), key=lambda r: rank(table, r)))
    if table == "ledger":
        kept.update({c: _total(r.get(c) for r in best.values()) for c in SPEND})
    return kept


def _total(values: Iterable[Any]) -> Any:
    """SQL's sum: nulls ignored, null when every value is."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def order_sql(table: str) -> str:
    """The rule as an ORDER BY (first row kept): the same order as `rank`."""
    ending, reused = ENDING[table], REUSED[table]
    return (f"CASE {ending} WHEN '{FAILED}' THEN 0 WHEN '{reused}' THEN 1 ELSE 2 END DESC, "
            f"created_at DESC NULLS LAST, {ATTEMPT_SEQ} DESC NULLS LAST")


def rank_sql(table: str) -> str:
    """The rule as one sortable SQL value (a STRUCT, compared field by field), for `arg_max`: the same order as
    `rank`, so the highest is the kept row (a grouped pick, cheaper than `order_sql`'s window)."""
    ending, reused = ENDING[table], REUSED[table]
    return (f"{{'work': CASE {ending} WHEN '{FAILED}' THEN 0 WHEN '{reused}' THEN 1 ELSE 2 END, "
            f"'at_known': created_at IS NOT NULL, 'at': coalesce(created_at, '{_NEVER.isoformat()}'::TIMESTAMPTZ), "
            f"'seq_known': {ATTEMPT_SEQ} IS NOT NULL, 'seq': coalesce({ATTEMPT_SEQ}, 0)}}")


def view_sql(table: str, source: str, schema: pa.Schema) -> str:
    """SELECT of the kept row per key from `source` (a table's raw rows); the ledger's with SPEND summed
    over its key's attempts, each attempt counted once."""
    keys = ", ".join(TABLE_KEYS[table])
    kept = f"QUALIFY row_number() OVER (PARTITION BY {keys} ORDER BY {order_sql(table)}) = 1"
    if table != "ledger":
        return f"SELECT * FROM {source} {kept}"
    sums = ", ".join(f"CAST(sum({c}) OVER (PARTITION BY {keys}) AS {_SQL_TYPES[schema.field(c).type]}) AS {c}"
                     for c in SPEND)
    attempts = (f"SELECT * FROM {source} QUALIFY row_number() OVER (PARTITION BY {keys}, created_at, {ATTEMPT_SEQ} "
                f"ORDER BY {order_sql(table)}) = 1")
    return f"SELECT * REPLACE ({sums}) FROM ({attempts}) {kept}"
