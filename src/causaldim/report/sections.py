"""The text of the report: the summary printed at the end of a run, and the report's
sections (headline, beside the paper, each sweep, direct Sigma, the controls,
provenance), each formatting numbers that results.json holds."""

from __future__ import annotations

from pathlib import Path

from ..claims.conditions import conditions_lines
from ..fmt import ci_of, features, growth, num, pct
from ..model.sites import aliases
from ..presets import command_for
from .cautions import outlier_count
from .claims_doc import claims_section
from .direct import (
    direct_kappa,
    direct_sigma,
    outlier_choice,
    profile_section,
    rounds_line,
)
from .doc import Doc
from .first_screen import caution_words, claims_lines, direct_line, first_screen
from .metric import ladder_section, weights_section
from .paper_figures import figures as paper_figures
from .paper_figures import growth_ci, reading
from .sweep_sections import CRITERIA, sweeps


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
        kappa_line_plain(results),
        *claims_lines(results, links=False),
        f"{arch} sweep {a['per_width'][0]['width']}..{a['per_width'][-1]['width']}: "
        f"N_repr {growth(w['n_repr_growth'])}, N_causal {growth(w['n_causal_growth'])} "
        f"over x{w['width_ratio']:g} in width (AtP over {a['normalisation']} tokens; over "
        f"{a['sensitivity']['normalisation']} tokens: "
        f"{growth(a['sensitivity']['n_causal_growth'])}); epsilon {a['epsilon']:.3g}",
        kappa_line(a),
        *[x for x in (outlier_choice(results), rounds_line(results)) if x],
        *conditions_lines(results),
    ]
    words = caution_words(results)
    if words:
        lines.append(f"read with care ({len(words)}):")
        lines += [f"  {line.replace('`', '')}" for line in words]
    return "\n".join(lines)


def kappa_line_plain(results: dict) -> str:
    return direct_line(results).replace("**", "")


def kappa_line(a: dict) -> str:
    """kappa_hat with its interval, or why there is none."""
    if not a["estimable"]:
        return f"kappa_hat: not estimable ({a['not_estimable']})"
    free, bounded = a["kappa"]["free"], a["kappa"]["at_most_d"]
    return (
        f"kappa_hat {free['kappa']:.0f} {ci_of(free['kappa'], free['interval_95'])} "
        f"({free['form']}, by "
        f"{CRITERIA[free['criterion']]}), kappa_hat/d "
        f"{free['kappa_over_d']:.2f}, coverage {pct(free['coverage'])}; constrained to d: "
        f"{bounded['kappa']:.0f} {ci_of(bounded['kappa'], bounded['interval_95'])}"
    )


def build_report(results: dict, figures: dict[str, Path]) -> Doc:
    """The whole report, section by section."""
    from ..controls import report_controls  # the controls render their own sections

    doc = Doc()
    doc.h(1, title_text(results))
    first_screen(doc, results)  # the answer, the verdicts, the cautions
    title(doc, results)  # then where it comes from
    headline(doc, results)
    beside_paper(doc, results)
    claims_section(doc, results)
    sweeps(doc, results, figures)
    direct_sigma(doc, results, figures)
    profile_section(doc, results, figures)
    weights_section(doc, results, figures)
    ladder_section(doc, results, figures)
    subspace_section(doc, results, figures)
    report_controls(doc, results, figures)
    provenance(doc, results)
    return doc


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


def rounds_used(results: dict) -> str:
    """--until-converged: the eval tokens the headline read in the end, all rounds."""
    uc = results.get("until_converged")
    if not uc or not uc.get("rounds"):
        return ""
    return (
        f" (--until-converged: the headline read {uc['rounds'][-1]['eval_tokens']:,} eval "
        f"tokens over {len(uc['rounds'])} round(s))"
    )


def title_text(results: dict) -> str:
    return (
        f"Causal dimensionality of {results['inputs']['model']['name']}, layer "
        f"{results['store']['layer']}"
    )


def title(doc: Doc, results: dict) -> None:
    """The run's provenance in one paragraph, and the command that repeats it."""
    s = results["store"]
    d = s["model"]["d_model"]
    model, corpus = results["inputs"]["model"], results["inputs"]["corpus"]
    known_as = model.get("description", model["name"])
    doc.p(
        ("" if known_as == model["name"] else f"{known_as}. ")
        + f"Residual stream at the {s['site']}, named elsewhere {aliases(s['layer'])}; "
        f"d = {d}; corpus: {corpus.get('description', corpus['id'])}; "
        f"{s['tokens']['train']:,} train and {s['tokens']['eval']:,} eval tokens"
        f"{extended(s)}{rounds_used(results)} in sequences of {s['seq_len']}; "
        f"outliers left out: {outlier_count(s['outliers'], s['seq_len'])}, "
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
            f"{free['kappa']:,.0f}, 95% bootstrap interval "
            f"{ci_of(free['kappa'], free['interval_95'])}; "
            f"kappa_hat / d = {free['kappa_over_d']:.2f}; coverage at the widest SAE "
            f"N_causal(m_max) / kappa_hat = {pct(free['coverage'])}; 95% of kappa_hat is "
            f"reached at a width of {features(free['width_95'])}.",
            f"Constrained to kappa <= d: kappa_hat = {bounded['kappa']:,.0f} "
            f"{ci_of(bounded['kappa'], bounded['interval_95'])} ({bounded['form']}).",
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
