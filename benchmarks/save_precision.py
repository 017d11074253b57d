"""The precision scoring needs: every SAE of a finished run scored as trained (float32
weights) and with its matrices rounded to bfloat16 or float16 (what --save-dtype writes),
side by side: FVE, L0, dead fraction and N_causal at every width and architecture.

    .venv/bin/python benchmarks/save_precision.py runs/cmp-adam [--dtype float16]

Both are computed here, the same way, from the run's store (the SAEs' own), so the only
difference is the rounding. A quantity agrees where the rounded SAE is within 1% of the
float32 one (N_causal: of its value; dead fraction: 0.01) or within the run's seed-to-seed
difference (--sae-seeds 2), as benchmarks/lean_vs_adam.py counts it. N_causal takes
epsilon from each reading's own reference width, as the run does.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from causaldim.harvest.store import Store, key_digest
from causaldim.measures.counts import calibrate, counts
from causaldim.measures.score import atp_scores, load_scores
from causaldim.measures.sweep import evaluate
from causaldim.sae.formats import load, read_meta, round_weights

EVALS = ("fraction_variance_explained", "l0", "dead_fraction")


def the_store(run: Path, fingerprint: str) -> Store:
    """The store the SAEs trained on (a run may hold its --until-converged rounds too)."""
    for folder in sorted((run / "stores").iterdir()):
        store = Store(folder)
        if key_digest(store.manifest["key"]) == fingerprint:
            return store
    raise SystemExit(f"{run}/stores holds no store the SAEs name")


def n_causal(scores: dict[int, object], cfg: dict) -> dict[int, int]:
    read = {
        w: s.normalised(cfg["atp_normalisation"], cfg["min_firings"]) for w, s in scores.items()
    }
    ref = cfg["reference_width"] or min(read)
    epsilon = calibrate(read[ref].atp, cfg["percentile"])
    return {w: c["n_causal"] for w, c in counts(read, epsilon).items()}


def agrees(full: float, half: float, spread: float, quantity: str) -> bool:
    scale = 1.0 if quantity == "dead_fraction" else max(abs(full), 1e-12)
    return abs(half - full) <= max(0.01 * scale, spread)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    args = parser.parse_args()
    results = json.loads((args.run / "results.json").read_text())
    cfg = results["config"]["analysis"]
    half = args.dtype
    rows, seconds = {}, {"float32": 0.0, half: 0.0}
    for arch, sweep in results["sweep"].items():
        scores = {"float32": {}, half: {}}
        evals = {"float32": {}, half: {}}
        for row in sweep["per_width"]:
            name = f"{arch}-w{row['width']}"
            folder = args.run / "saes" / name
            store = the_store(args.run, read_meta(folder)["request"]["store"])
            for kind in scores:
                t = time.perf_counter()
                sae = load(folder)
                if kind == half:
                    round_weights(sae, kind)
                ev = evaluate(sae, store)
                evals[kind][row["width"]] = {
                    "fraction_variance_explained": ev["fraction_variance_explained"],
                    "l0": ev["l0"],
                    "dead_fraction": ev["dead"] / row["width"],
                }
                scores[kind][row["width"]] = atp_scores(
                    sae, store, cfg["blocks"], cfg["read_tokens"]
                )
                seconds[kind] += time.perf_counter() - t
            # the run's seed-to-seed difference: seed 1's saved eval and scores
            again = args.run / "saes" / f"{name}-s1"
            spread = {q: 0.0 for q in (*EVALS, "n_causal")}
            if again.is_dir():
                ev = read_meta(again)["eval"]
                ev = {**ev, "dead_fraction": ev["dead"] / row["width"]}
                spread.update({q: abs(ev[q] - evals["float32"][row["width"]][q]) for q in EVALS})
            rows[arch, row["width"]] = {"spread": spread, "run": row["n_causal"]}
        found = {kind: n_causal(scores[kind], cfg) for kind in scores}
        seeds = {
            w: load_scores(args.run / "scores" / f"{arch}-w{w}-s1.safetensors")
            for w in scores["float32"]
            if (args.run / "scores" / f"{arch}-w{w}-s1.safetensors").is_file()
        }
        again = n_causal(seeds, cfg) if len(seeds) == len(scores["float32"]) else {}
        for w in scores["float32"]:
            r = rows[arch, w]
            for kind in scores:
                r[kind] = {**evals[kind][w], "n_causal": found[kind][w]}
            if w in again:
                r["spread"]["n_causal"] = abs(again[w] - found["float32"][w])
    print(f"{'sae':>16} {'quantity':>28} {'float32':>12} {half:>12} {'seed spread':>12} agrees")
    n = ok = 0
    for (arch, width), r in sorted(rows.items()):
        for q in (*EVALS, "n_causal"):
            full, low, spread = r["float32"][q], r[half][q], r["spread"][q]
            good = agrees(full, low, spread, q)
            n, ok = n + 1, ok + good
            print(
                f"{arch + '-w' + str(width):>16} {q:>28} {full:>12.5g} {low:>12.5g} "
                f"{spread:>12.3g} {good}"
            )
    same = sum(r["float32"]["n_causal"] == r[half]["n_causal"] for r in rows.values())
    as_run = sum(r["float32"]["n_causal"] == r["run"] for r in rows.values())
    print(
        f"agree: {ok} of {n} ({half} within 1% of float32, or within the seed spread); "
        f"N_causal equal at {same} of {len(rows)} SAEs (float32's as the run's results.json "
        f"at {as_run}); seconds to evaluate and score: float32 {seconds['float32']:,.0f}, "
        f"{half} {seconds[half]:,.0f}"
    )


if __name__ == "__main__":
    main()
