"""The report's sweep sections: per architecture, epsilon and its calibration, the counts
per width, the fits, and the diagnostics of the estimator (firings, kappa_SAE, how the
reference's causal features split), each from results.json's "sweep"."""

from __future__ import annotations

import math
from pathlib import Path

from ..fmt import ci, ci_of, features, num, pct, sci
from .doc import Doc

CRITERIA = {"aicc": "AICc", "aic": "AIC (too few widths for AICc)"}


def sweeps(doc: Doc, results: dict, figures: dict[str, Path]) -> None:
    d = results["store"]["model"]["d_model"]
    for arch_name, arch_results in results["sweep"].items():
        doc.h(2, f"The sweep: {arch_name} SAEs")
        doc.p(
            f"epsilon = {arch_results['epsilon']:.4g} (the {arch_results['percentile']:g}th "
            f"percentile of AtP at width {arch_results['reference_width']}; 95% interval "
            f"{sci(arch_results['epsilon_95'])}); {arch_results['n_eval_tokens']:,} eval "
            f"tokens in {arch_results['blocks']} blocks, {arch_results['bootstrap']} "
            "bootstrap resamples (re-scored, re-calibrated, re-counted, re-fitted). N_causal "
            f"at width {arch_results['reference_width']:,} is fixed by that calibration "
            f"({100 - arch_results['percentile']:g}% of the width, marked): it says nothing "
            "about the layer."
        )
        doc.table(
            [
                "width",
                "N_repr",
                "N_repr 95%",
                "N_causal",
                "N_causal 95%",
                *(["too rare"] if arch_results["normalisation"] == "firing" else []),
                "inert",
                "L0",
                "FVE",
                "dead",
                "CE rec.",
            ],
            [
                [
                    f"{r['width']:,}",
                    f"{r['n_repr']:,}",
                    ci_of(r["n_repr"], r.get("n_repr_95")),
                    f"{r['n_causal']:,}"
                    + (" (calibration)" if r["width"] == arch_results["reference_width"] else ""),
                    ci_of(r["n_causal"], r.get("n_causal_95")),
                    *(
                        [f"{r.get('n_too_rare', 0):,}"]
                        if arch_results["normalisation"] == "firing"
                        else []
                    ),
                    pct(r["inert_fraction"]),
                    num(r["l0"]),
                    num(r["fraction_variance_explained"], 3),
                    pct(r["dead_fraction"]),
                    num(r["ce_loss_recovered"], 3),
                ]
                for r in arch_results["per_width"]
            ],
        )
        diagnostics(doc, arch_results)
        kappas = arch_results["kappa"]
        if not arch_results["estimable"]:
            doc.p(
                f"kappa_hat is not estimable: {arch_results['not_estimable']}. No fit is "
                "shown: a saturating curve through counts that do not grow has no asymptote "
                "to read (the counts are in the table above; tables/fits.csv keeps the fits)."
            )
        fitted = (("free", "free"), ("at_most_d", "kappa <= d"))
        for bound_name, label in fitted if arch_results["estimable"] else ():
            k = kappas[bound_name]
            if bound_name == "at_most_d" and not arch_results["constraint_binds"]:
                doc.p(f"The constraint kappa <= d = {d} binds no fit: the same table holds.")
                continue
            doc.p(
                f"Saturating fits ({label}), every form side by side; chosen by "
                f"{CRITERIA[k['criterion']]}: {k['form']}."
            )
            doc.table(
                [
                    "form",
                    "kappa_hat",
                    "95% CI",
                    "AICc",
                    "AIC",
                    "width for 95% (features)",
                    "won in resamples",
                    "note",
                ],
                [
                    [
                        form,
                        f"{fit['kappa']:,.0f}",
                        ci(fit["interval_95"]),
                        num(fit["aicc"], 2),
                        f"{fit['aic']:.2f}",
                        features(fit["width_95"], unit=False),
                        pct(k["form_frequency"].get(form, math.nan)),
                        f"{fit['at_bound']} at its bound" if fit["at_bound"] else "",
                    ]
                    for form, fit in k["fits"].items()
                ],
            )
        for key in (f"wedge_{arch_name}", f"atp_{arch_name}"):
            if key in figures:
                doc.img(figures[key], key)


def diagnostics(doc: Doc, a: dict) -> None:
    """What the estimator does in this sweep: the Markov ceiling, the regime, firings,
    the other normalisation, the seeds' spread and the split-robust estimate; then how
    the reference's causal features split."""
    regime, other = a["regime"], a["sensitivity"]
    doc.p(
        f"Diagnostics. The reference width is {regime['reference_over_d']:.2f} d and the "
        f"widest {regime['widest_over_d']:.1f} d (the paper: "
        f"{regime['paper_reference_over_d']:.1f} d and {regime['paper_widest_over_d']:.0f} d). "
        "A = sum_i AtP_i bounds N_causal <= A / epsilon (Markov). Firings: the median "
        "feature's, in training (tokens x epochs) and in eval; top 2%: the median firing "
        "rate of the 2% of features with the highest AtP. N_causal' counts with AtP "
        f"averaged over the {other['normalisation']} tokens (its own epsilon "
        f"{other['epsilon']:.3g}). kappa_SAE: the erank of E[v v^T], with "
        "v = sum_i f_i (g . d_i) d_i the loss gradient seen through the active features, "
        "which splitting a feature leaves unchanged."
        + (attributed_text(a["attributed"]) if a.get("attributed") else "")
        + (
            f" {a['seeds']} trainings per width: N_causal of each at this epsilon, and "
            "intervals that draw one training per width per resample."
            if a.get("seeds", 1) > 1
            else ""
        )
    )
    att = {r["width"]: r for r in (a.get("attributed") or {}).get("per_width", [])}
    head = [
        "width",
        "A",
        "A / epsilon",
        "N_causal",
        "N_causal'",
        "firings (train)",
        "firings (eval)",
        "top 2% rate",
        "kappa_SAE [95%]",
    ]
    if a.get("seeds", 1) > 1:
        head.append("N_causal per seed")
    rows = []
    for r in a["per_width"]:
        row = [
            f"{r['width']:,}",
            num(r["atp_total"], 3),
            num(r["markov_ceiling"]),
            f"{r['n_causal']:,}",
            f"{r['n_causal_other']:,}",
            num(r["median_firings_train"]),
            num(r["median_firings_eval"]),
            pct(r["top_firing_rate"]),
            f"{num(att[r['width']]['erank'])} "
            f"{ci_of(att[r['width']]['erank'], att[r['width']]['erank_95'])}"
            if r["width"] in att
            else "n/a",
        ]
        if a.get("seeds", 1) > 1:
            row.append(", ".join(map(str, r.get("n_causal_seeds", []))))
        rows.append(row)
    doc.table(head, rows)
    if a.get("splits"):
        doc.p(
            f"How the reference's {a['splits'][0]['parents']} causal features split: at each "
            "wider width, the medians over them of the best decoder cosine, the children "
            "(wider features whose nearest reference direction they are, at cosine >= 0.5), "
            "the largest child's share of the children's eval firings (1: not split), and "
            "the children's firings over the parent's own."
        )
        doc.table(
            ["width", "best cosine", "children", "largest child's share", "children / parent"],
            [
                [
                    f"{r['width']:,}",
                    num(r["best_cosine"], 2),
                    num(r["children"]),
                    pct(r["top_child_share"]),
                    num(r["children_firings_over_parent"], 2),
                ]
                for r in a["splits"]
            ],
        )


def attributed_text(att: dict) -> str:
    """kappa_SAE at the widest SAE, said to be a plug-in (outside the headline)."""
    change = att["change_at_widest"]
    moved = "" if change is None else f", {100 * change:+.1f}% from the second widest"
    return (
        f" At the widest SAE kappa_SAE is {num(att['widest'])} "
        f"{ci_of(att['widest'], att['widest_95'])}{moved}. "
        "It is a plug-in erank, biased low at few samples per dimension and not corrected "
        "as the direct kappa is, so the headline does not set it beside the direct kappa."
    )
