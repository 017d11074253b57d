"""The SAE route's quantities the claims set against the direct kappa: the calibration's
fixed count and whether kappa_hat is set by it, kappa_hat's whole uncertainty (tokens,
seeds, percentiles), the paper's rate of growth."""

from __future__ import annotations

import math

from ..fmt import ci, num
from ..measures.sigma import HEADLINE
from .verdicts import (
    CALIBRATION_NEAR,
    control,
    finite,
)


def headline_sweep(results: dict) -> dict:
    return results["sweep"][results["headline"]["architecture"]]


def reading(a: dict) -> str:
    """Which AtP normalisation a count used, with its floor: "firing tokens (features with
    20+ eval firings)"."""
    if a["normalisation"] != "firing":
        return f"{a['normalisation']} tokens"
    return f"firing tokens (features with {a.get('min_firings') or 1}+ eval firings)"


def paper_slope(paper: dict) -> float:
    """The paper's log-log slope of N_causal over its sweep: log 4.35 / log 64."""
    return math.log(paper["n_causal_growth"]) / math.log(paper["width_ratio"])


def calibration_count(a: dict) -> float:
    """N_causal at the reference width, fixed by the calibration: (1 - p) m_ref."""
    return (1 - a["percentile"] / 100) * a["reference_width"]


def calibrated(n, a: dict) -> str:
    """A count at the reference width, labelled as the calibration's."""
    return (
        f"{round(n):,} (fixed by calibration: {100 - a['percentile']:g}% of "
        f"{a['reference_width']:,})"
    )


def set_by_calibration(kappa: float, a: dict) -> bool:
    """kappa_hat within CALIBRATION_NEAR of the calibration's count measures the
    percentile, not the layer."""
    n = calibration_count(a)
    return n > 0 and 1 / CALIBRATION_NEAR <= kappa / n <= CALIBRATION_NEAR


def direct(results: dict, metric: str = "raw") -> dict | None:
    """The direct kappa's estimate where it can be set against the SAE route: measured
    and converged (an unconverged value decides nothing, as in table A); metric "act":
    the activation-weighted one, which weighs directions as AtP does."""
    est = (results.get("sigma") or {}).get(HEADLINE)
    if est and metric == "act":
        est = est.get("activation_weighted")
    usable = est and finite(est.get("erank_corrected")) and est.get("converged") is not False
    return est if usable else None


def direct_text(results: dict, metric: str = "raw") -> str:
    est = direct(results, metric)
    if est is not None:
        return f"{num(est['erank_corrected'])} {ci(est['erank_corrected_95'])}"
    lead = (results.get("sigma") or {}).get(HEADLINE)
    if lead and metric == "act" and not lead.get("activation_weighted"):
        return "n/a (not measured)"
    return "n/a (not converged)" if lead else "n/a (no logit probes)"


def kappa_hat_spread(results: dict) -> dict | None:
    """kappa_hat's whole uncertainty: its token (and, with --sae-seeds, training)
    bootstrap interval, its value at every percentile of the thresholds control where
    N_causal grows, and the widest interval those give. None if not estimable."""
    a = headline_sweep(results)
    if not a["estimable"]:
        return None
    free = a["kappa"]["free"]
    token = free.get("interval_95")
    percentiles = {a["percentile"]: free["kappa"]}
    thresholds = control(results, "thresholds")
    for r in (thresholds or {}).get("rows", []):
        if (r.get("n_causal_growth") or 0) > 1 and finite(r.get("kappa_hat")):
            percentiles[r["percentile"]] = r["kappa_hat"]
    values = [*(token or []), *percentiles.values()]
    return {
        "kappa": free["kappa"],
        "token_95": token,
        "seeds": a.get("seeds", 1),
        "percentiles": dict(sorted(percentiles.items())),
        "whole": [min(values), max(values)],
    }


def spread_text(s: dict) -> str:
    seeds = (
        f"over {s['seeds']} SAE seeds and the tokens"
        if s["seeds"] > 1
        else "over the tokens (one SAE seed: --sae-seeds 2+ for the training's spread)"
    )
    by_p = ", ".join(f"{p:g}th: {num(k)}" for p, k in s["percentiles"].items())
    return (
        f"kappa_hat {num(s['kappa'])}: {ci(s['token_95'])} {seeds}; by percentile {by_p}; "
        f"together {ci(s['whole'])}"
    )
