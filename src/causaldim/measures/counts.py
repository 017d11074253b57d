"""From per-width AtP scores to the paper's counts: epsilon calibrated once on the
reference (smallest) width, N_causal and N_repr per width, and the wedge between them."""

from __future__ import annotations

import math

import numpy as np
import torch

from .score import Scores


def calibrate(reference_atp: torch.Tensor, percentile: float = 98.0) -> float:
    """epsilon = the given percentile of AtP over all features of the reference width."""
    return float(torch.quantile(reference_atp.double(), percentile / 100))


def counts(scores: dict[int, Scores], epsilon: float) -> dict[int, dict]:
    """Per width: N_repr (fired at least once), N_causal (AtP > epsilon), the features
    too rare to score (under the firing normalisation), the inert fraction (scored, firing
    but below epsilon) and mean L0."""
    out = {}
    for width, s in sorted(scores.items()):
        causal = s.atp > epsilon
        rare = s.too_rare
        scored = (s.fired > 0) & ~rare
        out[width] = {
            "n_repr": int((s.fired > 0).sum()),
            "n_causal": int(causal.sum()),
            "n_too_rare": int(rare.sum()),
            "inert_fraction": float((scored & ~causal).sum()) / max(int(scored.sum()), 1),
            "mean_l0": s.mean_l0,
        }
    return out


def wedge(per_width: dict[int, dict]) -> dict:
    """Growth ratios smallest -> largest width and least-squares log-log slopes."""
    widths = sorted(per_width)
    lo, hi = per_width[widths[0]], per_width[widths[-1]]

    def points(key: str) -> list[tuple[float, float]]:
        """(log m, log count) where the count is not 0 (log 0 is not a point)."""
        return [(math.log(w), math.log(per_width[w][key])) for w in widths if per_width[w][key]]

    def slope(key: str) -> float | None:
        pts = points(key)
        if len(pts) < 2:
            return None
        mx = sum(x for x, _ in pts) / len(pts)
        my = sum(y for _, y in pts) / len(pts)
        return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)

    def ratio(key: str) -> float | None:
        return hi[key] / lo[key] if lo[key] else None

    return {
        "width_ratio": widths[-1] / widths[0],
        "n_repr_growth": ratio("n_repr"),
        "n_causal_growth": ratio("n_causal"),
        "n_repr_loglog_slope": slope("n_repr"),
        "n_causal_loglog_slope": slope("n_causal"),
        # widths the slopes rest on: those with a zero count are left out, and said so
        "n_repr_loglog_widths": len(points("n_repr")),
        "n_causal_loglog_widths": len(points("n_causal")),
        "widths": len(widths),
    }


def resampled_counts(
    scores: dict[int, Scores],
    reference: int,
    percentile: float,
    resamples: int,
    seed: int = 0,
    replicates: dict[int, list[Scores]] | None = None,
) -> dict[str, np.ndarray]:
    """The bootstrap of the counts: eval-sequence blocks drawn with replacement, then every
    width re-scored from its per-block sums, epsilon re-calibrated on the reference width,
    and N_causal and N_repr re-counted. With replicates (the same widths trained again
    with other seeds), each resample also draws one training per width, so that the
    intervals carry the training's variance. Arrays are [resamples, widths] in width
    order."""
    widths = sorted(scores)
    blocks = len(scores[reference].tokens)
    gen = torch.Generator().manual_seed(seed)
    trainings = {m: [scores[m], *(replicates or {}).get(m, [])] for m in widths}
    n_causal = np.zeros((resamples, len(widths)))
    n_repr = np.zeros((resamples, len(widths)))
    epsilon = np.zeros(resamples)
    for r in range(resamples):
        w = torch.bincount(torch.randint(0, blocks, (blocks,), generator=gen), minlength=blocks)
        picked = {
            m: t[int(torch.randint(0, len(t), (1,), generator=gen))] if len(t) > 1 else t[0]
            for m, t in trainings.items()
        }
        resampled = {m: picked[m].resample(w) for m in widths}
        epsilon[r] = eps = calibrate(resampled[reference][0], percentile)
        for j, m in enumerate(widths):
            atp, fired = resampled[m]
            n_causal[r, j] = int((atp > eps).sum())
            n_repr[r, j] = int((fired > 0).sum())
    return {"n_causal": n_causal, "n_repr": n_repr, "epsilon": epsilon}
