"""The paper's numbers from the scores of one sweep: epsilon, N_repr and N_causal per width
with bootstrap intervals, the wedge, AtP distributions, and kappa_hat (free and kappa <= d)
with its coverage, the width at which it is reached, and warnings where it cannot be trusted."""

from __future__ import annotations

import math

import torch

from ..config import AnalysisConfig
from .counts import calibrate, counts, resampled_counts, wedge
from .fit import estimate_kappa
from .score import Scores
from .stats import interval_95

ATP_EDGES = [x / 4 for x in range(-24, 13)]  # log10(AtP / epsilon), -6 .. 3


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
) -> dict:
    """Everything the report says about one architecture's sweep, as plain data."""
    widths = sorted(scores)
    reference = cfg.reference_width or widths[0]
    epsilon = calibrate(scores[reference].atp, cfg.percentile)
    per_width = counts(scores, epsilon)
    boot = None
    if cfg.bootstrap:
        boot = resampled_counts(scores, reference, cfg.percentile, cfg.bootstrap, seed)
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
        }
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
    return {
        "reference_width": reference,
        "percentile": cfg.percentile,
        "epsilon": epsilon,
        "epsilon_95": [] if boot is None else interval_95(boot["epsilon"]),
        "n_eval_tokens": scores[reference].n_tokens,
        "blocks": len(scores[reference].tokens),
        "bootstrap": cfg.bootstrap,
        "per_width": rows,
        "wedge": growth,
        "kappa": kappa,
        # whether kappa <= d changes any form's fit (else one table says both)
        "constraint_binds": any(
            kappa["free"]["fits"][f]["kappa"] != kappa["at_most_d"]["fits"][f]["kappa"]
            for f in kappa["free"]["fits"]
        ),
        "warnings": _warnings(widths, n_causal, growth, kappa, d_model),
    }


def _warnings(widths, n_causal, growth, kappa, d_model) -> list[str]:
    out = []
    if len(widths) < 4:
        out.append(f"only {len(widths)} widths: a saturating fit needs at least 4 to mean much")
    if growth["n_causal_growth"] is not None and growth["n_causal_growth"] <= 1.0:
        out.append(
            f"N_causal does not grow with width ({n_causal[0]} -> {n_causal[-1]}): the fits "
            "describe a level, not an asymptote, and kappa_hat is not a causal dimensionality"
        )
    free = kappa["free"]
    if free["at_bound"] == "kappa":
        out.append("the free fit did not saturate: kappa_hat ran to the edge of its search range")
    elif free["width_95"] > widths[-1]:
        out.append(
            f"extrapolated: the fit reaches 95% of kappa_hat only at width "
            f"{free['width_95']:,.0f}, beyond the widest SAE ({widths[-1]:,})"
        )
    if free["kappa"] > d_model or (free["interval_95"] and free["interval_95"][1] > d_model):
        out.append(
            f"the free kappa_hat or its interval exceeds d = {d_model}, which kappa cannot "
            "(kappa <= d): read the constrained fit beside it"
        )
    return out
