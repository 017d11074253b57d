"""More eval tokens, or more logit probes per position: which buys the direct kappa more
precision per second?

One eval pass over 2N sequences with two Gaussian logit probes per position (a store,
harvested once) gives both budgets side by side:
  tokens: all 2N sequences with the first probe only;
  probes: the first N sequences with both probes.
Their costs come from timing the pass itself on a batch: the forward and loss backward
(per token) and one probe's backward (per token and probe). Reported per budget: seconds,
n_eff of the logits reading, the corrected erank and the width of its 95% interval over
resampled blocks, and width x sqrt(seconds) (lower is better: the width a fixed time
buys, if width falls as 1 / sqrt(seconds)).

    .venv/bin/python benchmarks/probes_or_tokens.py [--tokens 16384] [--out runs/probes2]
"""

from __future__ import annotations

import argparse
import math

import torch
from timing import median_time

from causaldim.config import AnalysisConfig, HarvestConfig
from causaldim.harvest import harvest
from causaldim.harvest.model_pass import grads_at
from causaldim.measures.sigma import BlockSums, estimate


def logits_sums(store, sequences: int, probes: list[int], blocks: int) -> BlockSums:
    """Block sums of the logits reading over the first `sequences` eval sequences, from
    the given probe slots; blocks of sequences as a run cuts them."""
    d = store.d_model
    sums = BlockSums(d, blocks)
    for batch in store.batches("eval", ("u_logits", "seq"), 4096):
        keep = batch["seq"] < sequences
        u, seq = batch["u_logits"][keep][:, probes], batch["seq"][keep].long()
        block_of = seq * blocks // sequences  # blocks of the budget's own sequences
        for b in block_of.unique().tolist():
            sums.add(b, u[block_of == b].reshape(-1, d))
    return sums


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=16_384, help="eval tokens harvested (2N seqs)")
    ap.add_argument("--out", default="runs/probes2")
    ap.add_argument("--blocks", type=int, default=32)
    ap.add_argument("--bootstrap", type=int, default=100)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()

    seq_len = 128
    cfg = HarvestConfig(
        tokens=2 * args.tokens,  # as many train tokens, which this does not use
        eval_fraction=0.5,
        logit_probes=2,
        fisher_probes=0,
        out=args.out,
    )
    result = harvest(cfg, progress=True)
    store = result.store
    n_seq = store.manifest["splits"]["eval"]["n_sequences"]

    # The per-token costs of the pass, timed on one batch of the same sequences.
    lm = result.lm
    if lm is None:
        from causaldim.harvest import plan
        from causaldim.model.load import load_model

        p = plan(cfg)
        lm = load_model(p.source, p.config.dtype, p.layers_path, p.config.device)
    layer = store.manifest["layer"]
    ids = store.token_ids("eval", 8)
    gen = torch.Generator().manual_seed(0)
    grads_at(lm, (layer,), ids)  # warm-up
    t0 = median_time(lambda: grads_at(lm, (layer,), ids), args.reps) / ids.numel()
    t2 = median_time(lambda: grads_at(lm, (layer,), ids, 2, 0, gen), args.reps) / ids.numel()
    per_probe = (t2 - t0) / 2

    budgets = {"tokens": (n_seq, [0]), "probes": (n_seq // 2, [0, 1])}
    print(
        f"per token: forward and loss backward {1e3 * t0:.2f} ms, one logit probe "
        f"{1e3 * per_probe:.2f} ms; {n_seq} eval sequences of {seq_len} harvested"
    )
    print(
        f"{'budget':<7} {'sequences':>9} {'probes':>6} {'seconds':>8} {'n_eff':>7} "
        f"{'erank':>7} {'95% interval':>17} {'width':>6} {'width x sqrt(s)':>16}"
    )
    for name, (sequences, probes) in budgets.items():
        sums = logits_sums(store, sequences, probes, args.blocks)
        est = estimate("logits", sums, AnalysisConfig(bootstrap=args.bootstrap), seed=0)
        seconds = sequences * seq_len * (t0 + len(probes) * per_probe)
        lo, hi = est.erank_corrected_95
        print(
            f"{name:<7} {sequences:9d} {len(probes):6d} {seconds:8.0f} {est.n_eff:7.0f} "
            f"{est.erank_corrected:7.1f} [{lo:7.1f}, {hi:7.1f}] {hi - lo:6.1f} "
            f"{(hi - lo) * math.sqrt(seconds):16.0f}"
        )


if __name__ == "__main__":
    main()
