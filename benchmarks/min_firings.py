"""The firing-token reading's floor, measured: N_causal' per width and its growth at
several --min-firings, from a finished run's saved AtP scores (nothing is recomputed).

    .venv/bin/python benchmarks/min_firings.py runs/replicate-claims --floors 1 5 10 20 40

Per floor: epsilon (the run's percentile of the reference width's firing-token AtP, over
the features that clear the floor), then per width N_causal' with its 95% bootstrap
interval and the features too rare to score, and the growth smallest -> widest with its
interval. A floor is safe where the counts no longer move with it: below it, features
that fired a handful of times score their largest single effect.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from causaldim.config import AnalysisConfig
from causaldim.measures.counts import calibrate, counts, resampled_counts
from causaldim.measures.score import load_scores
from causaldim.measures.stats import interval_95


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="A finished run's folder (its --out).")
    parser.add_argument("--floors", type=int, nargs="+", default=[1, 5, 10, 20, 40])
    parser.add_argument("--architecture", default="topk")
    parser.add_argument("--resamples", type=int, default=200)
    args = parser.parse_args()
    finished = args.run / "results.json"  # else a run still in its controls: the defaults
    analysis = (
        json.loads(finished.read_text())["config"]["analysis"]
        if finished.is_file()
        else AnalysisConfig().to_dict()
    )
    # each width's scores, not the decoder digests saved beside them (NAME.decoder.*)
    loaded = {
        int(p.stem.split("-w")[1]): load_scores(p)
        for p in sorted((args.run / "scores").glob(f"{args.architecture}-w*.safetensors"))
        if p.stem.split("-w")[1].isdigit()
    }
    widths = sorted(loaded)
    reference = analysis["reference_width"] or widths[0]
    median_firings = int(loaded[widths[-1]].fired.float().median())
    print(
        f"{args.run}: {args.architecture} widths {widths}, epsilon at the "
        f"{analysis['percentile']}th percentile of width {reference}; the widest SAE's "
        f"median feature fired {median_firings} times in eval"
    )
    print("| floor | epsilon | N_causal' per width [95%] | too rare per width | growth [95%] |")
    print("| --- | --- | --- | --- | --- |")
    for floor in args.floors:
        scores = {m: s.normalised("firing", floor) for m, s in loaded.items()}
        epsilon = calibrate(scores[reference].atp, analysis["percentile"])
        per_width = counts(scores, epsilon)
        boot = resampled_counts(scores, reference, analysis["percentile"], args.resamples)
        cells = []
        for j, m in enumerate(widths):
            low, high = interval_95(boot["n_causal"][:, j])
            cells.append(f"{per_width[m]['n_causal']} [{low:.0f}, {high:.0f}]")
        first, last = boot["n_causal"][:, 0], boot["n_causal"][:, -1]
        ok = first > 0
        growth_95 = interval_95(last[ok] / first[ok])
        n0, n1 = per_width[widths[0]]["n_causal"], per_width[widths[-1]]["n_causal"]
        growth = f"x{n1 / n0:.2f} [{growth_95[0]:.2f}, {growth_95[1]:.2f}]" if n0 else "n/a"
        rare = ", ".join(str(per_width[m]["n_too_rare"]) for m in widths)
        print(f"| {floor} | {epsilon:.3g} | {', '.join(cells)} | {rare} | {growth} |")


if __name__ == "__main__":
    main()
