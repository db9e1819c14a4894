"""The progress line: done of listed, rate, and an ETA only once there is a rate."""
from __future__ import annotations

from transforms.output.progress import progress_line


def test_progress_line_has_totals_rate_and_eta() -> None:
    assert progress_line(3, 10, 40, 120, 20.0) == "3/10 documents, 40/120 pages, 2.0 pages/s, ETA 40 s"
    assert progress_line(10, 10, 120, 120, 60.0) == "10/10 documents, 120/120 pages, 2.0 pages/s"
    assert "ETA" not in progress_line(0, 5, 0, 50, 1.0)  # no rate yet: no guess
