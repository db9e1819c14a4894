"""The progress thread runs for any positive `--progress-every-s`, a fraction of a second too, and is gone once
the run ends; a line before the first wave has no wave, and a rate in the first second is per second (mutants
that started the thread only above 1 s, printed `wave` before one had started, or divided by at least a second
survived `make mutate`; docs/development.md "Mutation score"). Whether a thread runs is checked, not when its
lines come: no timing."""
from __future__ import annotations

import io
import threading
from pathlib import Path

import pytest

from pipelines.run.progress import Progress, ProgressWatcher, progress_line


def progress_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "pagemill-progress"]


@pytest.mark.parametrize("every_s", [0.5, 1.0, 30.0])
def test_a_positive_interval_starts_the_thread_and_the_end_stops_it(tmp_path: Path, every_s: float) -> None:
    with ProgressWatcher(str(tmp_path), "t", "r", every_s, out=io.StringIO()):
        assert len(progress_threads()) == 1
    assert progress_threads() == []


def test_no_interval_starts_no_thread(tmp_path: Path) -> None:
    with ProgressWatcher(str(tmp_path), "t", "r", 0, out=io.StringIO()):
        assert progress_threads() == []


def test_before_the_first_wave_the_line_names_no_wave() -> None:
    assert progress_line(Progress(documents=0, listed=9, pages=0, seconds=2.0, wave=None, waves=3)) == \
        "0/9 documents, 0 pages, 0.0 pages/s, ETA unknown"


def test_a_rate_within_the_first_second_is_per_second() -> None:
    # 3 pages in half a second: 6 a second; 1 document of 5 in half a second: 4 left at 2 a second, 2 s.
    assert progress_line(Progress(documents=1, listed=5, pages=3, seconds=0.5)) == \
        "1/5 documents, 3 pages, 6.0 pages/s, ETA 2 s"
