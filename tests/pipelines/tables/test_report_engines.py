"""The report's line of the manifest's `engines` (one engine per device): pages, pages/s, tokens, busy, starts."""
from __future__ import annotations

from pipelines.tables.report import engine_entries, engine_line


def test_each_engine_is_shown_with_its_rate_over_the_runs_wall_time() -> None:
    engines = [{"device": "0", "pages": 1200, "output_tokens": 45000, "busy_fraction": 0.931, "starts": 1},
               {"device": "1", "pages": 300, "output_tokens": 9000, "busy_fraction": None, "starts": 2}]
    line = engine_line(engines, wall_seconds=60.0)
    assert line == ("device 0: 1,200 pages (20.00 pages/s), 45,000 output tokens, busy 93%, 1 start; "
                    "device 1: 300 pages (5.00 pages/s), 9,000 output tokens, busy unknown, 2 starts")
    assert "pages/s" not in engine_line(engines, wall_seconds=None)


def test_entries_not_of_the_shape_pagemill_writes_are_left_out() -> None:
    good = {"device": "cpu0", "pages": 3, "output_tokens": 30, "busy_fraction": 0.5, "starts": 1}
    bad = [{**good, "pages": "3"}, {**good, "device": 0}, {**good, "busy_fraction": "high"}, {**good, "starts": True},
           "cpu0", None]
    assert engine_entries([good, *bad]) == [good]
    assert engine_entries("engines") == engine_entries(None) == []
