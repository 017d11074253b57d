"""What a reader meets first, in the report and at the end of a run: the answer (the
direct kappa in both metrics, whether to trust it), a line per claims table with its
verdicts, then the cautions in words, the most important first; provenance after."""

from __future__ import annotations

import re

from ..claims import ESTIMATOR, FAILS, HOLDS, KAPPA, TITLES, UNTESTABLE, claims
from ..fmt import ci, num
from ..measures.sigma import HEADLINE
from .cautions import CAUTION, touching_headline
from .direct import below_floor, flagged
from .doc import Doc

TABLE_LETTER = {KAPPA: "A", ESTIMATOR: "B"}


def slug(heading: str) -> str:
    """A heading's anchor, as GitHub writes it and Doc.html gives it: lower case, spaces
    to hyphens, other punctuation dropped."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).strip().replace(" ", "-")


def table_heading(table: str) -> str:
    return f"{TABLE_LETTER[table]}. {TITLES[table]}"


def direct_line(results: dict) -> str:
    """The direct kappa of the layer, raw and activation-weighted, each with kappa / d
    and whether it converged."""
    sigma = results.get("sigma") or {}
    est = sigma.get(HEADLINE)
    layer = results["store"]["layer"]
    if est is None:
        return f"**kappa of layer {layer}**: not measured (the run had no logit probes)."
    d = results["store"]["model"]["d_model"]

    def one(e: dict | None) -> str:
        if e is None:
            return "not measured"
        if below_floor(e) or e.get("erank_corrected") is None:
            return flagged(e)  # n/a, and why
        value = f"{num(e['erank_corrected'])} {ci(e['erank_corrected_95'])}"
        value += f" = {e['erank_corrected'] / d:.2f} d"
        per_dim = (e.get("n_independent") or 0) / d
        if e.get("converged"):
            return f"{value}, converged ({per_dim:.1f} independent equivalents per dimension)"
        need = e.get("eval_tokens_needed")
        return f"{value}, NOT converged ({per_dim:.1f} per dimension" + (
            f"; about {need:,} eval tokens would do)" if need else ")"
        )

    return (
        f"**kappa of layer {layer}** (d = {d}), raw (the paper's definition): {one(est)}; "
        f"activation-weighted: {one(est.get('activation_weighted'))}."
    )


def claims_lines(results: dict, links: bool = True) -> list[str]:
    """Per claims table: its verdicts by count, linked to the table."""
    found = claims(results)
    out = []
    for table in (KAPPA, ESTIMATOR):
        rows = [c for c in found if c.table == table]
        n = {v: sum(c.verdict == v for c in rows) for v in (HOLDS, FAILS, UNTESTABLE)}
        heading = table_heading(table)
        where = f"[table {TABLE_LETTER[table]}](#{slug(heading)})" if links else "claims.md"
        holds = "holds" if n[HOLDS] == 1 else "hold"
        fails = "does not hold" if n[FAILS] == 1 else "do not hold"
        out.append(
            f"{TITLES[table]}: {n[HOLDS]} {holds}, {n[FAILS]} {fails}, {n[UNTESTABLE]} not "
            f"testable here ({where})"
        )
    return out


def caution_words(results: dict) -> list[str]:
    """Every warning in words, its code after it: cautions that touch the headline first,
    then the other cautions, then the notes."""
    warned = results.get("warnings") or []
    arch = (results.get("headline") or {}).get("architecture") or ""
    headline_codes = set(touching_headline(warned, arch))

    def rank(w: dict) -> tuple[bool, bool, bool]:  # False sorts first
        own = w["code"].startswith(f"direct.{HEADLINE}.")  # the direct kappa's own
        return (w["severity"] != CAUTION, not own, w["code"] not in headline_codes)

    return [
        f"{w['message'][:1].upper()}{w['message'][1:]} (`{w['code']}`)"
        for w in sorted(warned, key=rank)
    ]


def first_screen(doc: Doc, results: dict) -> None:
    """The answer, the verdicts and the cautions, before anything else."""
    doc.ul([direct_line(results), *claims_lines(results)])
    words = caution_words(results)
    if words:
        doc.h(2, "Read with care")
        doc.ul(words)
