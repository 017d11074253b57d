"""The text of the report: the summary printed at the end of a run, and the report's
sections (headline, beside the paper, each sweep, direct Sigma, the controls,
provenance), each formatting numbers that results.json holds."""

from __future__ import annotations

import math
from pathlib import Path

from ..model.sites import aliases
from ..presets import command_for
from .cautions import lines as caution_lines
from .claims_doc import claims_section
from .conditions import conditions_lines
from .direct import direct_kappa, direct_sigma, outlier_choice, profile_section, rounds_line
from .doc import Doc
from .fmt import ci, ci_of, features, growth, num, pct, sci
from .paper_figures import figures as paper_figures
from .paper_figures import growth_ci, reading

CRITERIA = {"aicc": "AICc", "aic": "AIC (too few widths for AICc)"}


def _hardware(config: dict, threads: dict | None = None) -> str:
    h, sweep = config["harvest"], config["sweep"]
    used = (
        f"; {threads['threads']} thread(s) of {threads['usable_cores']} usable core(s), "
        f"by {threads['chosen_by']}"
        if threads
        else ""
    )
    return (
        f"ran on {h.get('device', 'cpu')}: model pass in {h['dtype']}, batches of "
        f"{h['batch_size']} sequences; SAE encoder product in {sweep['sae_dtype']}; SAE jobs "
        + ("on Ray" if sweep.get("executor") == "ray" else "in process")
        + used
    )


def summary(results: dict) -> str:
    """The few lines printed at the end of a run."""
    arch = results["headline"]["architecture"]
    a = results["sweep"][arch]
    w = a["wedge"]
    lines = [
        f"{arch} sweep {a['per_width'][0]['width']}..{a['per_width'][-1]['width']}: "
        f"N_repr {growth(w['n_repr_growth'])}, N_causal {growth(w['n_causal_growth'])} "
        f"over x{w['width_ratio']:g} in width (AtP over {a['normalisation']} tokens; over "
        f"{a['sensitivity']['normalisation']} tokens: "
        f"{growth(a['sensitivity']['n_causal_growth'])}); epsilon {a['epsilon']:.3g}",
        kappa_line(a),
        *[x for x in (outlier_choice(results), rounds_line(results)) if x],
        *conditions_lines(results),
    ]
    warned = results.get("warnings") or []
    if warned:
        lines.append(f"read with care ({len(warned)}):")
        lines += [f"  {line}" for line in caution_lines(warned)]
    return "\n".join(lines)


def kappa_line(a: dict) -> str:
    """kappa_hat with its interval, or why there is none."""
    if not a["estimable"]:
        return f"kappa_hat: not estimable ({a['not_estimable']})"
    free, bounded = a["kappa"]["free"], a["kappa"]["at_most_d"]
    return (
        f"kappa_hat {free['kappa']:.0f} {ci(free['interval_95'])} ({free['form']}, by "
        f"{CRITERIA[free['criterion']]}), kappa_hat/d "
        f"{free['kappa_over_d']:.2f}, coverage {pct(free['coverage'])}; constrained to d: "
        f"{bounded['kappa']:.0f} {ci(bounded['interval_95'])}"
    )


def attributed_text(att: dict) -> str:
    """kappa_SAE at the widest SAE, said to be a plug-in (outside the headline)."""
    change = att["change_at_widest"]
    moved = "" if change is None else f", {100 * change:+.1f}% from the second widest"
    return (
        f" At the widest SAE kappa_SAE is {num(att['widest'])} {ci(att['widest_95'])}{moved}. "
        "It is a plug-in erank, biased low at few samples per dimension and not corrected "
        "as the direct kappa is, so the headline does not set it beside the direct kappa."
    )


def build_report(results: dict, figures: dict[str, Path]) -> Doc:
    """The whole report, section by section."""
    from ..controls import report_controls  # the controls render their own sections

    doc = Doc()
    title(doc, results)
    read_with_care(doc, results)
    headline(doc, results)
    beside_paper(doc, results)
    claims_section(doc, results)
    sweeps(doc, results, figures)
    direct_sigma(doc, results, figures)
    profile_section(doc, results, figures)
    subspace_section(doc, results, figures)
    report_controls(doc, results, figures)
    provenance(doc, results)
    return doc


def read_with_care(doc: Doc, results: dict) -> None:
    """Every warning the run raised, first thing after the title (cautions touch the
    headline's numbers; notes the rest)."""
    warned = results.get("warnings") or []
    if warned:
        doc.h(2, "Read with care")
        doc.ul(caution_lines(warned))


def extended(store: dict) -> str:
    """The --headline-tokens extension in words, or nothing."""
    ext = store.get("headline_extension")
    if not ext:
        return ""
    how = "a pass that skips the head" if ext["pass"] == "headline" else "the full pass"
    return (
        f" (and {ext['tokens']:,} more eval tokens for the headline reading alone, by {how}: "
        "the loss, literal and Fisher readings, AtP and CE read the eval split)"
    )


def title(doc: Doc, results: dict) -> None:
    s = results["store"]
    d = s["model"]["d_model"]
    model, corpus = results["inputs"]["model"], results["inputs"]["corpus"]
    doc.h(1, f"Causal dimensionality of {model['name']}, layer {s['layer']}")
    known_as = model.get("description", model["name"])
    doc.p(
        ("" if known_as == model["name"] else f"{known_as}. ")
        + f"Residual stream at the {s['site']}, named elsewhere {aliases(s['layer'])}; "
        f"d = {d}; corpus: {corpus.get('description', corpus['id'])}; "
        f"{s['tokens']['train']:,} train and {s['tokens']['eval']:,} eval tokens"
        f"{extended(s)} in sequences of {s['seq_len']}; "
        f"outliers left out: {s['outliers']['n_outliers']:,} tokens "
        f"carrying {pct(s['outliers']['variance_share'])} of the residual variance. "
        f"Preset {results['preset']}, seed {results['seed']}, causaldim "
        f"{results['causaldim_version']}, {results['seconds']['total']:.0f} s "
        f"({results['seconds']['total'] / 60:.1f} min) in all."
    )
    doc.p(f"The same settings: `{command_for(results['preset'], results['config'])}`.")


def headline(doc: Doc, results: dict) -> None:
    arch = results["headline"]["architecture"]
    a = results["sweep"][arch]
    free = a["kappa"]["free"]
    sigma = results.get("sigma", {})
    doc.h(2, "Headline")
    d = results["store"]["model"]["d_model"]
    this, paper = conditions_lines(results)
    choice = [x for x in (outlier_choice(results), rounds_line(results)) if x]
    kappa, *beside = direct_kappa(sigma, d)
    items = [
        kappa,
        *choice,
        *beside,
        f"Measured under these conditions. {this} {paper}",
    ]
    if a["estimable"]:
        bounded = a["kappa"]["at_most_d"]
        items += [
            f"SAE estimate ({arch}, {free['form']} fit chosen by "
            f"{CRITERIA[free['criterion']]}): kappa_hat = "
            f"{free['kappa']:,.0f}, 95% bootstrap interval {ci(free['interval_95'])}; "
            f"kappa_hat / d = {free['kappa_over_d']:.2f}; coverage at the widest SAE "
            f"N_causal(m_max) / kappa_hat = {pct(free['coverage'])}; 95% of kappa_hat is "
            f"reached at a width of {features(free['width_95'])}.",
            f"Constrained to kappa <= d: kappa_hat = {bounded['kappa']:,.0f} "
            f"{ci(bounded['interval_95'])} ({bounded['form']}).",
        ]
    else:
        items.append(
            f"SAE estimate ({arch}): kappa_hat not estimable: {a['not_estimable']}. The "
            "fits below describe a level, not an asymptote."
        )
    w, other = a["wedge"], a["sensitivity"]
    items.append(
        f"The wedge over x{w['width_ratio']:g} in width: N_repr grows "
        f"{growth(w['n_repr_growth'])} ({slope(w, 'n_repr')}), N_causal "
        f"{growth(w['n_causal_growth'])} "
        f"{ci_of(w['n_causal_growth'], w.get('n_causal_growth_95'), 2)} "
        f"({slope(w, 'n_causal')}); at the widest SAE "
        f"{pct(a['per_width'][-1]['inert_fraction'])} of firing features fall below epsilon. "
        f"With AtP averaged over the {reading(other)} instead of the "
        f"{reading(a)}, N_causal grows {growth_ci(other)} "
        f"({' -> '.join(map(str, other['n_causal']))})" + rare_text(other, a) + "."
    )
    doc.ul(items)


def rare_text(counted: dict, a: dict) -> str:
    """How many features each width loses to the firing reading's floor (counted: the
    sensitivity's counts), and whether the widest SAE's median feature clears it."""
    rare = counted.get("n_too_rare") or []
    if counted.get("normalisation") != "firing" or not any(rare):
        return ""
    median = a["per_width"][-1].get("median_firings_eval")
    floor = counted.get("min_firings") or 1
    clears = (
        ""
        if median is None
        else f"; the widest SAE's median feature fires {num(median)} times in eval, "
        + ("clearing" if median >= floor else "below")
        + " the floor"
    )
    return f"; too rare to score, per width: {' / '.join(f'{n:,}' for n in rare)}{clears}"


def slope(w: dict, key: str) -> str:
    """The log-log slope, saying how many widths it rests on where zeros were left out."""
    text = f"log-log slope {num(w[f'{key}_loglog_slope'], 2)}"
    used, of = w.get(f"{key}_loglog_widths"), w.get("widths")
    if used is not None and of is not None and used < of:
        text += f", from {used} of {of} widths (zero counts left out)"
    return text


def beside_paper(doc: Doc, results: dict) -> None:
    paper = results["paper"]
    doc.h(2, "Beside the paper")
    doc.p(
        f"The paper: {paper['source']} (d = {paper['d_model']:,}, x{paper['width_ratio']} "
        "in width). Counts are forced by calibration at the reference width; compare "
        "growth and shapes, not levels. The claims these numbers test are decided under "
        '"The paper\'s claims, tested".'
    )
    doc.table(
        ["quantity", "this run", "paper"],
        [[f.label, f.this_run, f.paper] for f in paper_figures(results).values()],
    )


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
                f"kappa_hat is not estimable: {arch_results['not_estimable']}. The fits "
                "below describe the counts' level, not an asymptote."
            )
        for bound_name, label in (("free", "free"), ("at_most_d", "kappa <= d")):
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
            f"{num(att[r['width']]['erank'])} {ci(att[r['width']]['erank_95'])}"
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


def subspace_section(doc: Doc, results: dict, figures: dict[str, Path]) -> None:
    sub = results.get("subspace") or {}
    if not sub.get("reading"):
        return
    doc.h(2, "The causal subspace")
    doc.p(
        f"The top {sub['k']} eigenvectors of Sigma_{sub['reading']} hold "
        f"{pct(sub['share_of_trace'])} of its (corrected) trace: the subspace S, {sub['k']} of "
        f"d = {sub['d']} dimensions, saved with every reading's full basis under "
        f"{', '.join(sub['files'].values())} (causaldim.load_subspace reads them). For each "
        "SAE: the mean share of a decoder direction's squared norm inside S, for the "
        "features AtP calls causal and for the other firing ones, against a random "
        "direction's k / d; and the rank correlation of the share with AtP."
    )
    rows = [
        [
            arch,
            f"{r['width']:,}",
            pct(r["chance"]),
            pct(r["mean_share_causal"]) if r["mean_share_causal"] is not None else "n/a",
            r["n_causal"],
            pct(r["mean_share_other"]) if r["mean_share_other"] is not None else "n/a",
            num(r["spearman_share_atp"], 2),
        ]
        for arch, by_width in sub["saes"].items()
        for r in by_width
    ]
    doc.table(
        ["SAE", "width", "chance (k/d)", "share, causal", "causal", "share, other", "Spearman"],
        rows,
    )
    if "subspace" in figures:
        doc.img(figures["subspace"], "subspace")


def provenance(doc: Doc, results: dict) -> None:
    s = results["store"]
    name = results["inputs"]["model"]["name"]
    doc.h(2, "Provenance")
    ce = results.get("ce")
    identity = results["inputs"]["model"]
    files = identity.get("files") or {}
    items = [
        f"model {name} ({identity.get('family')}): "
        + (
            ", ".join(f"{f} {digest}" for f, digest in files.items())
            or f"hub {identity.get('hub_id')} revision {identity.get('revision')}"
        ),
        f"corpus {results['inputs']['corpus']['id']}, sha256 "
        f"{results['inputs']['corpus'].get('sha256', 'n/a')}",
        f"store {results['inputs']['store']['path']} "
        f"({'reused' if s['reused'] else 'written by this run'}), manifest sha256 "
        f"{results['inputs']['store']['manifest_sha256']}",
        _hardware(results["config"], results.get("threads")),
        "versions: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items()),
        "seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in results["seconds"].items()),
    ]
    items += [
        imported_line(name, sae["source"])
        for name, sae in results["saes"].items()
        if sae.get("source")
    ]
    dropped = [name for name, sae in results["saes"].items() if sae.get("weights_dropped")]
    if dropped:
        items.append(
            f"weights dropped once scored (--drop-weights): {', '.join(dropped)}; their "
            "scores and decoder digests are kept under scores/, the reference's weights too"
        )
    if ce:
        items.append(
            f"CE loss recovered on {ce['n_predictions']:,} predictions: clean loss "
            f"{ce['clean_loss']:.3f}, mean-ablated {ce['mean_ablated_loss']:.3f}"
        )
    doc.ul(items)


def imported_line(name: str, src: dict) -> str:
    """Where an imported SAE came from, and the site its metadata names."""
    if src.get("release"):
        where = (
            f"{src['release']} {src['id']} (hub {src['repo']}, revision "
            f"{src.get('revision') or 'unknown'}), read from {src['path']}"
        )
    else:
        where = f"{src.get('format', 'file')} {src['path']}"
    site = (
        f"site {src['site']} (the output of block {src['block']}, checked against the layer)"
        if src.get("block") is not None
        else "site unknown (its metadata names none; not checked against the layer)"
    )
    note = f"; note: {src['note']}" if src.get("note") else ""
    return f"imported SAE {name}: {where}; {site}{note}"
