"""The progress line's per-device rates (pipelines/run/progress.py device_rates) when a machine runs several
engines: each engine's pages since the invocation started, over its seconds."""
from __future__ import annotations

from pipelines.run.progress import device_rates


def test_each_device_shows_its_own_pages_per_second_since_the_start() -> None:
    before = {"0": 100, "1": 90}  # a resumed run: its engines had answered these already
    now = {"0": 160, "1": 120, "2": 30}  # device 2's figures appeared during this invocation
    assert device_rates(before, now, 30.0) == " (devices: 0 2.0, 1 1.0, 2 1.0 pages/s)"


def test_one_engine_or_none_adds_nothing() -> None:
    assert device_rates({}, {"cpu0": 50}, 10.0) == ""
    assert device_rates({}, {}, 10.0) == ""
