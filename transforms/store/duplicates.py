"""The duplicate-key rule, defined once: a key (schemas/layout.py TABLE_KEYS) with more than one raw row of a run;
and each table's identity column, on which the rows of one key must agree (else a contradiction, not a retry).

Two forms of the one rule: the SQL the manifest's `duplicate_keys` runs over a run's raw rows
(pipelines/tables/sql.py `duplicate_keys`), and the Python a wave's commit runs over the rows of its own files
(transforms/store/compaction.py `key_problems`); tests/transforms/store/test_duplicates.py holds them equal on
the same rows. Pure.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from schemas import layout

# Per table: the column whose values must agree among the rows of one key (nulls: not yet known). None for
# the ledger: it names no content (a contradiction shows in `pages`, which has the same key).
IDENTITY: dict[str, str | None] = {"documents": "doc_sha256", "pages": "page_hash", "ledger": None}

def duplicate_keys_sql(table: str, source: str) -> str:
    """SQL over `source` (the raw rows of `table`) with parameters (tenant, run id): each key of that run with
    more than one row, and how many (`n`), in order."""
    keys = ", ".join(layout.TABLE_KEYS[table])
    return (f"SELECT {keys}, count(*) AS n FROM {source} WHERE tenant = ? AND run_id = ? "
            f"GROUP BY ALL HAVING count(*) > 1 ORDER BY ALL")


def duplicate_keys(rows: Iterable[dict[str, Any]], table: str) -> list[tuple[Any, ...]]:
    """The Python form over one run's rows: each key with more than one row and how many, as the SQL form
    returns them (key values then the count, in order, a null last)."""
    counts = Counter(tuple(row[k] for k in layout.TABLE_KEYS[table]) for row in rows)
    found = [(*key, n) for key, n in counts.items() if n > 1]
    return sorted(found, key=lambda t: tuple((v is None, v) for v in t))
