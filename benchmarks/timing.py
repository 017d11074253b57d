"""Shared by the benchmark scripts (run from benchmarks/, which is then on sys.path)."""

from __future__ import annotations

import statistics
import time

import torch


def sync() -> None:
    """Wait for queued GPU work, so that a wall time covers it."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def median_time(fn, reps: int, warmup: int = 0) -> float:
    """Median wall time of fn() over reps calls, after warmup untimed calls."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


class StepClock:
    """Per-step wall times of a loop that pulls its batches from this iterable: a step
    is the time between two successive pulls (the last step, which ends with no pull, is
    not counted). It times a trainer with no per-step hook, everything in its loop
    included (optimizer, bookkeeping)."""

    def __init__(self, batches):
        self.batches = batches
        self.pulls: list[float] = []

    def __iter__(self):
        for batch in self.batches:
            self.pulls.append(time.perf_counter())
            yield batch

    def step_times(self, warmup: int) -> list[float]:
        return [b - a for a, b in zip(self.pulls, self.pulls[1:], strict=False)][warmup:]
