"""The cost of a glance: the direct estimates and kappa_SAE against the whole run.

    .venv/bin/python benchmarks/glance.py                     # a fresh default run
    .venv/bin/python benchmarks/glance.py --preset smoke
    .venv/bin/python benchmarks/glance.py --run runs/default  # a finished run, as it is

Runs `causaldim run --preset P` into a new folder (or reads a finished run), then prints
each stage's seconds and share of the run as results.json recorded them, and the share of
the two stages that hold the direct estimates and kappa_SAE ('sigma' and 'analysis', the
latter with kappa_hat's fits too: an upper bound) against the issue's targets (10% of a
default run, 20% of a smoke or replicate run). Then it times them again on the run's own
store and scores, one at a time: each direct reading's accumulation and estimate, and
kappa_SAE over the widths. The shares are measured in one run, side by side; a run that
reused its store spent no time harvesting, and its shares are flagged.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from causaldim.harvest.store import Store
from causaldim.measures import attributed
from causaldim.measures.score import load_scores
from causaldim.measures.sigma import accumulate, estimate, probes_per_token
from causaldim.presets import preset_configs

GLANCE = ("sigma", "analysis")
TARGET = {"default": 0.10, "smoke": 0.20, "replicate": 0.20}


def run(preset: str, out: Path) -> None:
    cmd = [sys.executable, "-m", "causaldim", "run", "--preset", preset, "--out", str(out)]
    print("$", " ".join(cmd[2:]), flush=True)
    subprocess.run([*cmd, "--quiet"], check=True, stdout=subprocess.DEVNULL)


def stage_shares(results: dict) -> float:
    seconds = results["seconds"]
    total = seconds["total"]
    print(f"{'stage':<20} {'seconds':>8} {'share':>7}")
    for name, s in seconds.items():
        if name != "total":
            print(f"{name:<20} {s:>8.1f} {s / total:>7.1%}")
    print(f"{'total':<20} {total:>8.1f}")
    return sum(seconds.get(name, 0.0) for name in GLANCE) / total


def per_reading(folder: Path, results: dict) -> None:
    """Each direct reading and kappa_SAE timed alone on the run's store and scores."""
    store = Store(folder / results["inputs"]["store"]["path"])
    _, _, cfg = preset_configs(results["preset"])
    probes = probes_per_token(store.manifest["key"])
    print(f"\n{'reading':<18} {'accumulate s':>12} {'estimate s':>10} {'erank (corrected)':>18}")
    for reading in results["sigma"]:
        started = time.perf_counter()
        sums = accumulate(store, cfg, (reading,))
        summed = time.perf_counter() - started
        started = time.perf_counter()
        again = estimate(reading, sums[reading], cfg, 0, probes.get(reading, 1))
        took = time.perf_counter() - started
        value = again.erank_corrected if again.erank_corrected is not None else again.erank
        print(f"{reading:<18} {summed:>12.2f} {took:>10.2f} {value:>18.1f}")
    for arch in results["sweep"]:
        scores = {
            int(p.stem.split("-w")[-1]): load_scores(p)
            for p in sorted((folder / "scores").glob(f"{arch}-w*.safetensors"))
        }
        started = time.perf_counter()
        found = attributed.estimate(scores, min(cfg.bootstrap, attributed.RESAMPLES))
        took = time.perf_counter() - started
        if found is not None:
            print(
                f"kappa_SAE ({arch}): {took:.2f} s over {len(scores)} widths "
                f"({found['resamples']} resamples each), {found['widest']:.1f} at the widest"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="default", choices=sorted(TARGET))
    parser.add_argument("--run", type=Path, help="a finished run's folder, read as it is")
    args = parser.parse_args()
    if args.run is None:
        folder = Path(tempfile.mkdtemp(prefix=f"glance-{args.preset}-")) / "run"
        run(args.preset, folder)
    else:
        folder = args.run
    results = json.loads((folder / "results.json").read_text())
    preset = results["preset"]
    share = stage_shares(results)
    target = TARGET.get(preset)
    verdict = "" if target is None else f" (target: at most {target:.0%})"
    print(f"\nsigma + analysis: {share:.1%} of the {preset} run{verdict}")
    if results["store"]["reused"]:
        print("note: this run reused its store, so it spent no time harvesting; run afresh")
    per_reading(folder, results)


if __name__ == "__main__":
    main()
