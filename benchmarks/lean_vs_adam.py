"""The lean optimiser against float32 Adam on one sweep: FVE, L0, dead fraction and
N_causal at every width and architecture, each seed of each, and the time training took.

Two runs of the same store and sweep, one per optimiser, Adam's with --sae-seeds 2 (its
seed-to-seed spread), e.g. (the store is reused when the run folder is copied first):

    causaldim run --model gemma3-270m --layer 9 --until-converged \
        --architectures topk jumprelu --sae-seeds 2 --out runs/cmp-adam
    cp -r runs/cmp-adam runs/cmp-lean && rm -r runs/cmp-lean/saes
    causaldim run ... --sae-seeds 1 --out runs/cmp-lean --optimizer lean
    .venv/bin/python benchmarks/lean_vs_adam.py runs/cmp-adam runs/cmp-lean

A quantity agrees where lean's seed 0 is within 1% of Adam's seed 0 (N_causal: of its
value) or within Adam's own seed-to-seed difference; the verdict line counts them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

QUANTITIES = ("fraction_variance_explained", "l0", "dead_fraction", "n_causal")


def read(run: Path) -> dict:
    """(architecture, width) -> quantity -> [seed 0, seed 1, ...], and training seconds."""
    results = json.loads((run / "results.json").read_text())
    found, seconds = {}, 0.0
    for arch, sweep in results["sweep"].items():
        for row in sweep["per_width"]:
            name = f"{arch}-w{row['width']}"
            seeds = [run / "saes" / name]
            seeds += sorted((run / "saes").glob(f"{name}-s*"))
            evals = [json.loads((f / "cfg.json").read_text()) for f in seeds]
            seconds += evals[0]["train_stats"]["seconds"]  # seed 0: both runs have it
            found[arch, row["width"]] = {
                **{q: [m["eval"][q] for m in evals] for q in QUANTITIES[:3]},
                "n_causal": row.get("n_causal_seeds", [row["n_causal"]]),
            }
    return {"rows": found, "seconds": seconds, "optimizer": _optimizer(results)}


def _optimizer(results: dict) -> str:
    return results["config"].get("sweep", {}).get("optimizer", "adam")


def agrees(adam: list[float], lean: list[float], quantity: str) -> bool:
    scale = max(abs(adam[0]), 1e-12) if quantity != "dead_fraction" else 1.0
    spread = abs(adam[1] - adam[0]) if len(adam) > 1 else 0.0
    return abs(lean[0] - adam[0]) <= max(0.01 * scale, spread)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("adam", type=Path)
    parser.add_argument("lean", type=Path)
    args = parser.parse_args()
    adam, lean = read(args.adam), read(args.lean)
    assert (adam["optimizer"], lean["optimizer"]) == ("adam", "lean"), "runs in that order"
    print(f"{'sae':>16} {'quantity':>28} {'adam s0, s1':>22} {'lean s0, s1':>22} agrees")
    n = ok = 0
    for key in sorted(adam["rows"]):
        for q in QUANTITIES:
            a, b = adam["rows"][key][q], lean["rows"][key][q]
            good = agrees(a, b, q)
            n, ok = n + 1, ok + good
            shown = [", ".join(f"{v:.4g}" for v in vals) for vals in (a, b)]
            print(f"{key[0] + '-w' + str(key[1]):>16} {q:>28} {shown[0]:>22} {shown[1]:>22} {good}")
    print(
        f"agree: {ok} of {n} (lean's seed 0 within 1% of Adam's, or within Adam's seed "
        f"spread); training seconds, seed 0 of every SAE: adam {adam['seconds']:,.0f}, lean "
        f"{lean['seconds']:,.0f} (as the runs found the machine: benchmarks/sae_memory.py "
        "times both side by side)"
    )


if __name__ == "__main__":
    main()
