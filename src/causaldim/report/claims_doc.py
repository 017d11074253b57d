"""The claims as the report and `causaldim claims` show them: the conditions, then
table A (kappa) and table B (the SAE estimator), each row with its verdict and reason."""

from __future__ import annotations

from pathlib import Path

from ..claims import ESTIMATOR, KAPPA, TITLES, VERDICTS, across_runs, claims
from ..claims.conditions import conditions_lines, kappa_intervals, sae_intervals
from ..claims.quantities import (
    calibrated,
    calibration_count,
    direct_text,
    headline_sweep,
    kappa_hat_spread,
    spread_text,
)
from ..fmt import num
from .doc import Doc


def claims_section(doc: Doc, results: dict, level: int = 2) -> None:
    """The paper's claims in two tables, decided by claims.RULES on this run, under the
    conditions they were measured in."""
    found = claims(results)
    doc.h(level, "The paper's claims, tested")
    doc.p(
        "Each verdict is computed from results.json by a rule written once in causaldim "
        "(claims/*.py; docs/method.md says why each), and holds for these conditions "
        "only:"
    )
    doc.ul(conditions_lines(results))
    claims_tables(doc, results, found, level + 1)


def claims_tables(doc: Doc, results: dict | None, found: list, level: int) -> None:
    """Table A (kappa) and table B (the SAE estimator) of found; results, where given,
    for the direct kappa and kappa_hat's spread that table B is set against."""
    for table in (KAPPA, ESTIMATOR):
        rows = [c for c in found if c.table == table]
        if not rows:
            continue
        counts = ", ".join(f"{sum(c.verdict == v for c in rows)} {v}" for v in VERDICTS)
        doc.h(level, f"{'A' if table == KAPPA else 'B'}. {TITLES[table]}")
        if table == KAPPA:
            act = ", ".join(
                f"{sum((c.activation_weighted or ('', '', ''))[1] == v for c in rows)} {v}"
                for v in VERDICTS
            )
            doc.p(
                "Decided by the direct kappa, the corrected erank of the gauge-invariant "
                "E[J^T (I - 11^T/V) J] with its 95% interval, in the raw coordinates of the "
                "residual (the paper's definition); beside it the same rule on the same "
                "reading weighted by the activations, erank(C^1/2 Sigma C^1/2), which no "
                "linear map of the residual changes, and on the paper's literal E[J^T J] "
                "(which also counts the shift of all logits, which no prediction sees). The "
                f"SAE route decides none of these. Raw verdicts: {counts}; "
                f"activation-weighted: {act}."
            )
            doc.table(
                [
                    "claim",
                    "paper",
                    "test",
                    "raw, gauge-invariant (decides)",
                    "activation-weighted",
                    "literal E[J^T J]",
                ],
                [
                    [
                        c.claim,
                        c.paper,
                        c.test,
                        _verdict_cell(c.this_run, c.verdict, c.reason),
                        _verdict_cell(*c.activation_weighted) if c.activation_weighted else "",
                        _verdict_cell(*c.literal) if c.literal else "",
                    ]
                    for c in rows
                ],
            )
            doc.p(kappa_intervals())
            continue
        context = "" if results is None else estimator_context(results)
        doc.p(
            f"{context}Verdicts: {counts}. The rows that set the SAE route against the direct "
            "kappa are decided against the activation-weighted kappa too: AtP (activation "
            "times gradient) weighs directions as it does."
        )
        doc.table(
            ["claim", "paper", "this run", "test", "verdict", "against kappa_act"],
            [
                [
                    c.claim,
                    c.paper,
                    c.this_run,
                    c.test,
                    f"**{c.verdict}**: {c.reason}",
                    _verdict_cell(*c.activation_weighted) if c.activation_weighted else "",
                ]
                for c in rows
            ],
        )
        doc.p(f"{sae_intervals()} {kappa_intervals()}")


def _verdict_cell(shown: str, verdict: str, reason: str) -> str:
    return f"{shown}; **{verdict}**: {reason}"


def estimator_context(results: dict) -> str:
    """What table B's rows are set against: the direct kappa, the synthetic model's known
    kappa, kappa_hat's whole uncertainty and the count the calibration fixes."""
    a = headline_sweep(results)
    syn = (results.get("controls") or {}).get("synthetic") or {}
    parts = [
        f"This layer's direct kappa: {direct_text(results)}; activation-weighted "
        f"{direct_text(results, 'act')}."
    ]
    if syn.get("k"):
        parts.append(
            f"The synthetic model's known kappa: {syn['k']} (the direct erank reads "
            f"{num((syn.get('direct') or {}).get('erank'), 2)})."
        )
    spread = kappa_hat_spread(results)
    if spread:
        parts.append(f"kappa_hat's whole uncertainty: {spread_text(spread)}.")
    parts.append(
        f"N_causal at the reference width is {calibrated(calibration_count(a), a)} for any "
        "layer, architecture or dictionary: it decides nothing."
    )
    return " ".join(parts) + " "


def across_section(doc: Doc, runs: list[tuple[str, dict]], level: int = 2) -> None:
    """The claims that compare runs, decided across the runs given."""
    doc.h(level, "Across the runs: the claims one run cannot test")
    doc.p(
        "kappa and the text: runs of one model and layer on different corpora; kappa and "
        "the scale: runs of different models at matched relative depth on one corpus. "
        "Each run's conditions are stated in its own section."
    )
    claims_tables(doc, None, across_runs(runs), level + 1)


def atlas_section(doc: Doc, path: Path, level: int = 2) -> None:
    """The claims an atlas answers (claims/atlas.py: the claims tables' rules at each
    cell's middle layer), from its atlas.json."""
    from ..claims.atlas import atlas_claims as claims
    from ..fileio import read_sealed_json

    path = path / "atlas.json" if path.is_dir() else path
    atlas = read_sealed_json(path, "atlas")
    doc.h(level, f"Across the atlas: {path}")
    doc.p(
        f"Made by `{atlas['command']}`: one eval pass a cell, no SAEs; each claim read at "
        "the cells' middle layer by the same rules as the tables above."
    )
    doc.table(
        ["claim", "compared", "verdict", "why"],
        [
            [claim, shown, f"**{verdict}**", why]
            for claim, shown, verdict, why in claims(atlas["cells"])
        ],
    )


def overview(doc: Doc, runs: list[tuple[str, dict]], level: int = 2) -> None:
    """Every claim's verdict on every run, one column per run (the gauge-invariant reading
    for claims about kappa); each run's section below gives the figures and reasons."""
    found = [claims(results) for _, results in runs]
    doc.h(level, "Every run at a glance")
    doc.table(
        ["claim", *(name for name, _ in runs)],
        [
            [f"{'A' if row.table == KAPPA else 'B'}: {row.claim}", *(f[i].verdict for f in found)]
            for i, row in enumerate(found[0])
        ],
    )
