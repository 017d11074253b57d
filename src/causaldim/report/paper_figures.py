"""Every number of a run that the report sets beside the paper's, with the paper's: one
table ("Beside the paper") and the claims (claims.py) read them from here, so the two
cannot disagree."""

from __future__ import annotations

from typing import NamedTuple

from ..claims.quantities import (
    calibrated,
    calibration_count,
    headline_sweep,
    kappa_hat_spread,
    reading,
    set_by_calibration,
    spread_text,
)
from ..fmt import ci, ci_of, features, growth, num, pct
from ..measures.sigma import HEADLINE
from .direct import flagged


class Figure(NamedTuple):
    label: str
    this_run: str
    paper: str


def growth_ci(counted: dict) -> str:
    """N_causal's growth, with its bootstrap interval where there is one."""
    interval = counted.get("n_causal_growth_95")
    point = counted["n_causal_growth"]
    return growth(point) + (f" {ci_of(point, interval, 2)}" if interval else "")


def figures(results: dict) -> dict[str, Figure]:
    """Every number the report sets beside the paper's, by key, in the table's order."""
    a = headline_sweep(results)
    free, paper = a["kappa"]["free"], results["paper"]
    w, regime, other = a["wedge"], a["regime"], a["sensitivity"]
    sigma = results.get("sigma", {})
    lead = sigma.get(HEADLINE)
    last = a["per_width"][-1]
    estimable = a["estimable"]
    spread = kappa_hat_spread(results)
    att = a.get("attributed")
    erank = flagged(lead) if lead else "n/a (no logit probes)"
    pr = lead.get("participation_ratio_unbiased") if lead else None
    pr_95 = lead.get("participation_ratio_unbiased_95") if lead else None
    return {
        "reference_over_d": Figure(
            "reference width / d",
            f"{regime['reference_over_d']:.2f}",
            f"{regime['paper_reference_over_d']:.1f}",
        ),
        "widest_over_d": Figure(
            "widest width / d",
            f"{regime['widest_over_d']:.1f}",
            f"{regime['paper_widest_over_d']:.0f}",
        ),
        "width_ratio": Figure(
            "width ratio of the sweep", f"x{w['width_ratio']:g}", f"x{paper['width_ratio']}"
        ),
        "n_repr_growth": Figure(
            "N_repr growth", growth(w["n_repr_growth"]), f"x{paper['n_repr_growth']}"
        ),
        "n_causal_growth": Figure(
            f"N_causal growth (AtP over {reading(a)})",
            growth_ci(w),
            f"x{paper['n_causal_growth']}",
        ),
        "n_causal_growth_other": Figure(
            f"N_causal growth (AtP over {reading(other)})", growth_ci(other), ""
        ),
        "inert_fraction": Figure(
            "firing features below epsilon (widest SAE)",
            pct(last["inert_fraction"]),
            pct(paper["inert_fraction"]),
        ),
        "markov_ceiling": Figure(
            "total attribution A / epsilon (Markov ceiling on N_causal), widest",
            num(last["markov_ceiling"]),
            "",
        ),
        "kappa_hat": Figure(
            "kappa_hat [95% CI over the tokens]",
            (
                f"{free['kappa']:,.0f} {ci_of(free['kappa'], free['interval_95'])}"
                + (
                    f", set by the calibration: its count is {calibrated(calibration_count(a), a)}"
                    if set_by_calibration(free["kappa"], a)
                    else ""
                )
                if estimable
                else "not estimable"
            ),
            f"{paper['kappa_hat']:,} {ci(paper['kappa_hat_95'])}",
        ),
        "kappa_hat_spread": Figure(
            "kappa_hat's whole uncertainty (tokens, SAE seeds, percentiles)",
            spread_text(spread) if spread else "n/a",
            "",
        ),
        "kappa_over_d": Figure(
            "kappa_hat / d",
            f"{free['kappa_over_d']:.2f} {ci(over_d(results), 2)}" if estimable else "n/a",
            f"{paper['kappa_over_d']}",
        ),
        "kappa_sae": Figure(
            "kappa_SAE, plug-in (widest) [95% CI]",
            f"{num(att['widest'])} {ci_of(att['widest'], att['widest_95'])}" if att else "n/a",
            "",
        ),
        "direct_kappa": Figure(
            "direct kappa (erank, gauge-invariant logits reading, corrected)", erank, ""
        ),
        "kappa_pr": Figure(
            "kappa_PR (direct, the same reading, U-statistics)",
            f"{num(pr)} {ci(pr_95)}" if pr_95 else num(pr),
            f"{paper['kappa_pr']}",
        ),
        "coverage": Figure(
            "coverage at the widest SAE",
            pct(free["coverage"]) if estimable else "n/a",
            pct(paper["coverage"]),
        ),
        "width_95": Figure(
            "width for 95% of kappa_hat",
            features(free["width_95"]) if estimable else "n/a",
            f"{paper['width_full_recovery']:,} features",
        ),
    }


def over_d(results: dict) -> list[float] | None:
    interval = headline_sweep(results)["kappa"]["free"]["interval_95"]
    d = results["store"]["model"]["d_model"]
    return [v / d for v in interval] if interval else None
