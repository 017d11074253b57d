"""Table B, the rules that read a control's result: architectures, thresholds, the
four-cell ablation, geometry, the synthetic model, task recovery, epsilon over depth and
the AtP shape across scale."""

from __future__ import annotations

import math

from ..fmt import ci, growth, num, pct
from .quantities import (
    direct,
    headline_sweep,
    set_by_calibration,
)
from .verdicts import (
    AUC_MARGIN,
    CALIBRATION_NEAR,
    CONSTANT,
    EPSILON_FALLS,
    FAILS,
    FLAT_NORMS,
    GROWS,
    HOLDS,
    INFLATED,
    MIN_CAUSAL,
    MIN_TRUTH,
    MOSTLY_OUTSIDE,
    RECALL_NEAR_ZERO,
    RECOVERY,
    SLOWER,
    UNTESTABLE,
    Decided,
    decided,
    finite,
    needs,
)


def _lighter(c: dict, results: dict) -> str:
    own = c.get("control_sweep")
    if not own:
        return ""
    w = headline_sweep(results)["wedge"]
    return (
        f" (the controls' lighter sweep: {own['epochs']} epoch(s), widths "
        f"{'-'.join(f'{v:,}' for v in (own['widths'][0], own['widths'][-1]))}; the headline "
        f"sweep's N_causal grows {growth(w['n_causal_growth'])})"
    )


@needs("architectures", "--controls architectures")
def architectures(results: dict, c: dict) -> Decided:
    rows = c["rows"]
    k = direct(results)
    shown = "; ".join(
        f"{r['architecture']}: N_causal {growth(r['n_causal_growth'])}, N_repr "
        f"{growth(r['n_repr_growth'])}"
        + (f", L0 {' / '.join(num(v) for v in r['l0'])}" if r.get("l0") else "")
        for r in rows
    ) + _lighter(c, results)
    if k is not None:
        shown += "; kappa_hat / direct kappa " + ", ".join(
            f"{r['architecture']} {r['kappa_hat'] / k['erank_corrected']:.2f}"
            for r in rows
            if finite(r.get("kappa_hat"))
        )
    if any(not finite(r.get("n_causal_growth"), r.get("n_repr_growth")) for r in rows):
        return shown, UNTESTABLE, "an architecture has no growth (N_causal 0 at the smallest width)"
    flat = [r["architecture"] for r in rows if r["n_causal_growth"] < GROWS]
    if flat:
        return (
            shown,
            FAILS,
            f"N_causal does not grow (below x{GROWS:g}) for {', '.join(flat)}: a count that "
            "does not grow is not sub-linear growth",
        )
    faster = [r["architecture"] for r in rows if r["n_causal_growth"] > r["n_repr_growth"] / SLOWER]
    l0 = (
        ""
        if all(r.get("l0") for r in rows)
        else "; L0 per width not recorded for every architecture"
    )
    if faster:
        return (
            shown,
            FAILS,
            (
                f"N_causal keeps up with N_repr (more than 1/{SLOWER:g} of its growth) for "
                f"{', '.join(faster)}{l0}"
            ),
        )
    return (
        shown,
        HOLDS,
        (
            f"N_causal grows (x{GROWS:g}+) at most 1/{SLOWER:g} as fast as N_repr for all "
            f"{len(rows)} architectures{l0}"
        ),
    )


@needs("thresholds", "--controls thresholds")
def thresholds(results: dict, c: dict) -> Decided:
    rows = c["rows"]
    k = direct(results)
    grows = [r for r in rows if (r.get("n_causal_growth") or 0) > 1 and finite(r.get("kappa_hat"))]
    shown = ", ".join(
        f"{r['percentile']:g}th: "
        + (
            f"{num(r['kappa_hat'])}"
            + (f" ({r['kappa_hat'] / k['erank_corrected']:.2f} of the direct kappa)" if k else "")
            if r in grows
            else f"not estimable (N_causal {growth(r.get('n_causal_growth'))})"
        )
        for r in rows
    )
    a = headline_sweep(results)
    forced = [
        r["percentile"]
        for r in grows
        if set_by_calibration(r["kappa_hat"], {**a, "percentile": r["percentile"]})
    ]
    if forced:
        shown += (
            f"; within x{CALIBRATION_NEAR:g} of its calibration's count (1 - p) m_ref at "
            + ", ".join(f"{p:g}th" for p in forced)
        )
    free = [r for r in grows if r["percentile"] not in forced]
    if len(free) < 2:
        return (
            shown,
            UNTESTABLE,
            f"kappa_hat is estimable and not the calibration's count at {len(free)} "
            "percentile(s) (needs 2): where the calibration sets it, kappa_hat follows p by "
            "construction",
        )
    kappas = [r["kappa_hat"] for r in free]
    spread = max(kappas) / min(kappas) if min(kappas) > 0 else math.inf
    return decided(
        shown,
        spread <= CONSTANT,
        f"largest / smallest kappa_hat over the {len(free)} percentiles where it exists and "
        f"is not the calibration's count {spread:.2f} (robust: <= {CONSTANT})",
    )


@needs("four_cell", "--controls four_cell")
def four_cell(results: dict, c: dict) -> Decided:
    ref = c["rows"][0]
    matched = (
        f"{c.get('architecture', 'headline')} cells (L0 matched): "
        f"x{num(ref.get('random_encoder_inflation'), 2)} "
        f"at {ref['width']:,}"
    )
    free = c.get("free_l0")
    if not free or not free.get("rows"):
        return (
            matched,
            UNTESTABLE,
            (
                "only cells whose L0 is held equal were measured, which removes the sparsity "
                "filter the paper's reading rests on; the L0-free (JumpReLU) cells need this "
                "causaldim's four_cell control"
                + (f": {free['skipped']}" if free and free.get("skipped") else "")
            ),
        )
    fr = free["rows"][0]
    cells = fr["cells"]
    shown = (
        f"{free['architecture']} cells, thresholds as trained: random encoder x"
        f"{num(fr.get('random_encoder_inflation'), 2)} at {fr['width']:,} (L0 "
        f"{num(cells['trained/trained']['l0'])} trained, {num(cells['random/trained']['l0'])} "
        f"random encoder); {matched}"
    )
    inflation = fr.get("random_encoder_inflation")
    if inflation is None:
        return shown, UNTESTABLE, "no trained-encoder feature is causal at the reference width"
    return decided(
        shown, inflation >= INFLATED, f"x{inflation:.2f} (inflated: at least x{INFLATED:g})"
    )


def _auc_state(auc_95) -> str:
    low, high = 0.5 - AUC_MARGIN, 0.5 + AUC_MARGIN
    if not auc_95 or not finite(*auc_95):
        return "unclear"  # no interval: neither alike nor different
    if auc_95[0] >= low and auc_95[1] <= high:
        return "alike"
    if auc_95[0] > high or auc_95[1] < low:
        return "differ"
    return "unclear"


@needs("geometry", "--controls geometry")
def geometry(results: dict, c: dict) -> Decided:
    tied = c["max_decoder_norm_spread"] < FLAT_NORMS
    # against non-causal features that fire as often, where the control matched them: AtP
    # selects frequent features, and frequency alone moves the nearest-neighbour cosine
    matched = all("nn_cosine_matched" in r for r in c["rows"])
    suffix = "_matched" if matched else ""
    measures = [f"nn_cosine{suffix}"] + ([] if tied else [f"decoder_norm{suffix}"])
    eligible = [r for r in c["rows"] if r["nn_cosine"]["n_causal"] >= MIN_CAUSAL]
    states = {r["width"]: {m: _auc_state(r[m].get("auc_95")) for m in measures} for r in eligible}
    differ = [w for w, s in states.items() if "differ" in s.values()]
    alike = [w for w, s in states.items() if set(s.values()) == {"alike"}]
    auc = "; ".join(
        f"{r['width']:,}: nn-cosine AUC {num(r['nn_cosine']['auc'], 2)} "
        f"{ci(r['nn_cosine']['auc_95'], 2)}"
        + (
            f", firing-matched {num(r['nn_cosine_matched']['auc'], 2)} "
            f"{ci(r['nn_cosine_matched']['auc_95'], 2)}"
            if matched
            else ""
        )
        for r in eligible
    )
    norm = (
        "decoder norm: cannot discriminate (the decoder rows' norms are tied, spread "
        f"{c['max_decoder_norm_spread']:.2g})"
        if tied
        else "decoder norm compared too"
    )
    shown = f"{auc or 'no width'}; {norm}" + (
        "" if matched else "; not matched on firing frequency (a control before it was)"
    )
    if not eligible:
        return shown, UNTESTABLE, f"no width has {MIN_CAUSAL} causal features to compare"
    margin = f"[{0.5 - AUC_MARGIN:.1f}, {0.5 + AUC_MARGIN:.1f}]"
    if 2 * len(differ) >= len(eligible):
        return (
            shown,
            FAILS,
            (
                f"causal and other features differ beyond the margin (AUC interval outside "
                f"{margin}) at {len(differ)} of {len(eligible)} widths"
            ),
        )
    if len(alike) == len(eligible):
        return shown, HOLDS, f"every width's AUC interval lies inside {margin}: no difference"
    return (
        shown,
        UNTESTABLE,
        (
            f"inconclusive: {len(alike)} of {len(eligible)} widths inside {margin}, "
            f"{len(differ)} outside"
        ),
    )


@needs("synthetic", "--controls synthetic")
def synthetic(results: dict, c: dict) -> Decided:
    rows = c["rows"]
    per_width = ", ".join(
        f"{r['width']:,}: recall {pct(r['recall'])}, outside "
        f"{pct(r.get('selected_noncausal_fraction'))}"
        for r in rows
    )
    d, spec = c.get("direct") or {}, c.get("spec") or {}
    shown = (
        f"per width, the planted directions recalled and the share of AtP-selected features "
        f"mostly outside the planted subspace: {per_width}; the direct erank "
        f"{num(d.get('erank'), 2)} for k = {c['k']}"
    )
    density = spec.get("causal_density"), spec.get("feature_density")
    if density[0] is not None and density[0] != density[1]:
        shown += (
            f"; the planted directions fire {density[0] / density[1]:.0f}x as often as the "
            "rest (a toy built for the SAE to learn them)"
        )
    judged = [r for r in rows if r.get("selected_noncausal_fraction") is not None]
    if not judged:
        return shown, UNTESTABLE, "no width selected a feature (or the share was not recorded)"
    found = [r["width"] for r in judged if r["recall"] > RECALL_NEAR_ZERO]
    inside = [r["width"] for r in judged if r["selected_noncausal_fraction"] < MOSTLY_OUTSIDE]
    return decided(
        shown,
        not found and not inside,
        f"recall above {pct(RECALL_NEAR_ZERO)} at {len(found)} of {len(judged)} widths; the "
        f"selected features mostly inside the planted subspace (less than "
        f"{pct(MOSTLY_OUTSIDE)} outside) at {len(inside)} (missing the planted directions: "
        "neither)",
    )


@needs("task", "--controls task")
def task(results: dict, c: dict) -> Decided:
    n, iv = c.get("n_ground_truth") or 0, c.get("recovered_95")
    if iv is None or not finite(c.get("recovered_fraction"), *iv):
        return (
            f"{n} ground-truth features",
            UNTESTABLE,
            "no recovery measured (no ground-truth feature, so no interval)",
        )
    shown = (
        f"{pct(c['recovered_fraction'])} [{pct(iv[0])}, {pct(iv[1])}] of {n} ground-truth features"
    )
    if n < MIN_TRUTH:
        evaluated = c.get("n_evaluated")
        of = "" if evaluated is None else f" of the {evaluated} features ablated"
        frac = c.get("fraction")
        bar = "" if frac is None else f" at a bar of {pct(frac)} of the metric"
        return (
            shown,
            UNTESTABLE,
            f"{n} ground-truth features{of}{bar} (needs {MIN_TRUTH}); more prompts "
            "(--task-prompts) sharpen the effects but may not add features that clear the bar",
        )
    if iv[0] >= RECOVERY:
        return shown, HOLDS, f"the interval's lower end {pct(iv[0])} clears {pct(RECOVERY)}"
    if iv[1] < RECOVERY:
        return shown, FAILS, f"the interval's upper end {pct(iv[1])} is below {pct(RECOVERY)}"
    return shown, UNTESTABLE, f"the interval {ci(iv, 2)} straddles {pct(RECOVERY)}"


@needs("depth", "--controls depth")
def epsilon_depth(results: dict, c: dict) -> Decided:
    eps = [(r["layer"], r["epsilon"]) for r in c.get("rows", [])]
    ratio = c.get("epsilon_first_over_last")
    path = " -> ".join(f"{e:.3g} (L{layer})" for layer, e in eps)
    if ratio is None or not finite(ratio):
        return path or "n/a", UNTESTABLE, "epsilon's first / last ratio is undefined"
    values = [e for _, e in eps]
    monotone = all(a >= b for a, b in zip(values, values[1:], strict=False)) or all(
        a <= b for a, b in zip(values, values[1:], strict=False)
    )
    moves = f"falls x{ratio:.2f}" if ratio >= 1 else f"rises x{1 / ratio:.2f}"
    shown = f"epsilon {path}: from the first layer to the last it {moves}" + (
        "" if monotone else ", not monotonically"
    )
    return decided(
        shown,
        ratio >= EPSILON_FALLS,
        f"first / last {ratio:.2f} (falls: >= x{EPSILON_FALLS:g})",
    )


@needs("scale", "--controls scale --scale-model NAME")
def scale_shape(results: dict, c: dict) -> Decided:
    ps = [r["p_value"] for r in c["rows"]]
    bar = 0.05 / len(ps)
    shown = f"{c['models'][0]} against {c['models'][1]}: smallest KS p {min(ps):.3g}"
    if all(r.get("margin") is not None for r in c["rows"]):
        # the within-model null: a width differs only beyond both models' split-half KS
        beyond = [r for r in c["rows"] if r["p_value"] < bar and r["ks"] > r["margin"]]
        worst = max(c["rows"], key=lambda r: r["ks"] - r["margin"])
        shown += f"; KS {worst['ks']:.3f} against a within-model {worst['margin']:.3f}"
        return decided(
            shown,
            not beyond,
            f"the same AtP shape unless a width's p < 0.05 / {len(ps)} = {bar:.3g} with a "
            "KS above both models' split-half KS",
        )
    return decided(
        shown,
        min(ps) >= bar,
        f"the same AtP shape unless a width's p < 0.05 / {len(ps)} = {bar:.3g}",
    )
