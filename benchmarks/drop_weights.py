"""--drop-weights against keeping the weights, side by side on one store: the SAEs' disk
at its peak (polled while each sweep runs) beside what the plan says, the seconds of the
stages the sweep runs, and whether the numbers are the same.

    .venv/bin/python benchmarks/drop_weights.py [--out runs/bench-drop] [--widths ...]

The store is harvested first, and each run reads a copy of it (both then load the model
on first use, for CE loss recovered): OUT/keep keeps every SAE, OUT/drop drops each
SAE's weights once it is scored (the reference's stay). Both train every SAE from the
same seed, so the only difference is the order and the dropping. The peak counts the SAE
folders (weights and cfg.json) under OUT/x/saes, not the training checkpoint (the plan
states it apart).
"""

from __future__ import annotations

import argparse
import json
import shutil
import threading
import time
from pathlib import Path

from causaldim.checks import check
from causaldim.disk import disk_bytes
from causaldim.pipeline import harvest_only, run
from causaldim.presets import preset_configs

STAGES = ("sweep", "ce_loss_recovered", "scores", "analysis")
SAME = ("sweep", "subspace", "sigma", "ce")


def sae_bytes(saes: Path) -> int:
    """Bytes of the finished SAE folders (not the .partial checkpoints or temp folders)."""
    total = 0
    for folder in saes.glob("[!.]*"):
        for f in folder.glob("*"):
            try:
                total += f.stat().st_size
            except FileNotFoundError:  # deleted while we looked
                pass
    return total


def run_polled(settings: dict, saes: Path) -> tuple[dict, int]:
    """The run's results and the peak bytes of its SAE folders, polled every 50 ms."""
    peak, done = [0], threading.Event()

    def poll():
        while not done.is_set():
            peak[0] = max(peak[0], sae_bytes(saes))
            time.sleep(0.05)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    try:
        found = run(*preset_configs("default", **settings), progress=False)
    finally:
        done.set()
        watcher.join()
    return found.results, max(peak[0], sae_bytes(saes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/bench-drop"))
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=32_768)
    parser.add_argument("--widths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    base = {
        "model": args.model,
        "tokens": args.tokens,
        "widths": args.widths,
        "epochs": args.epochs,
        "checkpoint_steps": 0,
    }
    if args.out.exists():
        shutil.rmtree(args.out)
    harvest_only(preset_configs("default", **base, out=str(args.out / "store"))[0], False)
    rows = {}
    for name, drop in (("keep", False), ("drop", True)):
        out = args.out / name
        shutil.copytree(args.out / "store" / "stores", out / "stores")
        settings = {**base, "drop_weights": drop, "out": str(out)}
        plans = check(*preset_configs("default", **settings))
        planned = disk_bytes(plans.main, plans.sweep)["saes"]
        results, peak = run_polled(settings, out / "saes")
        seconds = sum(results["seconds"].get(k, 0.0) for k in STAGES)
        rows[name] = (results, peak, planned, seconds)
        print(
            f"{name}: SAEs' disk at its peak {peak / 1e6:,.1f} MB, planned {planned / 1e6:,.1f} "
            f"MB (measured / planned {peak / planned:.3f}); left at the end "
            f"{sae_bytes(out / 'saes') / 1e6:,.1f} MB; sweep, CE, scores and analysis "
            f"{seconds:,.1f} s"
        )
    (keep, keep_peak, _, keep_s), (drop, drop_peak, _, drop_s) = rows["keep"], rows["drop"]
    same = [k for k in SAME if json.dumps(keep[k]) == json.dumps(drop[k])]
    print(
        f"drop / keep: peak disk {drop_peak / keep_peak:.3f}, seconds {drop_s / keep_s:.3f}; "
        f"the same numbers in {len(same)} of {len(SAME)} parts of results.json "
        f"({', '.join(same) or 'none'})"
    )


if __name__ == "__main__":
    main()
