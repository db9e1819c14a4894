"""The report's timeline of one run: pages leaving the CPU stages and results coming back, per second."""
from __future__ import annotations

import duckdb

from pipelines.report import timeline


def test_timeline_counts_every_page_once_in_its_slice() -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE pages (run_id TEXT, rendered_at TIMESTAMPTZ, extracted_at TIMESTAMPTZ)")
    # Ten pages rendered one a second from t=0; each extracted 5 s after it was rendered; one never was.
    for i in range(10):
        extracted = f"TIMESTAMPTZ '2026-01-01 00:00:00+00' + INTERVAL {i + 5} SECOND" if i else "NULL"
        con.execute(f"INSERT INTO pages VALUES ('r', TIMESTAMPTZ '2026-01-01 00:00:00+00' + INTERVAL {i} SECOND, "
                    f"{extracted})")
    con.execute("INSERT INTO pages VALUES ('other', now(), now())")
    bins = timeline(con, "r", bins=7)  # span 14 s: 2 s a slice
    assert [b["t"] for b in bins] == [0, 2, 4, 6, 8, 10, 12]
    assert sum(b["rendered"] * 2 for b in bins) == 10 and sum(b["extracted"] * 2 for b in bins) == 9
    # Rendering is over by 10 s; results start at 6 s: the slices in between have both.
    assert bins[0]["extracted"] == 0 and bins[-1]["rendered"] == 0
    assert any(b["rendered"] and b["extracted"] for b in bins)
    assert timeline(con, "missing") == []
