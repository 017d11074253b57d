"""The conditions a run measured under (model and its weights, corpus, context length,
what was left out of Sigma), with the paper's beside them: the headline, the report's
first screen, results.json and every claims table state them, since each verdict holds
for these conditions only."""

from __future__ import annotations

from ..fmt import pct
from ..paper import CONDITIONS as PAPER_CONDITIONS


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
