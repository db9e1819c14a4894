"""Keep an engine process's native heap from growing with the run.

Each page makes the engine allocate and free tensors, images and token lists of a different size.
glibc raises its mmap threshold after large blocks are freed (up to 32 MiB), so later large buffers
come from the arenas, where the freed pieces stay: a long run's peak memory climbed ~0.3-0.5 MiB a
page although nothing stayed alive (Python's own heap was flat under tracemalloc). A fixed mmap
threshold gives every large buffer back on free, and `malloc_trim` returns the arenas' free tops.
Figures in benchmarks/README.md (bench_memory). Elsewhere than glibc both are absent: no-ops.
"""
from __future__ import annotations

import ctypes
import time
from collections.abc import Callable

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's own starting value, kept fixed instead of rising


def _libc_function(name: str) -> Callable[..., int] | None:
    try:  # the C library this process already has loaded: no ldconfig lookup
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):  # musl, macOS: no malloc_trim / mallopt
        return None


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Allocations of `threshold` bytes or more are mmapped and returned on free, for this process
    from now on. An explicit value also stops glibc from raising it. True when it took effect."""
    mallopt = _libc_function("mallopt")
    return bool(mallopt is not None and mallopt(M_MMAP_THRESHOLD, threshold) == 1)


class HeapTrimmer:
    """`maybe_trim()` trims when `every_s` seconds have passed since the last trim."""

    def __init__(self, every_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self.clock = clock
        self._trim = _libc_function("malloc_trim")
        self._last = clock()
        self.trims = 0

    def maybe_trim(self) -> bool:
        now = self.clock()
        if self._trim is None or self.every_s <= 0 or now - self._last < self.every_s:
            return False
        self._last = now
        self._trim(0)
        self.trims += 1
        return True
