"""What every claim rule shares: the three verdicts, a claim's row, the rules' constants
(docs/method.md, "The claims, tested", says why each) and the small readers of
results.json the rules have in common."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

HOLDS, FAILS, UNTESTABLE = "holds", "does not hold", "not testable here"
VERDICTS = (HOLDS, FAILS, UNTESTABLE)

# The two tables: claims about kappa itself, and claims about the SAE estimator.
KAPPA, ESTIMATOR = "kappa", "estimator"

# The rules' constants.
LEVEL = 1.5  # a level agrees with the paper's if the interval meets [paper / 1.5, paper x 1.5]
CONSTANT = 1.5  # "constant": largest / smallest within this factor
MIN_WEDGE_SLOPE = 0.5  # N_repr's log-log slope, for "grows almost linearly" (paper: 0.66)
GROWS = 1.1  # a count "grows" over the sweep by at least this factor
SLOWER = 1.5  # per architecture, N_causal's growth at most N_repr's / this: "sub-linear"
EPSILON_FALLS = 2.0  # "epsilon falls": first layer's over the last's at least this
INFLATED = 2.0  # random-encoder inflation of N_causal at the reference width, at least
RECALL_NEAR_ZERO = 0.1  # "recall 0": a width's recall of planted directions at most
MOSTLY_OUTSIDE = 0.5  # "missed": at least this share of the selected features lie outside U
RECOVERY = 0.8  # "recover nearly all": the task recovery's interval lies above this
MIN_TRUTH = 20  # ground-truth task features needed to estimate a recovery
MIN_CAUSAL = 10  # causal features a width needs for the geometry comparison
AUC_MARGIN = 0.1  # "no geometric difference": the AUC's interval inside 0.5 +- this
FLAT_NORMS = 1e-3  # decoder norms this close to equal cannot discriminate
CALIBRATION_NEAR = 1.5  # kappa_hat within this factor of the calibration's count is set by it

Decided = tuple[str, str, str]  # (this run's figures, verdict, the reason)


class Claim(NamedTuple):
    key: str
    table: str  # KAPPA or ESTIMATOR
    claim: str  # the paper's claim, in words
    paper: str  # its figure
    this_run: str  # this run's figures, with their intervals
    test: str  # the rule that decides it
    verdict: str  # one of VERDICTS
    reason: str  # the numbers the rule read, or why it cannot be tested here
    # claims about kappa: the same rule on the paper's literal E[J^T J] (None elsewhere)
    literal: Decided | None = None
    # the same rule in the activations' metric, kappa_act (claims that read kappa)
    activation_weighted: Decided | None = None

    def to_dict(self) -> dict:
        out = self._asdict()
        for name, prefix in (("literal", "literal"), ("activation_weighted", "act")):
            found = out.pop(name) or (None, None, None)
            out[f"{prefix}_this_run"], out[f"{prefix}_verdict"], out[f"{prefix}_reason"] = found
        return out


class Rule(NamedTuple):
    key: str
    claim: str
    paper: Callable[[dict], str]  # the paper's figure, from results["paper"]
    test: str
    # table A: (results, reading); table B: (results) or, in BOTH_METRICS, (results, metric)
    decide: Callable[..., Decided]


def finite(*values) -> bool:
    return all(v is not None and not (isinstance(v, float) and math.isnan(v)) for v in values)


def decided(shown: str, holds: bool, reason: str) -> Decided:
    return shown, HOLDS if holds else FAILS, reason


def control(results: dict, name: str) -> dict | None:
    c = (results.get("controls") or {}).get(name)
    return None if c is None or "skipped" in c else c


def not_run(results: dict, name: str, flags: str) -> str:
    c = (results.get("controls") or {}).get(name)
    if c is not None and "skipped" in c:
        return f"the {name} control did not run: {c['skipped']}"
    return f"the {name} control was not run (pass {flags})"


def needs(name: str, flags: str):
    """A rule that reads control `name`: not testable where it did not run."""

    def wrap(rule: Callable[[dict, dict], Decided]) -> Callable[[dict], Decided]:
        def decide(results: dict) -> Decided:
            c = control(results, name)
            if c is None:
                return "n/a", UNTESTABLE, not_run(results, name, flags)
            return rule(results, c)

        return decide

    return wrap


def meets(interval, low: float, high: float) -> bool:
    return interval[1] >= low and interval[0] <= high


def band(target: float, factor: float = LEVEL, cap: float | None = None) -> tuple[float, float]:
    """[target / factor, target x factor], the upper end capped where given."""
    high = target * factor
    return target / factor, high if cap is None else min(cap, high)
