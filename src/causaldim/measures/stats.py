"""The small statistics every stage uses: percentile intervals, the Wilson interval of a
proportion, the AUC of two samples, and a rank correlation."""

from __future__ import annotations

import math

import numpy as np


def interval_95(values) -> list[float]:
    """The 2.5th and 97.5th percentiles of values (e.g. bootstrap resamples); [] for none."""
    return [float(q) for q in np.quantile(values, [0.025, 0.975])] if len(values) else []


def spread(values) -> float | None:
    """max / min of the positive values: how far estimates that should agree move apart
    (None where fewer than two are positive)."""
    positive = [v for v in values if v > 0]
    return max(positive) / min(positive) if len(positive) > 1 else None


def wilson_95(k: int, n: int, z: float = 1.96) -> list[float]:
    """95% Wilson interval of a proportion k/n (n > 0): honest at small n and at 0 or n."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [max(centre - half, 0.0), min(centre + half, 1.0)]


def auc(a: np.ndarray, b: np.ndarray) -> float:
    """P(a random draw of a exceeds one of b), ties counting half: 0.5 is no difference."""
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(a, b).statistic) / (len(a) * len(b))


def spearman(a, b) -> float | None:
    """Spearman's rank correlation; None where it is undefined (under 3 points, or a
    constant sample)."""
    from scipy.stats import spearmanr

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    # scipy's decorators leave the result typed without its fields
    return float(spearmanr(a, b).statistic)  # pyright: ignore[reportAttributeAccessIssue]
