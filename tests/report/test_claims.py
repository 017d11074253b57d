"""The paper's claims: each verdict rule on hand-made results that hold, do not hold and
cannot be tested; and the claims table agreeing with the "Beside the paper" table."""

from __future__ import annotations

import pytest
from test_report_sections import make_results, text

from causaldim.report.claims import FAILS, HOLDS, RULES, UNTESTABLE, claims
from causaldim.report.paper_figures import figures
from causaldim.report.sections import beside_paper, claims_section


def verdict(results: dict, key: str) -> tuple[str, str]:
    (claim,) = [c for c in claims(results) if c.key == key]
    return claim.verdict, claim.reason


def headline(results: dict) -> dict:
    return results["sweep"][results["headline"]["architecture"]]


def with_wedge(repr_growth, slope, causal_95) -> dict:
    results = make_results()
    w = headline(results)["wedge"]
    w.update(n_repr_growth=repr_growth, n_repr_loglog_slope=slope, n_causal_growth_95=causal_95)
    w["n_causal_growth"] = sum(causal_95) / 2
    return results


def test_the_wedge():
    assert verdict(with_wedge(3.8, 0.96, [1.2, 1.9]), "wedge")[0] == HOLDS
    assert verdict(with_wedge(3.8, 0.96, [2.5, 4.1]), "wedge")[0] == FAILS  # reaches N_repr
    assert verdict(with_wedge(3.8, 0.30, [1.2, 1.9]), "wedge")[0] == FAILS  # N_repr sublinear
    falls, why = verdict(with_wedge(3.8, 0.96, [0.2, 0.5]), "wedge")
    assert falls == FAILS and "falls with width" in why
    no_boot = with_wedge(3.8, 0.96, [1.2, 1.9])
    headline(no_boot)["wedge"]["n_causal_growth_95"] = None
    assert verdict(no_boot, "wedge") == (UNTESTABLE, VERDICT_NO_BOOT)


VERDICT_NO_BOOT = "no bootstrap interval on N_causal's growth (--bootstrap 0)"


def with_kappa(interval, d=576) -> dict:
    results = make_results()
    free = headline(results)["kappa"]["free"]
    free["interval_95"] = interval
    free["kappa"] = sum(interval) / 2
    free["kappa_over_d"] = free["kappa"] / d
    return results


def test_kappa_hat_over_d():
    assert verdict(with_kappa([400.0, 520.0]), "kappa_hat")[0] == HOLDS  # 0.69-0.90 d
    low, why = verdict(with_kappa([60.0, 90.0]), "kappa_hat")
    assert low == FAILS and "misses [0.57, 1.00]" in why
    not_estimable = with_kappa([400.0, 520.0])
    headline(not_estimable).update(estimable=False, not_estimable="only 3 widths")
    assert verdict(not_estimable, "kappa_hat") == (
        UNTESTABLE,
        "kappa_hat is not estimable: only 3 widths",
    )


def test_the_participation_ratio_as_a_lower_bound():
    results = make_results()
    assert verdict(results, "kappa_pr")[0] == HOLDS  # 94.7 [87, 103] below 258 [242, 275]
    lead = results["sigma"]["logits"]
    lead["participation_ratio_unbiased_95"] = [240.0, 300.0]
    assert verdict(results, "kappa_pr")[0] == FAILS
    del results["sigma"]["logits"]
    assert verdict(results, "kappa_pr")[0] == UNTESTABLE


def test_coverage():
    results = make_results()  # 69.6% at 4,096; 95% at width 9,880
    assert verdict(results, "coverage")[0] == HOLDS
    free = headline(results)["kappa"]["free"]
    free.update(coverage=1.05, width_95=2253.0)
    assert verdict(results, "coverage")[0] == FAILS
    headline(results)["estimable"] = False
    assert verdict(results, "coverage")[0] == UNTESTABLE


def with_depth(kappas: dict[int, float], epsilon_ratio, converged=True) -> dict:
    layers = {
        str(i): {"logits": {"erank_corrected": kappas.get(i, 300.0), "converged": converged}}
        for i in range(8)
    }
    for i in range(8):
        if i not in kappas:
            layers[str(i)]["logits"]["erank_corrected"] = None
    results = make_results(profile={"layers": layers, "run_layer": 3})
    results["controls"] = {"depth": {"layers": [1, 6], "epsilon_first_over_last": epsilon_ratio}}
    return results


def test_depth():
    flat = {1: 300.0, 2: 320.0, 3: 310.0, 6: 290.0, 0: 50.0, 7: 900.0}  # ends left out
    assert verdict(with_depth(flat, 8.0), "depth")[0] == HOLDS
    assert verdict(with_depth(flat, 1.1), "depth")[0] == FAILS  # epsilon does not fall
    rising = {1: 100.0, 2: 200.0, 3: 300.0, 6: 400.0}
    assert verdict(with_depth(rising, 8.0), "depth")[0] == FAILS
    untested, why = verdict(with_depth(flat, 8.0, converged=False), "depth")
    assert untested == UNTESTABLE and "converged at no layer" in why
    no_profile = with_depth(flat, 8.0)
    del no_profile["profile"]
    assert verdict(no_profile, "depth") == (
        UNTESTABLE,
        "no converged layer in the all-layer profile (pass --profile)",
    )


def arch_row(name, kappa_95, grows=True):
    return {
        "architecture": name,
        "kappa_hat": sum(kappa_95) / 2,
        "kappa_95": kappa_95,
        "n_causal_grows": grows,
    }


def test_architecture_invariance():
    results = make_results()
    rows = [arch_row("topk", [300, 500]), arch_row("jumprelu", [450, 700])]
    results["controls"] = {"architectures": {"rows": rows}}
    assert verdict(results, "architectures")[0] == HOLDS
    rows[1] = arch_row("jumprelu", [600, 900])
    assert verdict(results, "architectures")[0] == FAILS
    rows[1] = arch_row("jumprelu", [600, 900], grows=False)
    assert verdict(results, "architectures")[0] == UNTESTABLE
    results["controls"] = {}
    assert verdict(results, "architectures") == (
        UNTESTABLE,
        "the architectures control was not run (pass --controls architectures)",
    )


def test_threshold_robustness():
    results = make_results()
    rows = [{"percentile": p, "kappa_hat": k} for p, k in ((95, 400), (98, 430), (99.5, 520))]
    results["controls"] = {"thresholds": {"rows": rows, "n_growing": 3, "n_growths": 3}}
    assert verdict(results, "thresholds")[0] == HOLDS
    rows[2]["kappa_hat"] = 900
    assert verdict(results, "thresholds")[0] == FAILS
    results["controls"]["thresholds"]["n_growing"] = 2
    assert verdict(results, "thresholds")[0] == UNTESTABLE


def geometry_result(n_causal, differing, spread=0.2):
    rows = [{"width": w, "nn_cosine": {"n_causal": n_causal}} for w in (64, 128, 256, 512)]
    return {
        "rows": rows,
        "widths_differing": {"nn_cosine": differing, "decoder_norm": [64, 128, 256]},
        "max_decoder_norm_spread": spread,
    }


def test_geometric_privilege():
    results = make_results()
    results["controls"] = {"geometry": geometry_result(40, [64, 128])}
    assert verdict(results, "geometry")[0] == HOLDS
    # norms all equal (a sphere): the norm comparison does not count
    results["controls"] = {"geometry": geometry_result(40, [64], spread=0.0)}
    assert verdict(results, "geometry")[0] == FAILS
    results["controls"] = {"geometry": geometry_result(3, [64, 128])}
    assert verdict(results, "geometry")[0] == UNTESTABLE


def test_synthetic_four_cell_task_and_scale():
    results = make_results()
    results["controls"] = {
        "synthetic": {"best_recall": {"recall": 0.0, "width": 64}, "k": 8, "direct": {}},
        "four_cell": {"rows": [{"width": 64, "random_encoder_inflation": 9.0}]},
        "task": {"n_ground_truth": 20, "recovered_fraction": 0.95, "recovered_95": [0.76, 0.99]},
        "scale": {"models": ["a", "b"], "rows": [{"p_value": 0.4}, {"p_value": 0.03}]},
    }
    for key in ("synthetic", "four_cell", "task", "scale"):
        assert verdict(results, key)[0] == HOLDS, key  # scale: p 0.03 >= 0.05 / 2
    c = results["controls"]
    c["synthetic"]["best_recall"]["recall"] = 0.5
    c["four_cell"]["rows"][0]["random_encoder_inflation"] = 1.2
    c["task"]["recovered_95"] = [0.2, 0.6]
    c["scale"]["rows"][1]["p_value"] = 0.001
    for key in ("synthetic", "four_cell", "task", "scale"):
        assert verdict(results, key)[0] == FAILS, key
    c["four_cell"]["rows"][0]["random_encoder_inflation"] = None
    c["task"]["n_ground_truth"] = 2
    c["scale"] = {"skipped": "needs a second model of the family: pass --scale-model"}
    for key in ("four_cell", "task", "scale"):
        assert verdict(results, key)[0] == UNTESTABLE, key
    assert "pass --scale-model" in verdict(results, "scale")[1]


def test_every_claim_is_decided_once_in_the_rules_order():
    found = claims(make_results())
    assert [c.key for c in found] == [r.key for r in RULES]
    assert len(RULES) >= 12 and all(c.verdict in (HOLDS, FAILS, UNTESTABLE) for c in found)


@pytest.mark.parametrize("key", ["n_causal_growth", "kappa_hat", "kappa_pr", "coverage"])
def test_the_claims_table_and_beside_the_paper_never_disagree(key):
    results = make_results()
    shown = figures(results)[key]
    beside = text(beside_paper, results=results)
    assert f"| {shown.label} | {shown.this_run} | {shown.paper} |" in beside
    table = text(claims_section, results=results)
    assert shown.this_run in table  # the claims quote the same figure, not a recomputation


def test_the_report_says_what_each_width_loses_to_the_firing_floor():
    from causaldim.report.sections import headline as headline_section
    from causaldim.report.tables import width_rows

    results = make_results()
    a = headline(results)
    a["sensitivity"].update(min_firings=20, n_too_rare=[0, 12, 340])
    a["per_width"][-1]["median_firings_eval"] = 14.0
    md = text(headline_section, results=results)
    assert "firing tokens (features with 20+ eval firings)" in md
    assert "too rare to score, per width: 0 / 12 / 340" in md
    assert "the widest SAE's median feature fires 14.0 times in eval, below the floor" in md
    assert [r["n_too_rare_other"] for r in width_rows(results)] == [0, 12, 340]
