"""The finite-sample correction held to planted spectra: at each n_eff / d, the plug-in
erank's error, the corrected erank's error and how often its 95% interval covers the
truth, and the same for the participation ratio (plug-in against U-statistics).

    python benchmarks/debias.py [--d 64] [--trials 20] [--alpha 0.8]

Samples are u = a Sigma^{1/2} z with z ~ N(0, I), a power-law spectrum Sigma (lambda_k ~
k^-alpha, near the real Sigma_loss's erank / d at the default) and heavy-tailed norms:
a^2 log-normal with sigma 1.2, so that n_eff / n = exp(-1.44) = 0.24, as the real
gradients of SmolLM2-135M layer 15 have. Samples come in sequences of 16, grouped into 32
blocks, and go through the same estimate() as a run.
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from causaldim.config import AnalysisConfig
from causaldim.measures.sigma import BlockSums, estimate, spectrum

NORM_SIGMA = 1.2  # of log a^2: n_eff / n = exp(-NORM_SIGMA^2)
BLOCKS, SEQ = 32, 16


def power_law(d: int, alpha: float) -> torch.Tensor:
    lam = torch.arange(1, d + 1, dtype=torch.float64) ** -alpha
    return lam / lam.sum()


def planted_sums(lam: torch.Tensor, ratio: float, gen: torch.Generator) -> BlockSums:
    """Block sums of about ratio * d / 0.24 samples, so that n_eff / d is near ratio."""
    d = len(lam)
    per_block = max(SEQ, round(ratio * d / math.exp(-(NORM_SIGMA**2)) / BLOCKS / SEQ) * SEQ)
    sums = BlockSums(d, BLOCKS)
    for b in range(BLOCKS):
        a2 = torch.exp(NORM_SIGMA * torch.randn(per_block, generator=gen, dtype=torch.float64))
        z = torch.randn(per_block, d, generator=gen, dtype=torch.float64)
        sums.add(b, a2.sqrt()[:, None] * z * lam.sqrt()[None, :])
    return sums


def trial(lam: torch.Tensor, ratio: float, seed: int, resamples: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    est = estimate("loss", planted_sums(lam, ratio, gen), AnalysisConfig(bootstrap=resamples), seed)
    truth = spectrum(lam)
    lo, hi = est.erank_corrected_95
    plo, phi = est.participation_ratio_unbiased_95
    return {
        "n_eff_per_d": est.n_eff / len(lam),
        "plug_in": est.erank / truth.erank - 1,
        "corrected": est.erank_corrected / truth.erank - 1,
        "covered": lo <= truth.erank <= hi,
        "pr_plug_in": est.participation_ratio / truth.participation_ratio - 1,
        "pr_unbiased": est.participation_ratio_unbiased / truth.participation_ratio - 1,
        "pr_covered": plo <= truth.participation_ratio <= phi,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--alpha", type=float, default=0.8)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--resamples", type=int, default=50)
    parser.add_argument("--ratios", type=float, nargs="+", default=[2, 4, 8, 16, 32, 64])
    args = parser.parse_args()
    lam = power_law(args.d, args.alpha)
    truth = spectrum(lam)
    print(
        f"d = {args.d}, lambda_k ~ k^-{args.alpha:g}: erank {truth.erank:.2f} "
        f"({truth.erank / args.d:.2f} d), PR {truth.participation_ratio:.2f}; "
        f"{args.trials} trials per row, {args.resamples} resamples"
    )
    print(
        f"{'n_eff/d':>8} {'plug-in':>9} {'corrected':>10} {'max |err|':>10} {'covered':>8} "
        f"{'PR plug-in':>11} {'PR unbiased':>12} {'PR covered':>11} {'s/trial':>8}"
    )
    for ratio in args.ratios:
        t = time.perf_counter()
        rows = [
            trial(lam, ratio, 1000 * i + int(ratio), args.resamples) for i in range(args.trials)
        ]
        per = (time.perf_counter() - t) / args.trials

        def mean(key, rows=rows):
            return sum(r[key] for r in rows) / len(rows)

        worst = max(abs(r["corrected"]) for r in rows)
        print(
            f"{mean('n_eff_per_d'):8.1f} {100 * mean('plug_in'):+8.2f}% "
            f"{100 * mean('corrected'):+9.2f}% {100 * worst:9.2f}% "
            f"{sum(r['covered'] for r in rows):>4}/{len(rows):<3} "
            f"{100 * mean('pr_plug_in'):+10.2f}% {100 * mean('pr_unbiased'):+11.2f}% "
            f"{sum(r['pr_covered'] for r in rows):>6}/{len(rows):<4} {per:8.2f}"
        )


if __name__ == "__main__":
    main()
