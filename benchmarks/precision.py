"""The effect of bf16 against fp32 on the headline numbers, from two runs of one config
that differ only in --dtype/--sae-dtype: the direct eranks, and N_repr / N_causal per
width (each run calibrates its own epsilon, as a user's run would).

    .venv/bin/causaldim run --tokens 16384 --out runs/prec-fp32
    .venv/bin/causaldim run --tokens 16384 --out runs/prec-bf16 \\
        --dtype bfloat16 --sae-dtype bfloat16
    .venv/bin/python benchmarks/precision.py runs/prec-fp32 runs/prec-bf16
"""

from __future__ import annotations

import argparse
from pathlib import Path

from causaldim.report.results import load_results


def rel(a: float, b: float) -> str:
    return "n/a" if not a else f"{100 * (b - a) / a:+.1f}%"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reference", help="run folder (or results.json) of the fp32 run")
    p.add_argument("other", help="run folder (or results.json) of the bf16 run")
    args = p.parse_args()
    runs = []
    for path in (args.reference, args.other):
        path = Path(path)
        runs.append(load_results(path / "results.json" if path.is_dir() else path))
    a, b = runs
    for r in runs:
        h, s = r["config"]["harvest"], r["config"]["sweep"]
        print(
            f"{h['dtype']:>9} pass, {s['sae_dtype']:>9} SAEs: {r['store']['tokens']} tokens, "
            f"eval loss {r['store']['eval_mean_loss']:.4f}, {r['seconds']['total']:.0f} s"
        )
    print("\ndirect erank   fp32     other    change")
    for reading in a["sigma"]:
        ea, eb = a["sigma"][reading]["erank"], b["sigma"][reading]["erank"]
        print(f"  {reading:<10} {ea:8.1f} {eb:8.1f}  {rel(ea, eb)}")
    arch = a["headline"]
    print(f"\n{arch} per width: N_repr fp32/other, N_causal fp32/other")
    for ra, rb in zip(a["sweep"][arch]["per_width"], b["sweep"][arch]["per_width"], strict=True):
        print(
            f"  m={ra['width']:>6}: N_repr {ra['n_repr']:>5} / {rb['n_repr']:<5} "
            f"({rel(ra['n_repr'], rb['n_repr'])}); N_causal {ra['n_causal']:>4} / "
            f"{rb['n_causal']:<4} ({rel(ra['n_causal'], rb['n_causal'])})"
        )


if __name__ == "__main__":
    main()
