"""How many threads a run computes with: the cores this process may use (its CPU
affinity and its cgroup's CPU quota, not the host's core count), the same number for
torch's pool and for numpy/scipy's BLAS, unless --threads says otherwise.

Why it matters (docs/measured.md, `benchmarks/busy.py`): OpenMP threads that outnumber
the free cores wait on each other at every parallel region, so two runs with a thread
per core each on a shared 2-core machine each ran four to five times slower than one
alone, where sharing two cores should cost two.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple


def _cgroup_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPU quota of this process's cgroup in cores (v2 cpu.max or v1 cfs files), or
    None where there is none."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


def usable_cores(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """The cores this process may use: its affinity mask, capped by its cgroup quota
    (rounded up: a quota of 1.5 cores still runs two threads)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    quota = _cgroup_quota(cgroup_root)
    if quota is not None:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)


class Threads(NamedTuple):
    """What a run computed with, as results.json records it."""

    threads: int
    usable_cores: int
    chosen_by: str  # "--threads" or "default (usable cores)"

    def to_dict(self) -> dict:
        return self._asdict()


def choose(requested: int | None = None) -> Threads:
    """The thread count: `requested` where given, else one per usable core."""
    cores = usable_cores()
    if requested is not None:
        return Threads(requested, cores, "--threads")
    return Threads(cores, cores, "default (usable cores)")


_chosen: int | None = None  # the count of the run in progress (None: torch's own)
_worker = threading.local()  # set in parallel_map's threads: a map inside one runs serially


@contextmanager
def limited(requested: int | None = None) -> Iterator[Threads]:
    """torch's intra-op pool and every BLAS/OpenMP pool numpy and scipy load held to
    the chosen count for the block, then put back as they were."""
    import torch
    from threadpoolctl import threadpool_limits

    global _chosen
    chosen = choose(requested)
    before, outer = torch.get_num_threads(), _chosen
    torch.set_num_threads(chosen.threads)
    _chosen = chosen.threads
    try:
        with threadpool_limits(limits=chosen.threads):
            yield chosen
    finally:
        torch.set_num_threads(before)
        _chosen = outer


def parallel_map(fn: Callable, items: Sequence) -> list:
    """fn over items, in order, on as many Python threads as the run has, each with one
    intra-op thread: for many small, independent linear-algebra calls (a 576 x 576
    eigendecomposition gains nothing from a second thread within it, and two of them side
    by side take half the time). torch releases the GIL inside its kernels."""
    import torch

    workers = min(len(items), _chosen or torch.get_num_threads())
    if workers <= 1 or getattr(_worker, "busy", False):
        return [fn(x) for x in items]

    def work(x):
        _worker.busy = True
        return fn(x)

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(work, items))
    finally:
        torch.set_num_threads(before)
