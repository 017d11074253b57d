"""The paper's claims, tested on one run, in two tables: (A) claims about kappa itself,
decided by the direct estimate on the gauge-invariant reading with the paper's literal
E[J^T J] beside it (kappa.py); (B) claims about the SAE estimator, set against the
direct kappa and the synthetic model's known kappa (estimator.py, controls.py).
Per claim: the paper's figure, this run's with its interval, the rule that decides it and
the verdict (holds / does not hold / not testable here, with the reason). Everything is
read from results.json by rules written once and stated in docs/method.md ("The claims,
tested"); nothing is typed by hand. Claims that compare runs (text, scale) are decided
across runs by across_runs()."""

from __future__ import annotations

from ..measures.sigma import HEADLINE
from . import across, estimator, kappa
from .flags import current
from .verdicts import ESTIMATOR, FAILS, HOLDS, KAPPA, UNTESTABLE, VERDICTS, Claim, Rule

__all__ = ["FAILS", "HOLDS", "UNTESTABLE", "VERDICTS", "KAPPA", "ESTIMATOR", "Claim"]
__all__ += ["RULES", "claims", "across_runs"]

RULES: dict[str, tuple[Rule, ...]] = {KAPPA: kappa.RULES, ESTIMATOR: estimator.RULES}
TITLES = {
    KAPPA: "Claims about kappa, decided by the direct estimate",
    ESTIMATOR: "Claims about the SAE estimator, set against the direct kappa",
}


def claims(results: dict) -> list[Claim]:
    """Every claim of both tables, decided on this run (its flags under the current
    rule), table A first."""
    results = current(results)

    def row(
        rule: Rule, table: str, decided: tuple, literal: tuple | None = None, act=None
    ) -> Claim:
        shown, verdict, reason = decided
        paper = rule.paper(results["paper"])
        return Claim(
            rule.key, table, rule.claim, paper, shown, rule.test, verdict, reason, literal, act
        )

    return [
        *(
            row(
                r,
                KAPPA,
                r.decide(results, HEADLINE),
                r.decide(results, kappa.LITERAL),
                r.decide(results, kappa.ACT),
            )
            for r in RULES[KAPPA]
        ),
        *(
            row(
                r,
                ESTIMATOR,
                r.decide(results),
                act=r.decide(results, "act") if r.key in estimator.BOTH_METRICS else None,
            )
            for r in RULES[ESTIMATOR]
        ),
    ]


def across_runs(runs: list[tuple[str, dict]]) -> list[Claim]:
    """The claims one run cannot test (kappa and the text, kappa and the scale), decided
    across the runs given, each named (their flags under the current rule)."""
    return across.across([(name, current(r)) for name, r in runs])
