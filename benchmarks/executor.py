"""The SAE sweep through the Ray executor against in-process, side by side in one run.

    .venv/bin/python benchmarks/executor.py [--store runs/default/stores/L15-...]

Trains the same independent widths twice from one store, into fresh folders: in this
process (torch with all cores), then as Ray tasks (one CPU each, as many at once as there
are CPUs). Prints each job's time, the speed-up, and what the per-job times imply for N
workers (GPUs): the sweep takes about max(sum of jobs / N, longest job) plus overhead.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from causaldim.executors import LocalExecutor, RayExecutor
from causaldim.harvest.store import Store
from causaldim.measures.sweep import run_sweep
from causaldim.sae.formats import read_meta
from causaldim.sweep_config import SweepConfig


def default_store() -> Path:
    stores = sorted(Path("runs/default/stores").glob("L15-*"))
    if not stores:
        raise SystemExit("no store: run `causaldim run` first, or pass --store")
    return stores[0]


def timed_sweep(store: Store, cfg: SweepConfig, executor) -> tuple[float, dict[int, float]]:
    folder = Path(tempfile.mkdtemp(prefix="executor-bench-"))
    try:
        t = time.perf_counter()
        entries = run_sweep(store, folder, cfg, progress=False, executor=executor)
        wall = time.perf_counter() - t
        jobs = {e.width: read_meta(e.folder)["train_stats"]["seconds"] for e in entries}
        return wall, jobs
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, default=None)
    ap.add_argument("--widths", type=int, nargs="+", default=[1024, 1024, 2048, 2048])
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--cpus", type=int, default=2)
    args = ap.parse_args()
    store = Store(args.store or default_store())
    # Equal widths are distinct jobs too: a sweep of independent SAEs of known cost.
    widths = [w + i for i, w in enumerate(args.widths)]
    cfg = replace(SweepConfig(), widths=widths, epochs=args.epochs, checkpoint_steps=0)

    import ray

    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    results = {}
    for name, executor in (("in-process", LocalExecutor()), ("ray", RayExecutor())):
        results[name] = timed_sweep(store, cfg, executor)
        wall, jobs = results[name]
        per_job = ", ".join(f"w{w}: {s:.1f} s" for w, s in jobs.items())
        print(f"{name:>10}: sweep {wall:.1f} s wall; jobs {per_job}")
    ray.shutdown()

    local, remote = results["in-process"][0], results["ray"][0]
    print(f"speed-up of Ray over in-process on {args.cpus} CPUs: {local / remote:.2f}x")
    jobs = list(results["ray"][1].values())
    overhead = remote - max(sum(jobs) / args.cpus, max(jobs))
    print(
        f"Ray's per-job times sum to {sum(jobs):.1f} s (longest {max(jobs):.1f} s); with N "
        f"workers the sweep takes about max(sum / N, longest) + {overhead:.1f} s overhead:"
    )
    for n in (1, 2, 4, 8, 16):
        print(f"  N = {n:>2}: {max(sum(jobs) / n, max(jobs)) + overhead:7.1f} s")


if __name__ == "__main__":
    main()
