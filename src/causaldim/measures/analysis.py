"""The paper's numbers from the scores of one sweep: epsilon, N_repr and N_causal per width
with bootstrap intervals, the wedge, AtP distributions, and kappa_hat (free and kappa <= d)
with its coverage, the width at which it is reached, whether it is estimable at all, and
warnings where it cannot be trusted; beside them the diagnostics of the estimator
(diagnose.py), the other AtP normalisation, and the split-robust estimate (attributed.py).
"""

from __future__ import annotations

import math

import torch

from ..config import ATP_NORMALISATIONS, AnalysisConfig
from ..paper import PAPER
from . import attributed, diagnose
from .counts import calibrate, counts, resampled_counts, wedge
from .digest import DecoderDigest
from .fit import estimate_kappa
from .score import Scores
from .stats import interval_95

ATP_EDGES = [x / 4 for x in range(-24, 13)]  # log10(AtP / epsilon), -6 .. 3
MIN_WIDTHS = 4  # a saturating fit's asymptote needs at least this many widths


def atp_histogram(atp: torch.Tensor, epsilon: float) -> dict:
    """Counts of log10(AtP / epsilon) per bin; zeros and the tails are counted apart."""
    pos = atp[atp > 0].double()
    rel = (pos / epsilon).log10() if epsilon > 0 else pos.log10()
    lo, hi = ATP_EDGES[0], ATP_EDGES[-1]
    hist = torch.histc(rel.float().clamp(lo, hi), len(ATP_EDGES) - 1, lo, hi)
    return {
        "log10_edges": ATP_EDGES,
        "counts": [int(c) for c in hist],
        "zero": int((atp <= 0).sum()),
        "below_range": int((rel < lo).sum()),
        "above_range": int((rel > hi).sum()),
    }


def analyze(
    scores: dict[int, Scores],
    evals: dict[int, dict],
    d_model: int,
    cfg: AnalysisConfig,
    seed: int = 0,
    digests: dict[int, DecoderDigest] | None = None,
    replicates: dict[int, list[Scores]] | None = None,
    progress: bool = False,
    kappa_sae: bool = True,
) -> dict:
    """Everything the report says about one architecture's sweep, as plain data. With the
    digests of the SAEs' decoders (digest.py), also how the reference's features split;
    with replicates (other trainings of the widths), intervals that carry the training's
    variance. kappa_sae=False
    leaves out the split-robust estimate (it does not depend on epsilon: the thresholds
    control reads it from the headline's analysis)."""
    widths = sorted(scores)
    reference = cfg.reference_width or widths[0]
    epsilon = calibrate(scores[reference].atp, cfg.percentile)
    per_width = counts(scores, epsilon)
    boot = None
    if cfg.bootstrap:
        boot = resampled_counts(scores, reference, cfg.percentile, cfg.bootstrap, seed, replicates)
    other = sensitivity(scores, reference, cfg.percentile, min(cfg.bootstrap, 100), seed)
    rows = []
    for j, m in enumerate(widths):
        ev = evals.get(m, {})
        row = {
            "width": m,
            **per_width[m],
            "l0": ev.get("l0"),
            "fraction_variance_explained": ev.get("fraction_variance_explained"),
            "dead_fraction": ev.get("dead_fraction"),
            "ce_loss_recovered": ev.get("ce_loss_recovered"),
            "atp_histogram": atp_histogram(scores[m].atp, epsilon),
            "atp_max": float(scores[m].atp.max()),
            **diagnose.per_width(scores[m], epsilon, ev.get("train_firings")),
            "n_causal_other": other["n_causal"][j],
        }
        if replicates:  # every training's count at the point epsilon: the seeds' spread
            trainings = [scores[m], *replicates.get(m, [])]
            row["n_causal_seeds"] = [int((t.atp > epsilon).sum()) for t in trainings]
        if boot is not None:
            row["n_causal_95"] = interval_95(boot["n_causal"][:, j])
            row["n_repr_95"] = interval_95(boot["n_repr"][:, j])
        rows.append(row)

    n_causal = [per_width[m]["n_causal"] for m in widths]
    kappa = {}
    for name, bound in (("free", None), ("at_most_d", float(d_model))):
        est = estimate_kappa(widths, n_causal, None if boot is None else boot["n_causal"], bound)
        kappa[name] = {
            **est.to_dict(),
            "kappa_over_d": est.kappa / d_model,
            "coverage": n_causal[-1] / est.kappa if est.kappa > 0 else math.nan,
        }
    growth = wedge(per_width)
    growth_95 = _growth_interval(boot)
    reason = not_estimable(widths, growth["n_causal_growth"], growth_95)
    att = (
        attributed.estimate(scores, min(cfg.bootstrap, attributed.RESAMPLES), seed, progress)
        if kappa_sae
        else None
    )
    cautions = _warnings(widths, kappa, d_model, reason is None) + [
        ("kappa_sae_interval", w) for w in attributed.warnings(att)
    ]
    return {
        "reference_width": reference,
        "percentile": cfg.percentile,
        "normalisation": scores[reference].normalisation,
        "min_firings": scores[reference].min_firings
        if scores[reference].normalisation == "firing"
        else None,
        "seeds": 1 + max((len(r) for r in (replicates or {}).values()), default=0),
        "epsilon": epsilon,
        "epsilon_95": [] if boot is None else interval_95(boot["epsilon"]),
        "n_eval_tokens": scores[reference].n_tokens,
        "blocks": len(scores[reference].tokens),
        "bootstrap": cfg.bootstrap,
        "per_width": rows,
        "wedge": {**growth, "n_causal_growth_95": growth_95},
        "estimable": reason is None,
        "not_estimable": reason,
        "kappa": kappa,
        # whether kappa <= d changes any form's fit (else one table says both)
        "constraint_binds": any(
            kappa["free"]["fits"][f]["kappa"] != kappa["at_most_d"]["fits"][f]["kappa"]
            for f in kappa["free"]["fits"]
        ),
        "regime": {
            "reference_over_d": reference / d_model,
            "widest_over_d": widths[-1] / d_model,
            "paper_reference_over_d": PAPER["reference_width"] / PAPER["d_model"],
            "paper_widest_over_d": PAPER["widest_width"] / PAPER["d_model"],
        },
        "sensitivity": other,
        "splits": None
        if digests is None
        else diagnose.splits(
            scores[reference],
            epsilon,
            {m: (scores[m], digests[m]) for m in widths if m > reference},
        ),
        "attributed": att,
        "warnings": [message for _, message in cautions],
        # the same, each with a stable code: [[code, message], ...]
        "cautions": [list(c) for c in cautions],
    }


def sensitivity(
    scores: dict[int, Scores], reference: int, percentile: float, resamples: int, seed: int = 0
) -> dict:
    """The counts under the other AtP normalisation, calibrated the same way: free from
    the same scores, so the report always shows how much the choice moves the wedge; with
    its growth's bootstrap interval, and the features each width loses to the floor of the
    firing reading."""
    other = next(n for n in ATP_NORMALISATIONS if n != scores[reference].normalisation)
    rescored = {m: s.normalised(other) for m, s in scores.items()}
    epsilon = calibrate(rescored[reference].atp, percentile)
    per_width = counts(rescored, epsilon)
    n_causal = [per_width[m]["n_causal"] for m in sorted(scores)]
    boot = resampled_counts(rescored, reference, percentile, resamples, seed) if resamples else None
    return {
        "normalisation": other,
        "min_firings": scores[reference].min_firings if other == "firing" else None,
        "epsilon": epsilon,
        "n_causal": n_causal,
        "n_causal_95": [] if boot is None else [interval_95(c) for c in boot["n_causal"].T],
        "n_too_rare": [per_width[m]["n_too_rare"] for m in sorted(scores)],
        "n_causal_growth": n_causal[-1] / n_causal[0] if n_causal[0] else None,
        "n_causal_growth_95": _growth_interval(boot),
    }


def _growth_interval(boot: dict | None) -> list[float] | None:
    """95% interval of N_causal(widest) / N_causal(smallest) over the resamples."""
    if boot is None:
        return None
    first, last = boot["n_causal"][:, 0], boot["n_causal"][:, -1]
    ratios = last[first > 0] / first[first > 0]
    return interval_95(ratios) or None


def not_estimable(widths, growth: float | None, growth_95: list[float] | None) -> str | None:
    """Why kappa_hat is not to be read as a number, or None: a saturating curve's asymptote
    means something only where N_causal grows, and grows beyond its noise."""
    if len(widths) < MIN_WIDTHS:
        return f"only {len(widths)} widths: a saturating fit needs at least {MIN_WIDTHS}"
    if growth is None:
        return "N_causal is 0 at the smallest width: no growth to fit"
    if growth <= 1.0:
        return f"N_causal does not grow with width (x{growth:.2f} over the sweep)"
    if growth_95 and growth_95[0] <= 1.0:
        return (
            f"N_causal's growth x{growth:.2f} is within its noise (95% interval "
            f"[{growth_95[0]:.2f}, {growth_95[1]:.2f}] reaches 1)"
        )
    return None


def _warnings(widths, kappa, d_model, estimable: bool) -> list[tuple[str, str]]:
    """What to read with care in an estimable kappa_hat, as (code, message) (where it is
    not, the reason is the headline's and the fits only describe a level)."""
    out = []
    if not estimable:
        return out
    free = kappa["free"]
    if free["at_bound"] == "kappa":
        out.append(
            (
                "kappa_hat_unsaturated",
                "the free fit did not saturate: kappa_hat ran to the edge of its search range",
            )
        )
    elif free["width_95"] > widths[-1]:
        out.append(
            (
                "kappa_hat_extrapolated",
                f"extrapolated: the fit reaches 95% of kappa_hat only at width "
                f"{free['width_95']:,.0f}, beyond the widest SAE ({widths[-1]:,})",
            )
        )
    if free["kappa"] > d_model or (free["interval_95"] and free["interval_95"][1] > d_model):
        out.append(
            (
                "kappa_hat_above_d",
                f"the free kappa_hat or its interval exceeds d = {d_model}, which kappa cannot "
                "(kappa <= d): read the constrained fit beside it",
            )
        )
    return out
