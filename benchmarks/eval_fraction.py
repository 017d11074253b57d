"""The direct estimates of a real store from a fraction of its eval sequences against all
of them: does the corrected erank hold its value as the data shrink (the real model's
check of the finite-sample correction, whose stress suite is benchmarks/debias.py)?

    .venv/bin/causaldim harvest --tokens 163840 --eval-fraction 0.8 --layer 15 \
        --out runs/eval-heavy
    .venv/bin/python benchmarks/eval_fraction.py runs/eval-heavy/stores/L15-*

Prints, per reading and fraction (1/8, 1/4, 1/2, all): the corrected erank with its 95%
interval, whether it converged, independent equivalents per dimension, the plug-in, the
estimate's change against all the data, and the seconds each estimate took.
"""

from __future__ import annotations

import argparse
import time

from causaldim.config import AnalysisConfig
from causaldim.harvest.store import Store, block_of, n_blocks
from causaldim.measures.sigma import READINGS, BlockSums, add_rows, estimate, probes_per_token


def sums_for(store: Store, cfg: AnalysisConfig, readings: tuple[str, ...], fraction: float):
    """Each reading's block sums over the first `fraction` of the eval sequences (they
    were shuffled before the split, so the first ones are a random subset)."""
    keep = max(2, int(store.manifest["splits"]["eval"]["n_sequences"] * fraction))
    blocks = n_blocks(keep, cfg.blocks)
    seq_len, d = store.manifest["seq_len"], store.d_model
    sums = {r: BlockSums(d, blocks, r == "activations", seq_len=seq_len) for r in readings}
    fields = tuple(dict.fromkeys([f for r in readings for f in READINGS[r]] + ["seq", "pos"]))
    for batch in store.batches("eval", fields, cfg.read_tokens, not cfg.include_outliers):
        chosen = batch["seq"] < keep
        if not chosen.any():
            break
        rows = {k: v[chosen] for k, v in batch.items()}
        add_rows(sums, rows, block_of(rows["seq"], blocks, keep), seq_len)
    return sums, keep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("store")
    parser.add_argument(
        "--readings", nargs="+", default=["logits", "logits_uncentred", "loss", "fisher"]
    )
    parser.add_argument("--fractions", type=float, nargs="+", default=[1 / 8, 1 / 4, 1 / 2, 1])
    args = parser.parse_args()
    store, cfg = Store(args.store), AnalysisConfig()
    probes = probes_per_token(store.manifest["key"])
    d = store.d_model
    print(
        f"store {args.store}: layer {store.manifest['layer']}, d = {d}, "
        f"{store.n_tokens('eval'):,} eval tokens in "
        f"{store.manifest['splits']['eval']['n_sequences']} sequences"
    )
    print(
        f"{'reading':<8} {'fraction':>8} {'seqs':>5} {'corrected [95%]':>26} {'conv.':>5} "
        f"{'ind./d':>7} {'plug-in':>8} {'vs all':>7} {'s':>6}"
    )
    for reading in args.readings:
        rows = []
        for fraction in sorted(args.fractions):
            sums, seqs = sums_for(store, cfg, (reading,), fraction)
            started = time.perf_counter()
            est = estimate(reading, sums[reading], cfg, 0, probes.get(reading, 1))
            rows.append((fraction, seqs, est, time.perf_counter() - started))
        whole = rows[-1][2].erank_corrected
        for fraction, seqs, est, seconds in rows:
            lo, hi = est.erank_corrected_95
            print(
                f"{reading:<8} {fraction:>8.3f} {seqs:>5} "
                f"{est.erank_corrected:>8.1f} [{lo:7.1f}, {hi:7.1f}] "
                f"{'yes' if est.converged else 'NO':>5} {est.n_independent / d:>7.1f} "
                f"{est.erank:>8.1f} {100 * (est.erank_corrected / whole - 1):>+6.1f}% "
                f"{seconds:>6.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
