"""Table A: the paper's claims about kappa itself, decided by the direct estimate (the
corrected erank of Sigma_L and its U-statistic PR), each rule run on the gauge-invariant
reading E[J^T (I - 11^T/V) J] (the direct kappa, which decides) and on the paper's literal
E[J^T J] beside it. The SAE route never decides these: its counts are set by calibration.

Two claims compare runs (the text, the scale): one run cannot test them; `causaldim
claims RUN RUN ...` decides them across the runs given (across.py)."""

from __future__ import annotations

from ..fmt import ci, num
from ..measures.sigma import HEADLINE
from .verdicts import (
    CONSTANT,
    FAILS,
    HOLDS,
    LEVEL,
    UNTESTABLE,
    Decided,
    Rule,
    band,
    decided,
    finite,
    meets,
)

LITERAL = "logits_uncentred"  # the paper's E[J^T J], shift direction included
ACT = f"{HEADLINE}@act"  # the headline reading in the activations' metric (kappa_act)
READINGS = {
    HEADLINE: "gauge-invariant E[J^T (I - 11^T/V) J]",
    LITERAL: "literal E[J^T J]",
    ACT: "activation-weighted erank(C^1/2 Sigma C^1/2)",
}
LADDER_BAR = 0.05  # nats per prediction: the output "kept" (measures/ladder.BARS)
TRAINED_APART = 1.1  # "training sets kappa": trained and null kappas apart by at least this
TEXT_MOVES = 1.1  # "kappa follows the text": corpora's kappas apart by at least this factor
MATCHED_DEPTH = 0.05  # runs of two models count as matched if relative depths differ by less


def of_reading(sigma: dict, reading: str) -> dict | None:
    """A reading's estimate from results.json's sigma (or a profile layer's): READING, or
    READING@act for its activation-weighted twin."""
    base, _, metric = reading.partition("@")
    est = sigma.get(base)
    return (est or {}).get("activation_weighted") if metric == "act" else est


def _estimate(results: dict, reading: str) -> tuple[dict | None, str]:
    """The reading's estimate, or why a rule cannot use it ("" where it can)."""
    est = of_reading(results.get("sigma") or {}, reading)
    if not est and reading == ACT and (results.get("sigma") or {}).get(HEADLINE):
        return None, "no activation-weighted reading (measured before causaldim had it)"
    if not est:
        return None, f"no {reading} reading (--logit-probes 0)"
    if not finite(est.get("erank_corrected"), *(est.get("erank_corrected_95") or [None])):
        return None, f"the {reading} reading has no corrected erank"
    if est.get("converged") is False:
        need = est.get("eval_tokens_needed")
        return None, f"the {reading} reading has not converged" + (
            f" (about {need:,} eval tokens would do)" if need else ""
        )
    return est, ""


def _kappa(est: dict) -> str:
    return f"{num(est['erank_corrected'])} {ci(est['erank_corrected_95'])}"


def level(results: dict, reading: str) -> Decided:
    est, why = _estimate(results, reading)
    if est is None:
        return "n/a", UNTESTABLE, why
    d = results["store"]["model"]["d_model"]
    over_d = [v / d for v in est["erank_corrected_95"]]
    shown = f"kappa {_kappa(est)}; kappa / d {est['erank_corrected'] / d:.2f} {ci(over_d, 2)}"
    low, high = band(results["paper"]["kappa_over_d"], cap=1.0)
    holds = meets(over_d, low, high)
    return decided(
        shown,
        holds,
        f"kappa / d's interval {ci(over_d, 2)} "
        + ("meets" if holds else "misses")
        + f" [{low:.2f}, {high:.2f}]"
        + null_level(results, reading, low, high, holds),
    )


def null_estimates(results: dict, reading: str) -> dict[str, dict]:
    """The nulls control's converged estimates in the reading's metric, by kind."""
    c = (results.get("controls") or {}).get("nulls") or {}
    metric = "act" if reading == ACT else "raw"
    if reading not in (HEADLINE, ACT):
        return {}
    found = {}
    for kind, n in (c.get("nulls") or {}).items():
        e = n.get(metric)
        if e and finite(e.get("value"), *(e.get("interval_95") or [None])) and e["converged"]:
            found[kind] = e
    return found


def null_level(results: dict, reading: str, low: float, high: float, holds: bool) -> str:
    """Where a null (--controls nulls) gives kappa / d in the paper's band: it says so
    (holds: whether the trained model's does too)."""
    d = results["store"]["model"]["d_model"]
    same = [
        f"the {kind} null's {ci([v / d for v in e['interval_95']], 2)}"
        for kind, e in null_estimates(results, reading).items()
        if meets([v / d for v in e["interval_95"]], low, high)
    ]
    if not same:
        return ""
    if holds:
        return f"; {' and '.join(same)} meets it too: an untrained network gives this level"
    return f"; {' and '.join(same)} meets it: an untrained network gives the paper's level"


def training(results: dict, reading: str) -> Decided:
    c = (results.get("controls") or {}).get("nulls")
    if not c or "skipped" in c:
        return "n/a", UNTESTABLE, "the nulls were not measured (pass --controls nulls)"
    est, why = _estimate(results, reading)
    if est is None:
        return "n/a", UNTESTABLE, why
    nulls = null_estimates(results, reading)
    unconverged = [k for k in c["nulls"] if k not in nulls]
    if unconverged:
        return "n/a", UNTESTABLE, f"the {', '.join(unconverged)} null(s) did not converge"
    pairs = [
        (
            "trained",
            est,
            kind,
            {"erank_corrected": e["value"], "erank_corrected_95": e["interval_95"]},
        )
        for kind, e in nulls.items()
    ]
    return _training_verdict(pairs, "the trained kappa")


def _training_verdict(pairs: list[tuple[str, dict, str, dict]], whose: str) -> Decided:
    """(trained's label, its estimate, the null's label, its estimate) pairs: each null
    apart from its trained model by TRAINED_APART+, with disjoint intervals."""
    shown, apart = [], []
    for trained_label, trained, null_label, null in pairs:
        ratio, disjoint = _apart(trained, null)
        apart.append(disjoint and ratio >= TRAINED_APART)
        shown.append(
            f"{trained_label} {_kappa(trained)} vs {null_label} {_kappa(null)}: x{ratio:.2f}"
        )
    return decided(
        "; ".join(shown),
        all(apart),
        f"{sum(apart)} of {len(apart)} nulls apart from {whose} by x{TRAINED_APART}+ with "
        "disjoint intervals",
    )


def paper_spectrum_ratio(paper: dict) -> float:
    return paper["kappa_pr"] / paper["kappa_hat"]


def spectrum(results: dict, reading: str) -> Decided:
    est, why = _estimate(results, reading)
    if est is None:
        return "n/a", UNTESTABLE, why
    pr, pr_95 = est.get("participation_ratio_unbiased"), est.get("participation_ratio_unbiased_95")
    if not pr_95 or not finite(pr, *pr_95):
        return "n/a", UNTESTABLE, f"the {reading} reading has no unbiased PR"
    er, er_95 = est["erank_corrected"], est["erank_corrected_95"]
    ratio = [pr_95[0] / er_95[1], pr_95[1] / er_95[0]]
    shown = f"PR {num(pr)} {ci(pr_95)} / kappa {_kappa(est)} = {pr / er:.2f} {ci(ratio, 2)}"
    low, high = band(paper_spectrum_ratio(results["paper"]))
    if meets(ratio, low, high):
        return shown, HOLDS, f"PR / kappa's interval {ci(ratio, 2)} meets [{low:.2f}, {high:.2f}]"
    shape = "flatter" if ratio[0] > high else "more heavy-tailed"
    return (
        shown,
        FAILS,
        f"PR / kappa's interval {ci(ratio, 2)} misses [{low:.2f}, {high:.2f}]: a {shape} "
        "spectrum than the paper's",
    )


def profile_kappas(results: dict, reading: str) -> tuple[dict[int, float], list[int]]:
    """Per layer (the first and last blocks left out, as the depth control leaves them),
    the profile's corrected erank of the reading where it converged; and the layers left
    out for not converging."""
    layers = (results.get("profile") or {}).get("layers") or {}
    # the model's blocks, not the profile's count: an atlas cell may hold a few depths
    n = results["store"]["model"].get("n_layers") or len(layers)
    kept, unconverged = {}, []
    for key, readings in layers.items():
        i, est = int(key), of_reading(readings, reading)
        if est is None or i in (0, n - 1) or est.get("erank_corrected") is None:
            continue
        if est.get("converged") is False:
            unconverged.append(i)
        else:
            kept[i] = est["erank_corrected"]
    return kept, sorted(unconverged)


def depth(results: dict, reading: str) -> Decided:
    kappas, unconverged = profile_kappas(results, reading)
    if not results.get("profile"):
        return "n/a", UNTESTABLE, "no all-layer profile (pass --profile)"
    if len(kappas) < 3:
        return (
            "n/a",
            UNTESTABLE,
            (
                f"{len(kappas)} layers of the profile converged (needs 3; unconverged: "
                f"{unconverged})"
            ),
        )
    lo, hi = min(kappas, key=lambda i: kappas[i]), max(kappas, key=lambda i: kappas[i])
    spread = kappas[hi] / kappas[lo]
    shown = (
        f"{num(kappas[lo])} (layer {lo}) to {num(kappas[hi])} (layer {hi}) over "
        f"{len(kappas)} layers"
    )
    left_out = f"; {len(unconverged)} unconverged layers left out" if unconverged else ""
    return decided(
        shown,
        spread <= CONSTANT,
        f"largest / smallest {spread:.2f} (constant: <= {CONSTANT}){left_out}",
    )


def ladder_count(results: dict, reading: str) -> Decided:
    """Whether kappa is the count of directions the output needs: the ladder's smallest k
    (by the metric's own ranking) that keeps KL within LADDER_BAR, against kappa."""
    lad = results.get("ladder")
    if not lad:
        return (
            "n/a",
            UNTESTABLE,
            "no intervention ladder (--ladder-sequences 0, or a run before it)",
        )
    ranking = {HEADLINE: "raw", ACT: "act"}.get(reading)
    if ranking is None or lad["reading"] != HEADLINE:
        return "n/a", UNTESTABLE, f"the ladder ranks the {HEADLINE} reading's directions only"
    est, why = _estimate(results, reading)
    if est is None:
        return "n/a", UNTESTABLE, why
    k = lad["within"][ranking][str(LADDER_BAR)]
    kappa = est["erank_corrected"]
    shown = (
        f"kappa {_kappa(est)}; the smallest k of the {ranking} ranking keeping KL <= "
        f"{LADDER_BAR:g}: " + ("none of the ladder" if k is None else f"{k:,}")
    )
    if k is None:
        return shown, FAILS, "no k of the ladder keeps the output within the bar"
    low, high = kappa / LEVEL, kappa * LEVEL
    return decided(
        shown,
        low <= k <= high,
        f"k = {k:,} "
        + ("lies in" if low <= k <= high else "lies outside")
        + f" [{low:,.0f}, {high:,.0f}] (kappa within x{LEVEL:g}; the ladder's k double)",
    )


def one_run_only(what: str, whats: str) -> Decided:
    return (
        "n/a",
        UNTESTABLE,
        (
            f"one run measures one {what}; `causaldim claims RUN RUN ...` decides it across runs "
            f"of different {whats}"
        ),
    )


RULES = (
    Rule(
        "kappa_level",
        "kappa is most of d",
        lambda p: f"kappa / d = {p['kappa_over_d']} (kappa_hat {p['kappa_hat']:,} / d)",
        "kappa / d's 95% interval meets the paper's ratio within a factor 1.5",
        level,
    ),
    Rule(
        "kappa_spectrum",
        "kappa's spectrum is heavy-tailed: the participation ratio far below the erank",
        lambda p: (
            f"PR / kappa = {p['kappa_pr']} / {p['kappa_hat']:,} = {paper_spectrum_ratio(p):.2f}"
        ),
        "PR / kappa's 95% interval meets the paper's ratio within a factor 1.5",
        spectrum,
    ),
    Rule(
        "kappa_depth",
        "kappa is constant across depth",
        lambda p: "constant over 8 layers",
        f"the profile's converged kappas (first and last blocks left out) within x{CONSTANT}",
        depth,
    ),
    Rule(
        "kappa_ladder",
        "kappa counts the directions the output needs (not the paper's; an intervention)",
        lambda p: "not tested in the paper",
        f"the smallest k of the ladder whose top-k directions (by the metric's ranking) keep "
        f"KL(clean || edited) <= {LADDER_BAR:g} lies within x{LEVEL:g} of kappa",
        ladder_count,
    ),
    Rule(
        "kappa_training",
        "kappa is set by training (beside untrained networks of the same shape)",
        lambda p: "not tested in the paper",
        f"the trained kappa against its permuted and initialised nulls at the same layer: "
        f"intervals apart and by x{TRAINED_APART}+",
        training,
    ),
    Rule(
        "kappa_text",
        "kappa is set by what the text asks of the model",
        lambda p: "kappa follows the diversity of the task",
        f"one model and layer on a narrow corpus and a broader one that holds it (a "
        f"mixture of it and more): the narrow kappa below the broad by x{TEXT_MOVES}+, "
        "intervals apart",
        lambda results, reading: one_run_only("corpus", "corpora"),
    ),
    Rule(
        "kappa_scale",
        "kappa does not change with the model's scale",
        lambda p: "Gemma-2-2B and 9B alike at matched relative depth",
        f"two models of one family at matched relative depth on one corpus: kappas within "
        f"x{CONSTANT} (across families: not testable)",
        lambda results, reading: one_run_only("model", "models"),
    ),
)


def _apart(a: dict, b: dict) -> tuple[float, bool]:
    """Two estimates' ratio (larger over smaller) and whether their intervals are apart."""
    ka, kb = a["erank_corrected"], b["erank_corrected"]
    ia, ib = a["erank_corrected_95"], b["erank_corrected_95"]
    return max(ka, kb) / min(ka, kb), ia[1] < ib[0] or ib[1] < ia[0]
