"""The conditions a run measured under (model and its weights, corpus, context length,
what was left out of Sigma), with the paper's beside them: the headline, the report's
first screen, results.json and every claims table state them, since each verdict holds
for these conditions only."""

from __future__ import annotations

from ..fmt import pct
from ..paper import CONDITIONS as PAPER_CONDITIONS

# The corrected erank's remaining error on known spectra with 8+ independent equivalents
# per dimension: at most 1.5% (median 0.4%) over the stress suite's 33 such cells
# (docs/stress-suite.txt; tests/claims/test_conditions.py reads it from there).
ESTIMATOR_BIAS = 0.015


def kappa_intervals() -> str:
    """What a direct kappa's 95% interval covers, and what it leaves out."""
    return (
        "Intervals (95%) of a direct kappa cover the resampling of the eval sequences (a "
        "jackknife over blocks of whole sequences), the probes' simulation and the drift from "
        "half the sequences to all. They leave out the estimator's own remaining bias (up to "
        f"{100 * ESTIMATOR_BIAS:.1f}% of a converged erank on the stress suite's known "
        "spectra), and the layer, the corpus, the context length and the weights' "
        "quantisation: the verdicts hold under the conditions stated."
    )


def sae_intervals() -> str:
    """What kappa_hat's and the SAE counts' intervals cover."""
    return (
        "Intervals of kappa_hat and of the SAE counts resample the eval tokens (and, with "
        "--sae-seeds 2+, the trainings); kappa_hat's whole interval adds its value at every "
        "calibration percentile. They leave out the widths chosen, the fitted curve's form "
        "and the layer, corpus and weights; an interval that misses its own point is not "
        "printed."
    )


def conditions(results: dict) -> dict:
    """This run's conditions and the paper's, from results.json (a run's own "conditions"
    where it has them; derived from the inputs and the store otherwise)."""
    if results.get("conditions"):
        return results["conditions"]
    model, corpus, store = results["inputs"]["model"], results["inputs"]["corpus"], results["store"]
    analysis = results["config"]["analysis"]
    out = store["outliers"]
    if analysis.get("include_outliers"):
        left_out = "nothing: outlier tokens kept (--include-outliers)"
    else:
        left_out = (
            f"position 0 and tokens with a residual norm above {out['factor']:g}x the median: "
            f"{out['n_outliers']:,} of {out['n_tokens']:,} tokens, carrying "
            f"{pct(out['variance_share'])} of the residual variance (left out of Sigma and "
            "of the SAEs)"
        )
    return {
        "model": model.get("description") or model["name"],
        "corpus": corpus.get("description") or corpus["id"],
        "seq_len": store["seq_len"],
        "left_out": left_out,
        "paper": dict(PAPER_CONDITIONS),
    }


def conditions_lines(results: dict) -> list[str]:
    """The conditions as a reader meets them: this run's, then the paper's."""
    c = conditions(results)
    p = c["paper"]
    return [
        f"This run: {c['model']}; corpus: {c['corpus']}; sequences of {c['seq_len']} tokens; "
        f"left out: {c['left_out']}.",
        f"The paper: {p['model']}; corpus: {p['corpus']}; sequences of {p['seq_len']} tokens; "
        f"left out: {p['left_out']}.",
    ]
