"""`kept_row.rank_sql`: the kept-row rule as one sortable SQL value, which the typed views' evidence columns pick
with `arg_max`. Random rows (seeded): every ending, created_at and attempt_seq set or null; the row DuckDB's
`arg_max_null` picks per key is the one `keep` (the rule compaction applies) keeps."""
from __future__ import annotations

import datetime as dt
import itertools
import random

import duckdb
import pyarrow as pa
import pytest

from schemas.kept_row import keep, rank_sql


@pytest.mark.parametrize("table", ["evidence", "pages", "ledger"])
def test_arg_max_of_rank_sql_picks_the_kept_row(table: str) -> None:
    rng = random.Random(46)
    column, endings = {"evidence": ("status", ["ok", "cached", "failed", "invalid", None]),
                       "pages": ("status", ["ok", "cached", "failed", None]),
                       "ledger": ("route", ["model", "cache", "failed", None])}[table]
    starts = [None, dt.datetime(2026, 12, 1, tzinfo=dt.UTC), dt.datetime(2026, 12, 2, tzinfo=dt.UTC)]
    rows = []
    for key in range(200):
        for n, (created, seq) in enumerate(rng.sample(list(itertools.product(starts, [None, 0, 1, 7])),
                                                       rng.randint(1, 5))):  # distinct attempts: no ties
            rows.append({"key": key, column: rng.choice(endings), "created_at": created, "attempt_seq": seq,
                         "name": f"{key}/{n}"})
    data = pa.Table.from_pylist(rows, schema=pa.schema([("key", pa.int64()), (column, pa.string()),
                                                         ("created_at", pa.timestamp("us", tz="UTC")),
                                                         ("attempt_seq", pa.int64()), ("name", pa.string())]))
    con = duckdb.connect()
    con.register("t", data)
    picked = dict(con.execute(f"SELECT key, arg_max_null(name, {rank_sql(table)}) FROM t GROUP BY key").fetchall())
    expected = {key: keep(table, list(group))["name"] for key, group in
                itertools.groupby(rows, key=lambda r: r["key"])}
    assert picked == expected
    assert len({r["name"] for r in rows}) > len(expected)  # keys had several rows to choose from
