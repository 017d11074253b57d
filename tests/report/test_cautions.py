"""Every warning code, one case each: raised where its source says so, it is in
results.json's warnings, in what the CLI prints after its table, in the report's "Read with
care" and in Results.warnings (a tiny real run carries several: test_pipeline.py)."""

from __future__ import annotations

import pytest
from results_factory import make_results, text, with_warnings

import causaldim
from causaldim.fileio import write_sealed_json
from causaldim.report.cautions import collect, touching_headline
from causaldim.report.first_screen import first_screen
from causaldim.report.sections import summary


def note(code: str):
    return lambda results: [(code, f"a note of kind {code}")]


def sigma_caution(reading: str, code: str):
    def add(results):
        results["sigma"][reading]["cautions"] = [[code, f"{reading} says {code}"]]

    return add


def sweep_caution(code: str):
    def add(results):
        results["sweep"]["topk"]["cautions"] = [[code, f"topk says {code}"]]

    return add


def not_estimable(results):
    results["sweep"]["topk"]["estimable"] = False
    results["sweep"]["topk"]["not_estimable"] = "N_causal does not grow with width (x0.90)"


def unconverged_profile(results):
    row = {"logits": {"erank_corrected": 300.0, "converged": False, "eval_tokens_needed": 9000}}
    results["profile"] = {"layers": {"0": row, "1": row}, "run_layer": 1}


def drifting_profile(results):
    row = {"loss": {"erank_corrected": 300.0, "erank_corrected_half": 200.0, "converged": True}}
    results["profile"] = {"layers": {"0": row, "1": row}, "run_layer": 1}


def outliers_holding_most_variance(results):
    results["store"]["outliers"]["variance_share"] = 0.989


def poor_saes(results):
    results["sweep"]["topk"]["per_width"][0].update(
        fraction_variance_explained=0.03, ce_loss_recovered=0.14
    )


def control_warning(results):
    results["controls"] = {"depth": {"warnings": ["layer 1's sweep is not estimable"]}}


# (code, what raises it: a change to the results, or a function giving the plan's notes)
CASES = [
    *(
        (f"run.{code}", note(code))
        for code in (
            "corpus_short",
            "short_of_the_papers_data",
            "few_imported_widths",
            "unused.task_prompts",
        )
    ),
    *(
        (f"direct.{reading}.{code}", sigma_caution(reading, code))
        for reading, code in (
            ("logits", "not_converged"),
            ("loss", "half_drift"),
            ("fisher", "few_samples"),
        )
    ),
    ("sae.topk.not_estimable", not_estimable),
    ("direct.outliers_left_out", outliers_holding_most_variance),
    ("sae.topk.poor_reconstruction", poor_saes),
    *(
        (f"sae.topk.{code}", sweep_caution(code))
        for code in (
            "kappa_hat_unsaturated",
            "kappa_hat_extrapolated",
            "kappa_hat_above_d",
            "kappa_sae_interval",
            "imported_l0_spread",
        )
    ),
    ("profile.logits.not_converged", unconverged_profile),
    ("profile.loss.half_drift", drifting_profile),
    ("control.depth", control_warning),
]


@pytest.mark.parametrize(("code", "raise_it"), CASES, ids=[c[0] for c in CASES])
def test_each_warning_is_everywhere_the_numbers_are(tmp_path, code, raise_it):
    results = make_results()
    results["sweep"]["topk"]["cautions"] = []
    notes = raise_it(results) or []
    with_warnings(results)
    results["warnings"] = collect(results, notes)
    results["headline"]["warnings"] = touching_headline(results["warnings"], "topk")
    (w,) = [w for w in results["warnings"] if w["code"] == code]
    words = f"{w['message'][:1].upper()}{w['message'][1:]}"
    assert f"{words} ({code})" in summary(results)  # printed by the CLI after its table
    report = text(first_screen, results=results)
    assert "## Read with care" in report and f"- {words} (`{code}`)" in report
    write_sealed_json(tmp_path / "results.json", results)
    assert w in causaldim.load(tmp_path).warnings
    touches = code.startswith(("direct.logits.", "direct.outliers_left_out", "sae.topk."))
    assert (code in results["headline"]["warnings"]) == touches
    assert w["severity"] == ("caution" if touches else "note")
