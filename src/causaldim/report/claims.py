"""The paper's claims, each tested on one run: per claim the paper's figure, this run's
with its interval, the rule that decides it and the verdict (holds / does not hold / not
testable here, with the reason). Everything is read from results.json by the rules below,
written once and stated in docs/method.md ("The claims, tested"); nothing is typed by hand.

The report's "Beside the paper" table and its claims table read the same figures
(paper_figures.py), so the two cannot disagree.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

from ..measures.sigma import HEADLINE
from .fmt import ci, features, num, pct
from .paper_figures import figures, headline_sweep, over_d, reading

HOLDS, FAILS, UNTESTABLE = "holds", "does not hold", "not testable here"
VERDICTS = (HOLDS, FAILS, UNTESTABLE)

# The rules' constants (docs/method.md says why each).
LEVEL = 1.5  # a level holds if this run's interval reaches within this factor of the paper's
CONSTANT = 1.5  # "constant" across layers or settings: largest / smallest within this
MIN_WEDGE_SLOPE = 0.5  # N_repr's log-log slope, for "grows almost linearly" (paper: 0.66)
EPSILON_FALLS = 2.0  # "epsilon falls": first layer's over the last's at least this
INFLATED = 2.0  # random-encoder inflation of N_causal at the reference width, at least
RECALL_NEAR_ZERO = 0.1  # "recall 0": the best width's recall of planted directions at most
TASK_RECOVERED = 0.9  # the recovery's 95% interval reaches at least this
MIN_TRUTH = 5  # ground-truth task features needed to estimate a recovery
MIN_CAUSAL = 10  # causal features a width needs for the geometry comparison
FLAT_NORMS = 1e-3  # decoder norms this close to equal cannot discriminate


class Claim(NamedTuple):
    key: str
    claim: str  # the paper's claim, in words
    paper: str  # its figure
    this_run: str  # this run's, with its interval
    test: str  # the rule that decides it
    verdict: str  # one of VERDICTS
    reason: str  # the numbers the rule read, or why it cannot be tested here

    def to_dict(self) -> dict:
        return self._asdict()


def _finite(*values) -> bool:
    return all(v is not None and not (isinstance(v, float) and math.isnan(v)) for v in values)


def _control(results: dict, name: str) -> dict | None:
    c = (results.get("controls") or {}).get(name)
    return None if c is None or "skipped" in c else c


def _not_run(results: dict, name: str, flags: str) -> str:
    c = (results.get("controls") or {}).get(name)
    if c is not None and "skipped" in c:
        return f"the {name} control did not run: {c['skipped']}"
    return f"the {name} control was not run (pass {flags})"


def _decided(shown: str, holds: bool, reason: str) -> tuple[str, str, str]:
    return shown, HOLDS if holds else FAILS, reason


def _needs(name: str, flags: str):
    """A rule that reads control `name`: not testable where it did not run."""

    def wrap(rule: Callable[[dict, dict], tuple[str, str, str]]):
        def decide(results: dict) -> tuple[str, str, str]:
            c = _control(results, name)
            if c is None:
                return "n/a", UNTESTABLE, _not_run(results, name, flags)
            return rule(results, c)

        return decide

    return wrap


# The rules: each reads results.json and returns (this run, verdict, reason).


def wedge(results: dict) -> tuple[str, str, str]:
    a = headline_sweep(results)
    w, f = a["wedge"], figures(results)
    shown = (
        f"N_repr {f['n_repr_growth'].this_run}, N_causal {f['n_causal_growth'].this_run} over "
        f"x{w['width_ratio']:g} (AtP over {reading(a)}); over "
        f"{reading(a['sensitivity'])}: {f['n_causal_growth_other'].this_run}"
    )
    repr_growth, slope = w["n_repr_growth"], w.get("n_repr_loglog_slope")
    interval = w.get("n_causal_growth_95")
    if w.get("widths", len(a["per_width"])) < 3:
        return shown, UNTESTABLE, "fewer than 3 widths"
    if w["n_causal_growth"] is None or not _finite(repr_growth, slope):
        return shown, UNTESTABLE, "N_causal is 0 at the smallest width: no growth to compare"
    if not interval or not _finite(*interval):
        return shown, UNTESTABLE, "no bootstrap interval on N_causal's growth (--bootstrap 0)"
    if slope < MIN_WEDGE_SLOPE:
        return shown, FAILS, f"N_repr's log-log slope is {slope:.2f}, below {MIN_WEDGE_SLOPE}"
    if interval[1] < 1.0:
        return (
            shown,
            FAILS,
            f"N_causal falls with width ({ci(interval, 2)}): not a wedge that saturates but the "
            "regime where calibration at the smallest width makes wider SAEs count fewer",
        )
    if interval[1] < repr_growth:
        return (
            shown,
            HOLDS,
            f"N_causal's growth interval {ci(interval, 2)} lies below N_repr's x{repr_growth:.2f}",
        )
    return (
        shown,
        FAILS,
        f"N_causal's growth interval {ci(interval, 2)} reaches N_repr's x{repr_growth:.2f}",
    )


def kappa_level(results: dict) -> tuple[str, str, str]:
    a, f = headline_sweep(results), figures(results)
    shown = f"kappa_hat {f['kappa_hat'].this_run}; kappa_hat / d {f['kappa_over_d'].this_run}"
    if not a["estimable"]:
        return shown, UNTESTABLE, f"kappa_hat is not estimable: {a['not_estimable']}"
    target = results["paper"]["kappa_over_d"]
    lo, hi = target / LEVEL, min(1.0, target * LEVEL)
    interval = over_d(results)
    if not interval or not _finite(*interval):
        return shown, UNTESTABLE, "no bootstrap interval on kappa_hat (--bootstrap 0)"
    if interval[1] >= lo and interval[0] <= hi:
        return shown, HOLDS, f"its interval {ci(interval, 2)} meets [{lo:.2f}, {hi:.2f}]"
    return shown, FAILS, f"its interval {ci(interval, 2)} misses [{lo:.2f}, {hi:.2f}]"


def kappa_pr(results: dict) -> tuple[str, str, str]:
    f = figures(results)
    shown = (
        f"kappa_PR {f['kappa_pr'].this_run} beside the direct erank {f['direct_kappa'].this_run}"
    )
    lead = results.get("sigma", {}).get(HEADLINE)
    if not lead:
        return shown, UNTESTABLE, "no logits reading (--logit-probes 0)"
    pr = (
        lead.get("participation_ratio_unbiased_95")
        or [lead.get("participation_ratio_unbiased")] * 2
    )
    erank = lead.get("erank_corrected_95") or [lead.get("erank_corrected")] * 2
    if not _finite(*pr, *erank):
        return shown, UNTESTABLE, "the direct PR or erank is missing"
    if pr[1] < erank[0]:
        return shown, HOLDS, f"PR's interval {ci(pr, 1)} lies below the erank's {ci(erank)}"
    return shown, FAILS, f"PR's interval {ci(pr, 1)} reaches the erank's {ci(erank)}"


def coverage(results: dict) -> tuple[str, str, str]:
    a, f = headline_sweep(results), figures(results)
    shown = (
        f"{f['coverage'].this_run} at the widest SAE; 95% at a width of {f['width_95'].this_run}"
    )
    if not a["estimable"]:
        return shown, UNTESTABLE, f"kappa_hat is not estimable: {a['not_estimable']}"
    free, widest = a["kappa"]["free"], a["per_width"][-1]["width"]
    cov, width_95 = free["coverage"], free["width_95"]
    if not _finite(cov, width_95):
        return shown, UNTESTABLE, "no coverage or width for 95%"
    if cov < 0.95 and width_95 > widest:
        return (
            shown,
            HOLDS,
            f"the widest SAE ({widest:,}) covers {pct(cov)}; 95% needs {features(width_95)}",
        )
    return shown, FAILS, f"the widest SAE ({widest:,}) already covers {pct(cov)} of kappa_hat"


def _profile_kappas(results: dict) -> tuple[dict[int, float], list[int]]:
    """Per layer (the first and last blocks left out, as the depth control leaves them),
    the profile's corrected logits erank where it converged; and the layers left out for
    not converging."""
    prof = results.get("profile") or {}
    layers = prof.get("layers") or {}
    n = len(layers)
    kept, unconverged = {}, []
    for key, readings in layers.items():
        i, est = int(key), readings.get(HEADLINE)
        if est is None or i in (0, n - 1) or est.get("erank_corrected") is None:
            continue
        if est.get("converged") is False:
            unconverged.append(i)
        else:
            kept[i] = est["erank_corrected"]
    return kept, sorted(unconverged)


def depth(results: dict) -> tuple[str, str, str]:
    kappas, unconverged = _profile_kappas(results)
    c = _control(results, "depth")
    ratio = None if c is None else c.get("epsilon_first_over_last")
    parts = []
    if kappas:
        parts.append(
            f"direct kappa (logits, corrected) {num(min(kappas.values()))} to "
            f"{num(max(kappas.values()))} over {len(kappas)} layers of the profile"
        )
    if c is not None:
        layers = c["layers"]
        parts.append(
            f"epsilon at layer {layers[0]} x{ratio:.2f} that at layer {layers[-1]}"
            if ratio is not None
            else "epsilon's ratio undefined (0 at the last layer)"
        )
    shown = "; ".join(parts) or "n/a"
    missing = []
    if not kappas:
        missing.append(
            "no converged layer in the all-layer profile (pass --profile)"
            if not results.get("profile")
            else f"the profile's logits erank converged at no layer (unconverged: {unconverged})"
        )
    if c is None:
        missing.append(_not_run(results, "depth", "--controls depth"))
    if missing:
        return shown, UNTESTABLE, "; ".join(missing)
    if len(kappas) < 3:
        return shown, UNTESTABLE, f"only {len(kappas)} converged layers in the profile"
    spread = max(kappas.values()) / min(kappas.values())
    left_out = f" ({len(unconverged)} unconverged layers left out)" if unconverged else ""
    flat = spread <= CONSTANT
    falls = ratio is not None and ratio >= EPSILON_FALLS
    reason = (
        f"kappa's largest / smallest over layers is {spread:.2f} (constant: <= {CONSTANT})"
        f"{left_out}; epsilon falls x{num(ratio, 2)} (falls: >= x{EPSILON_FALLS:g})"
    )
    return shown, HOLDS if flat and falls else FAILS, reason


def _common_point(intervals: list[list[float]]) -> bool:
    return max(i[0] for i in intervals) <= min(i[1] for i in intervals)


@_needs("architectures", "--controls architectures")
def architectures(results: dict, c: dict) -> tuple[str, str, str]:
    shown = ", ".join(
        f"{r['architecture']} {num(r['kappa_hat'])} {ci(r['kappa_95'])}" for r in c["rows"]
    )
    l0 = _control(results, "l0")
    matched = (
        ""
        if l0 is None or not l0.get("n_flagged")
        else (f"; {l0['n_flagged']} SAE(s) stray over 10% from the matched L0")
    )
    flat = [r["architecture"] for r in c["rows"] if not r["n_causal_grows"]]
    if flat:
        return (
            shown,
            UNTESTABLE,
            f"N_causal does not grow for {', '.join(flat)}: no kappa_hat to compare{matched}",
        )
    intervals = [r["kappa_95"] for r in c["rows"]]
    if not all(i and _finite(*i) for i in intervals):
        return shown, UNTESTABLE, "no bootstrap intervals on kappa_hat (--bootstrap 0)"
    if _common_point(intervals):
        return shown, HOLDS, f"the architectures' kappa_hat intervals share a point{matched}"
    return shown, FAILS, f"the architectures' kappa_hat intervals share no point{matched}"


@_needs("thresholds", "--controls thresholds")
def thresholds(results: dict, c: dict) -> tuple[str, str, str]:
    rows = c["rows"]
    shown = ", ".join(f"{r['percentile']:g}th: {num(r['kappa_hat'])}" for r in rows)
    if c["n_growing"] < c["n_growths"]:
        return (
            shown,
            UNTESTABLE,
            f"N_causal grows at {c['n_growing']} of {c['n_growths']} percentiles: kappa_hat "
            "is not estimable at the others",
        )
    kappas = [r["kappa_hat"] for r in rows]
    spread = max(kappas) / min(kappas) if min(kappas) > 0 else math.inf
    return _decided(
        shown,
        spread <= CONSTANT,
        f"largest / smallest kappa_hat over the percentiles {spread:.2f} (<= {CONSTANT})",
    )


@_needs("geometry", "--controls geometry")
def geometry(results: dict, c: dict) -> tuple[str, str, str]:
    measures = ["nn_cosine"] + (
        ["decoder_norm"] if c["max_decoder_norm_spread"] >= FLAT_NORMS else []
    )
    eligible = [r for r in c["rows"] if r["nn_cosine"]["n_causal"] >= MIN_CAUSAL]
    differing = [
        r["width"]
        for r in eligible
        if any(r["width"] in c["widths_differing"][m] for m in measures)
    ]
    shown = (
        f"a difference (AUC interval excluding 0.5) at {len(differing)} of {len(eligible)} "
        f"widths with {MIN_CAUSAL}+ causal features ({' and '.join(measures)})"
    )
    if not eligible:
        return shown, UNTESTABLE, f"no width has {MIN_CAUSAL} causal features to compare"
    return _decided(
        shown,
        2 * len(differing) >= len(eligible),
        f"{len(differing)} of {len(eligible)} widths differ (holds: at least half)",
    )


@_needs("synthetic", "--controls synthetic")
def synthetic(results: dict, c: dict) -> tuple[str, str, str]:
    best = c["best_recall"]
    direct = c.get("direct") or {}
    shown = (
        f"best recall {pct(best['recall'])} (width {best['width']:,}); the direct erank "
        f"{num(direct.get('erank'), 2)} for k = {c['k']}"
    )
    return _decided(
        shown,
        best["recall"] <= RECALL_NEAR_ZERO,
        f"recall {pct(best['recall'])} (0: at most {pct(RECALL_NEAR_ZERO)})",
    )


@_needs("four_cell", "--controls four_cell")
def four_cell(results: dict, c: dict) -> tuple[str, str, str]:
    ref = c["rows"][0]
    inflation = ref.get("random_encoder_inflation")
    shown = f"x{num(inflation, 2)} at the reference width {ref['width']:,}"
    if inflation is None:
        return shown, UNTESTABLE, "no trained-encoder feature is causal at the reference width"
    return _decided(
        shown, inflation >= INFLATED, f"x{inflation:.2f} (inflated: at least x{INFLATED:g})"
    )


@_needs("task", "--controls task")
def task(results: dict, c: dict) -> tuple[str, str, str]:
    n = c["n_ground_truth"]
    shown = (
        f"{pct(c['recovered_fraction'])} {ci(c['recovered_95'], 2)} of {n} ground-truth features"
    )
    if n < MIN_TRUTH:
        return (
            shown,
            UNTESTABLE,
            f"{n} ground-truth features (needs {MIN_TRUTH}); raise --task-prompts",
        )
    upper = c["recovered_95"][1]
    return _decided(
        shown,
        upper >= TASK_RECOVERED,
        f"the interval's upper end {pct(upper)} (holds: >= {pct(TASK_RECOVERED)})",
    )


@_needs("scale", "--controls scale --scale-model NAME")
def scale(results: dict, c: dict) -> tuple[str, str, str]:
    ps = [r["p_value"] for r in c["rows"]]
    bar = 0.05 / len(ps)
    shown = f"{c['models'][0]} against {c['models'][1]}: smallest KS p {min(ps):.3g}"
    return _decided(
        shown,
        min(ps) >= bar,
        f"the same AtP shape unless a width's p < 0.05 / {len(ps)} = {bar:.3g}",
    )


class Rule(NamedTuple):
    key: str
    claim: str
    paper: Callable[[dict], str]
    test: str
    decide: Callable[[dict], tuple[str, str, str]]


RULES = (
    Rule(
        "wedge",
        "SAE features that fire grow almost linearly with width; causal ones grow far slower",
        lambda p: (
            f"N_repr x{p['n_repr_growth']}, N_causal x{p['n_causal_growth']} "
            f"over x{p['width_ratio']}"
        ),
        "N_causal's 95% growth interval lies below N_repr's growth and reaches 1 (it does "
        f"not fall), N_repr's log-log slope >= {MIN_WEDGE_SLOPE}",
        wedge,
    ),
    Rule(
        "kappa_hat",
        "kappa_hat is most of d",
        lambda p: (
            f"{p['kappa_hat']:,} {ci(p['kappa_hat_95'])}; kappa_hat / d = {p['kappa_over_d']}"
        ),
        f"kappa_hat / d's 95% interval meets the paper's ratio within a factor {LEVEL}",
        kappa_level,
    ),
    Rule(
        "kappa_pr",
        "the participation ratio is a lower bound on kappa",
        lambda p: f"about {p['kappa_pr']}",
        "the direct PR's 95% interval lies below the direct erank's",
        kappa_pr,
    ),
    Rule(
        "coverage",
        "the widest SAE recovers only part of kappa_hat",
        lambda p: (
            f"{pct(p['coverage'])} at width 1,048,576; about {p['width_full_recovery']:,} for all"
        ),
        "coverage below 95% and the width for 95% beyond the widest SAE",
        coverage,
    ),
    Rule(
        "depth",
        "kappa is constant across depth while epsilon falls",
        lambda p: "kappa constant; epsilon falls x20 from layer 1 to 23",
        f"the profile's converged direct kappas within x{CONSTANT} of each other, and epsilon's "
        f"first / last layer >= x{EPSILON_FALLS:g} (depth control)",
        depth,
    ),
    Rule(
        "architectures",
        "kappa_hat does not depend on the SAE architecture (TopK, JumpReLU, ReLU at matched L0)",
        lambda p: "invariant",
        "the architectures' kappa_hat 95% intervals share a point",
        architectures,
    ),
    Rule(
        "thresholds",
        "kappa_hat is robust to the calibration percentile (95th to 99.5th)",
        lambda p: "robust",
        f"N_causal grows at every percentile and kappa_hat's largest / smallest <= {CONSTANT}",
        thresholds,
    ),
    Rule(
        "geometry",
        "causal features are geometrically privileged (decoder norm, nearest-neighbour cosine)",
        lambda p: "a difference (no figure quoted)",
        f"at least half of the widths with {MIN_CAUSAL}+ causal features differ (AUC 95% "
        "interval excludes 0.5)",
        geometry,
    ),
    Rule(
        "synthetic",
        "AtP-selected SAE features miss the planted causal directions of a toy model",
        lambda p: "recall 0",
        f"the best width's recall at most {pct(RECALL_NEAR_ZERO)}",
        synthetic,
    ),
    Rule(
        "four_cell",
        "a random orthonormal encoder inflates N_causal",
        lambda p: "x9.27",
        f"N_causal (random encoder) / N_causal (trained) >= x{INFLATED:g} at the reference width",
        four_cell,
    ),
    Rule(
        "task",
        "the top 5% of generic-text AtP features hold a task's ground-truth features",
        lambda p: "98.2%",
        f"the recovery's 95% interval reaches {pct(TASK_RECOVERED)}, with {MIN_TRUTH}+ "
        "ground-truth features",
        task,
    ),
    Rule(
        "scale",
        "the AtP distribution's shape does not change with model scale",
        lambda p: "Gemma-2-9B and 2B alike",
        "no width's KS p below 0.05 / widths (Bonferroni)",
        scale,
    ),
)


def claims(results: dict) -> list[Claim]:
    """Every claim of RULES, decided on this run."""
    out = []
    for rule in RULES:
        this_run, verdict, reason = rule.decide(results)
        out.append(
            Claim(
                rule.key,
                rule.claim,
                rule.paper(results["paper"]),
                this_run,
                rule.test,
                verdict,
                reason,
            )
        )
    return out
