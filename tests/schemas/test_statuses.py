"""The status vocabulary: its groups use its own words, and its SQL list selects what it names."""
from __future__ import annotations

import duckdb

from schemas.statuses import MODEL_ANSWERED, OUTCOMES, PAGE_STATUSES, SUCCESS, UNSUCCESSFUL, sql_list


def test_groups_are_made_of_the_vocabulary() -> None:
    assert SUCCESS <= set(PAGE_STATUSES) and MODEL_ANSWERED <= set(PAGE_STATUSES)
    assert UNSUCCESSFUL <= set(OUTCOMES)
    assert "invalid" not in SUCCESS and "ok" in SUCCESS & MODEL_ANSWERED


def test_sql_list_selects_exactly_its_statuses() -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE pages (status VARCHAR)")
    con.executemany("INSERT INTO pages VALUES (?)", [[s] for s in PAGE_STATUSES])
    got = {r[0] for r in con.execute(f"SELECT status FROM pages WHERE status IN {sql_list(SUCCESS)}").fetchall()}
    assert got == set(SUCCESS)
    assert sql_list({"b", "a"}) == "('a', 'b')"  # sorted: the SQL text does not change between runs
