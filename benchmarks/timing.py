"""Shared by the benchmark scripts (run from benchmarks/, which is then on sys.path)."""

from __future__ import annotations

import statistics
import time


def median_time(fn, reps: int, warmup: int = 0) -> float:
    """Median wall time of fn() over reps calls, after warmup untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)
