"""The direct estimates in words and tables: the headline's direct kappa, the plain-text
table the CLI prints, the report's "Direct Sigma" and "Every layer" sections. Every
number comes from results.json's "sigma" and "profile"."""

from __future__ import annotations

from pathlib import Path

from ..claims.conditions import kappa_intervals
from ..fmt import ci, ci_of, num, pct
from ..measures.debias import REPORT_FLOOR
from ..measures.sigma import DEFINITIONS, HEADLINE
from .doc import Doc

PULL_BACK = (
    "J is the full pull-back to the residual at each position: the Jacobian of every later "
    "position's logits, through attention, the gradient attribution patching uses"
)


METRICS = (
    "The raw reading counts directions per unit of Euclidean change of the residual (the "
    "paper's definition; it moves with how the model scales its coordinates, e.g. its norm "
    "gains). The activation-weighted one, kappa_act = erank(C^1/2 Sigma C^1/2) with C the "
    "activations' covariance, counts directions of the representation's own fluctuation "
    "that move the output, each weighed by what mean-ablating it costs to first order; no "
    "invertible linear map of the residual changes it."
)


def by_metric(sigma: dict) -> list[tuple[str, str, dict]]:
    """(reading, metric, estimate): every reading raw, then each output reading's
    activation-weighted twin ("act")."""
    raw = [(r, "raw", e) for r, e in sigma.items()]
    act = [
        (r, "act", e["activation_weighted"])
        for r, e in sigma.items()
        if e.get("activation_weighted")
    ]
    return raw + act


def metric_line(sigma: dict, d: int) -> str | None:
    """The direct kappa in both metrics, one line (the CLI's end-lines)."""
    est = sigma.get(HEADLINE)
    if est is None:
        return None

    def one(e: dict) -> str:
        over = (
            ""
            if below_floor(e) or e.get("erank_corrected") is None
            else f", {e['erank_corrected'] / d:.2f} d"
        )
        return flagged(e) + over

    act = est.get("activation_weighted")
    return f"direct kappa ({HEADLINE}): raw {one(est)}" + (
        f"; activation-weighted {one(act)}" if act else ""
    )


def converged_at(results: dict) -> float:
    """Independent equivalents per dimension that "converged" took in this run (4 before
    results.json recorded it)."""
    return results.get("min_independent_per_dim", 4.0)


def below_floor(est: dict) -> bool:
    """Too few independent equivalents per dimension for the corrected erank to be given
    as a value: the correction then moves it by half or more (0.2 per dimension turned a
    plug-in 223 into 463 [416, 509])."""
    n, per_dim = est.get("n_independent"), est.get("samples_per_dim")
    if n is None or not per_dim or not est.get("n_samples"):
        return False
    d = est["n_samples"] / per_dim
    return n < REPORT_FLOOR * d


def _with_interval(est: dict) -> str:
    value = est.get("erank_corrected")
    if below_floor(est):  # no corrected value was computed
        d = est["n_samples"] / est["samples_per_dim"]
        return (
            f"n/a (not converged: {est['n_independent'] / d:.1f} independent equivalents per "
            f"dimension, below {REPORT_FLOOR:g}; the plug-in {num(est.get('erank'))} is biased "
            "low)"
        )
    digits = 0 if value is None or abs(value) >= 100 else 1  # as num() writes the value
    return f"{num(value)} {ci(est.get('erank_corrected_95'), digits)}".strip()


def starred(est: dict) -> str:
    """A corrected erank with its interval, starred where it has not converged (for
    tables whose notes say how many eval tokens would do)."""
    return _with_interval(est) + ("*" if est.get("converged") is False else "")


def flagged(est: dict) -> str:
    """A corrected erank with its interval, marked where it has not converged."""
    text = _with_interval(est)
    if below_floor(est):  # the n/a already says it has not converged
        need = est.get("eval_tokens_needed")
        return text if not need else f"{text[:-1]}; about {need:,} eval tokens would do)"
    if est.get("converged") is False:
        text += (
            f" (not converged; about {est['eval_tokens_needed']:,} eval tokens would do)"
            if est.get("eval_tokens_needed")
            else " (not converged)"
        )
    return text


def _independent(est: dict, d: int) -> str:
    return (
        f"{est['n_independent']:,.0f} independent equivalents "
        f"({est['n_independent'] / d:.1f} per dimension; n_eff {est['n_eff']:,.0f})"
    )


def direct_kappa(sigma: dict, d: int) -> list[str]:
    """The headline's direct lines: the direct kappa (the gauge-invariant logits
    reading), the paper's literal uncentred reading with its share along the shift of
    all logits, and the other readings by name."""
    lines = []
    if HEADLINE in sigma:
        est = sigma[HEADLINE]
        pr = est.get("participation_ratio_unbiased")
        state = "converged" if est["converged"] else "NOT converged"
        lines.append(
            f"Direct kappa = {DEFINITIONS[HEADLINE]} (the logits reading, each probe centred "
            f"over the vocabulary; J pulled back through every later position, as AtP's "
            f"gradient is), from {est['n_tokens']:,} eval tokens: {flagged(est)}"
            + ("" if below_floor(est) else f", {est['erank_corrected'] / d:.2f} d")
            + ", corrected "
            f"for finite samples (95%: sequences, simulation and remaining drift); {state}, "
            f"{_independent(est, d)}; participation ratio "
            f"{num(pr)} {ci_of(pr, est.get('participation_ratio_unbiased_95'))}."
        )
        act = est.get("activation_weighted")
        if act:
            lines.append(
                f"Activation-weighted, kappa_act = {act['definition']}, from the same samples: "
                f"{flagged(act)}"
                + ("" if below_floor(act) else f", {act['erank_corrected'] / d:.2f} d")
                + f", {'converged' if act['converged'] else 'NOT converged'}; C is "
                "re-estimated in every resample, so its error is in the interval. " + METRICS
            )
    else:
        lines.append("Direct kappa: not measured (the run had no logit probes).")
    if "logits_uncentred" in sigma:
        est = sigma["logits_uncentred"]
        lines.append(
            f"The paper's literal {DEFINITIONS['logits_uncentred']} (uncentred probes): "
            f"{flagged(est)}; {pct(est.get('common_mode_share'))} of its trace lies along "
            "the shift of all logits, a direction the output distribution cannot see."
        )
    for reading in ("loss", "fisher"):
        if reading in sigma:
            est = sigma[reading]
            lines.append(
                f"Beside it, the {reading} reading, {DEFINITIONS[reading]}, from "
                f"{est['n_tokens']:,} eval tokens: {flagged(est)}, "
                f"participation ratio {num(est['participation_ratio_unbiased'])}."
            )
    direct = [r for r in DEFINITIONS if r in sigma and r != "activations"]
    if direct:
        plug_ins = ", ".join(f"{r} {sigma[r]['erank']:.0f}" for r in direct)
        lines.append(f"Plug-in eranks (biased low by finite samples): {plug_ins}.")
    return lines


def sigma_table(results: dict) -> str:
    """A plain-text table of the direct estimates: corrected, then plug-in."""
    d = results["store"]["model"]["d_model"]
    rows = [
        f"{'reading':<17} {'metric':<6} {'erank':>8} {'95% interval':>17} {'/d':>6} "
        f"{'PR':>7} {'plug-in':>8} {'indep./d':>8} {'converged':>9} {'tokens':>7}"
    ]
    for reading, metric, est in by_metric(results["sigma"]):
        corrected = est.get("erank_corrected")
        iv = est.get("erank_corrected_95")
        if below_floor(est):  # no value: see below_floor
            corrected, iv = None, None
        interval = f"[{iv[0]:7.1f}, {iv[1]:7.1f}]" if iv else f"{'n/a':>17}"
        independent = est.get("n_independent")
        converged = {True: "yes", False: "NO", None: "n/a"}[est.get("converged")]
        rows.append(
            f"{reading:<17} {metric:<6} {num(corrected):>8} {interval} "
            f"{'n/a' if corrected is None else f'{corrected / d:.3f}':>6} "
            f"{num(est.get('participation_ratio_unbiased')):>7} {est['erank']:8.1f} "
            f"{'n/a' if independent is None else f'{independent / d:.1f}':>8} {converged:>9} "
            f"{est['n_tokens']:>7,}"
        )
        if est.get("warning"):
            rows.append(f"  warning: {est['warning']}")
    rows.append(
        f"direct kappa: the logits reading, {DEFINITIONS[HEADLINE]}; erank and PR corrected "
        "for finite samples; plug-in: of the sample Sigma; act: the same reading weighted by "
        "the activations, erank(C^1/2 Sigma C^1/2), C = Cov[h]"
    )
    return "\n".join(rows)


def direct_sigma(doc: Doc, results: dict, figures: dict[str, Path]) -> None:
    sigma = results.get("sigma", {})
    if not sigma:
        return
    d = results["store"]["model"]["d_model"]
    doc.h(2, "Direct Sigma")
    doc.p(
        f"Each reading is Sigma = E[u u^T] of one rank-1 sample u per token (and probe); "
        f"{PULL_BACK}. The direct kappa is the logits reading's erank, its probes centred "
        "over the vocabulary; the uncentred reading is the paper's literal E[J^T J]. "
        "Corrected: the erank of the spectrum deconvolved from the sampling spread, the "
        "sampling (each sample's weight, and the correlation of samples along a sequence) "
        f"measured from the samples; converged where at least {converged_at(results):g} "
        "independent equivalents per dimension back it. Interval: 95%, a jackknife over "
        "groups of sequences, the simulation's spread and the change from half of the "
        "sequences to all. PR (U-stat.): from U-statistics over pairs of samples in different "
        "sequence blocks, set beside the corrected erank; plug-in erank and PR: of the sample "
        "Sigma, biased low, shown without an interval. A PR is never above the erank on the "
        "same footing (both corrected, or both plug-in); across footings it can be."
        + (
            " The headline (logits) reading and the activations also read the eval tokens "
            "beyond the eval split that a pass skipping the head harvested for them "
            "(--headline-tokens); the loss and Fisher readings, which need the head, and the "
            "literal one read the eval split alone, so each reading's tokens and convergence "
            "are its own."
            if results["store"].get("headline_extension")
            else ""
        )
    )
    if any(e.get("activation_weighted") for e in sigma.values()):
        doc.p(METRICS)
    rows = []
    for reading, metric, est in by_metric(sigma):
        corrected = est.get("erank_corrected")
        independent = est.get("n_independent")
        rows.append(
            [
                reading,
                metric,
                est.get("definition") or DEFINITIONS.get(reading, ""),
                flagged(est) if corrected is not None else "n/a",
                "n/a" if corrected is None or below_floor(est) else f"{corrected / d:.3f}",
                num(est.get("participation_ratio_unbiased")),
                ci(est.get("participation_ratio_unbiased_95")),
                f"{est['erank']:.1f}",
                num(est.get("participation_ratio")),
                "n/a" if independent is None else f"{independent:,.0f}",
                f"{est['n_tokens']:,}",
                f"{est['n_samples']:,}",
                est.get("warning") or "",
            ]
        )
    doc.table(
        [
            "reading",
            "metric",
            "erank of",
            "erank (corrected) [95%]",
            "/d",
            "PR (U-stat.)",
            "95% CI",
            "erank (plug-in)",
            "PR (plug-in)",
            "independent",
            "tokens",
            "samples",
            "warning",
        ],
        rows,
    )
    doc.p(kappa_intervals())
    other = results.get("sigma_other_outliers")
    if other:
        kept = next(iter(other.values()))["outliers"] == "kept"
        doc.p(
            f"The same eval tokens with the outliers {'kept' if kept else 'left out'} (the run "
            f"{'left them out' if kept else 'kept them'}); corrected with fewer draws and "
            "groups, so a wider interval:"
        )
        rows = []
        for reading, e in other.items():
            mine = sigma.get(reading, {}).get("erank_corrected")
            theirs = e["erank_corrected"]
            usable = mine is not None and theirs is not None and not below_floor(sigma[reading])
            rows.append(
                [
                    reading,
                    f"{mine:,.1f}" if usable and mine is not None else "n/a",
                    f"{theirs:,.1f} {ci(e['erank_corrected_95'])}" if usable else "n/a",
                    f"{100 * (theirs / mine - 1):+.1f}%" if usable and mine else "n/a",
                    f"{e['n_tokens']:,}",
                    "yes" if e["converged"] else "NO",
                ]
            )
        doc.table(
            ["reading", "as run", "other choice [95%]", "change", "tokens", "converged"], rows
        )
    if "logits_uncentred" in sigma:
        share = sigma["logits_uncentred"].get("common_mode_share")
        doc.p(
            f"{pct(share)} of the uncentred reading's trace lies along the shift of all "
            "logits (the all-ones direction of logit space, which the softmax ignores): the "
            "part that separates it from the direct kappa."
        )
    if "sigma" in figures:
        doc.img(figures["sigma"], "sigma")


def profile_section(doc: Doc, results: dict, figures: dict[str, Path]) -> None:
    prof = results.get("profile")
    if not prof:
        return
    layers = sorted(prof["layers"], key=int)
    readings = list(prof["layers"][layers[0]])
    direct = [r for r in readings if r != "activations"]
    c = prof["correction"]
    doc.h(2, "Every layer")
    doc.p(
        "Sigma at every block output, from the same eval pass (its backward run on down to "
        f"block 0): the corrected erank of each reading with its 95% interval ("
        f"{prof['blocks']} sequence blocks, a lighter correction than the run's layer: "
        f"{c['draws']} draws, {c['groups']} jackknife groups), the headline reading in the "
        "activations' metric (each layer's C from a forward pass before the eval pass; "
        "every reading's twin is in results.json and tables/profile.csv), the share of the "
        "uncentred "
        "reading's trace along the shift of all logits, and the activations' plug-in erank "
        f"for reference. Layer {prof['run_layer']} is the run's layer, measured in full above. "
        "A starred erank has not converged (see below)."
    )
    head = ["layer", *(f"erank {r} [95%]" for r in direct)]
    twin = HEADLINE in direct and bool(
        prof["layers"][layers[0]][HEADLINE].get("activation_weighted")
    )
    head += [f"{HEADLINE}, activation-weighted [95%]"] if twin else []
    shares = "logits_uncentred" in direct
    head += ["shift share (uncentred)"] if shares else []
    head += ["erank activations (plug-in)"] if "activations" in readings else []
    rows = []
    for i in layers:
        row = prof["layers"][i]
        cells = [i + (" (run)" if int(i) == prof["run_layer"] else "")]
        cells += [starred(row[r]) for r in direct]
        cells += [starred(row[HEADLINE]["activation_weighted"])] if twin else []
        cells += [pct(row["logits_uncentred"].get("common_mode_share"))] if shares else []
        if "activations" in row:
            cells.append(num(row["activations"]["erank"]))
        rows.append(cells)
    doc.table(head, rows)
    cautions = profile_cautions(prof, results["config"]["analysis"], converged_at(results))
    if cautions:
        doc.h(3, "Read with care")
        doc.ul(cautions)
    if "profile" in figures:
        doc.img(figures["profile"], "profile")


def profile_cautions(prof: dict, analysis: dict, converged_per_dim: float = 4.0) -> list[str]:
    """One line per reading: the layers where it has not converged, and those whose
    corrected erank moved from half of the sequences to all."""
    lines = []
    for reading in prof["layers"][next(iter(prof["layers"]))]:
        unconverged, moving, needed = [], [], 0
        for i, row in sorted(prof["layers"].items(), key=lambda kv: int(kv[0])):
            e = row[reading]
            if e.get("converged") is False:
                unconverged.append(i)
                needed = max(needed, e.get("eval_tokens_needed") or 0)
            half, full = e.get("erank_corrected_half"), e.get("erank_corrected")
            if half and full and abs(full / half - 1) > analysis["converged_change"]:
                moving.append(i)
        if unconverged:
            lines.append(
                f"{reading}: not converged (fewer than {converged_per_dim:g} independent "
                "equivalents per "
                f"dimension) at layers {', '.join(unconverged)}; "
                + (
                    f"about {needed:,} eval tokens would do at all of them"
                    if needed
                    else "harvest more eval tokens"
                )
            )
        if moving:
            lines.append(
                f"{reading}: the corrected erank moved by more than "
                f"{pct(analysis['converged_change'])} from half of the sequences to all at "
                f"layers {', '.join(moving)} (a bias signal; the intervals include it)"
            )
    return lines


def outlier_choice(results: dict) -> str | None:
    """The choice of outliers beside the headline, and what the other choice gives from
    the same eval tokens (results.json's sigma_other_outliers)."""
    other = (results.get("sigma_other_outliers") or {}).get(HEADLINE)
    here = results.get("sigma", {}).get(HEADLINE)
    if not other or not here or here.get("erank_corrected") is None:
        return None
    o = results["store"]["outliers"]
    kept = other["outliers"] == "left out"  # the run kept them, the other choice did not
    share = o["n_outliers"] / o["n_tokens"] if o["n_tokens"] else 0.0
    choice = (
        "kept in Sigma (--include-outliers)"
        if kept
        else f"left out of Sigma: position 0 and tokens above {o['factor']:g}x the median norm"
    )
    value, theirs = here["erank_corrected"], other["erank_corrected"]
    if below_floor(here) or theirs is None:
        moved = "n/a (too few independent samples to compare)"
    else:
        change = 100 * (theirs / value - 1)
        moved = f"{theirs:,.0f} {ci_of(theirs, other['erank_corrected_95'])} ({change:+.1f}%)"
    return (
        f"Outliers {choice} ({pct(share)} of the tokens, {pct(o['variance_share'])} of "
        f"the residual variance); with them {'left out' if kept else 'kept'}, the same tokens "
        f"give a direct kappa of {moved}."
    )


def rounds_line(results: dict) -> str | None:
    """--until-converged: the rounds and why they stopped."""
    uc = results.get("until_converged")
    if not uc:
        return None
    steps = ", ".join(
        f"{r['eval_tokens']:,} ({r['independent_per_dim']:.1f}/d)" for r in uc["rounds"]
    )
    why = {
        "converged": "the headline converged",
        "target width": "the headline converged with its interval as narrow as asked",
        "cap": "the cap of --max-eval-tokens was reached",
        "corpus exhausted": "the corpus had no more sequences",
    }[uc["stopped"]]
    return (
        f"Until converged: eval tokens (independent equivalents per dimension) by round: "
        f"{steps}; stopped because {why}."
    )
