"""The report's timeline of one run: pages leaving the CPU stages and results coming back, per second."""
from __future__ import annotations

import duckdb

from pipelines.tables.report import timeline


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
    # Slice i holds [2i, 2i + 2) s, the last one its end too. Rendered at 0..9 s: two a slice up to 10 s.
    # Extracted at 6..14 s (page 0 never): 6,7 | 8,9 | 10,11 | 12,13 and 14, the span's end, in the last.
    # Per second: the counts halved.
    assert [b["rendered"] for b in bins] == [1, 1, 1, 1, 1, 0, 0]
    assert [b["extracted"] for b in bins] == [0, 0, 0, 1, 1, 1, 1.5]
    assert timeline(con, "missing") == []
