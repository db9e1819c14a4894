"""transforms/engines/vllm_shared/heap.py: the trim interval, and that glibc accepts the fixed mmap threshold."""
from __future__ import annotations

import ctypes.util

from transforms.engines.vllm_shared.heap import HeapTrimmer, fix_mmap_threshold

ON_GLIBC = bool(ctypes.util.find_library("c"))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_trims_at_most_once_an_interval() -> None:
    clock = Clock()
    heap = HeapTrimmer(every_s=2.0, clock=clock)
    assert heap.maybe_trim() is False  # no time has passed since it was made
    clock.now += 2.5
    assert heap.maybe_trim() is ON_GLIBC
    assert heap.maybe_trim() is False  # again at once: too soon
    clock.now += 1.0
    assert heap.maybe_trim() is False
    clock.now += 1.5
    assert heap.maybe_trim() is ON_GLIBC
    assert heap.trims == (2 if ON_GLIBC else 0)


def test_zero_interval_turns_trimming_off() -> None:
    clock = Clock()
    heap = HeapTrimmer(every_s=0.0, clock=clock)
    clock.now += 60
    assert heap.maybe_trim() is False and heap.trims == 0


def test_mmap_threshold_is_accepted_by_glibc() -> None:
    assert fix_mmap_threshold() is ON_GLIBC
