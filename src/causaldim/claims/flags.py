"""Flags recomputed under the current rule. A results.json (or an atlas cell) keeps the
counts its flags were decided from, and the rule can change after it was written ("converged"
went from 4 to 8 independent equivalents per dimension); the claims and the report read
every flag from the stored counts under today's rule, so no verdict rests on a stale one."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator

from ..measures.debias import MIN_INDEPENDENT_PER_DIM


def estimates(table: dict) -> Iterator[dict]:
    """Every direct estimate of a sigma table (reading -> estimate), twins included."""
    for est in table.values():
        if isinstance(est, dict):
            yield est
            if isinstance(est.get("activation_weighted"), dict):
                yield est["activation_weighted"]


def recompute(est: dict, d: int) -> bool:
    """Set est's converged flag (and the eval tokens that would do) from its count of
    independent equivalents under the current rule; whether the flag changed."""
    n, stored = est.get("n_independent"), est.get("converged")
    if n is None or stored is None:
        return False
    converged = n >= MIN_INDEPENDENT_PER_DIM * d
    if converged == stored:
        return False
    est["converged"] = converged
    tokens = est.get("n_tokens")
    # the samples needed grow as the equivalents fall short (debias.correct's own scaling)
    est["eval_tokens_needed"] = (
        None
        if converged or not tokens
        else math.ceil(tokens * MIN_INDEPENDENT_PER_DIM * d / max(n, 1e-9))
    )
    est["converged_recomputed"] = f"stored {stored}, {n / d:.2f} per dimension"
    if not converged:
        est["warning"] = (
            f"not converged under the current rule: {n / d:.2f} independent equivalents per "
            f"dimension, {MIN_INDEPENDENT_PER_DIM:g} needed (the run called it converged "
            "under an older rule)"
        )
        est["cautions"] = [*(est.get("cautions") or []), ["not_converged", est["warning"]]]
    return True


def current(results: dict) -> dict:
    """A copy of a run's results whose convergence flags (the direct readings, their twins
    and every profile layer's) are the current rule's; the rule it used is recorded."""
    out = copy.deepcopy(results)
    d = out["store"]["model"]["d_model"]
    tables = [out.get("sigma") or {}]
    tables += list(((out.get("profile") or {}).get("layers") or {}).values())
    changed = sum(recompute(est, d) for table in tables for est in estimates(table))
    older = out.get("min_independent_per_dim", 4.0)
    if changed:
        out.setdefault("warnings", []).append(
            {
                "code": "run.flags_recomputed",
                "severity": "caution",
                "message": (
                    f"{changed} convergence flag(s) recomputed: the run decided them at "
                    f"{older:g} independent equivalents per dimension, the current rule "
                    f"needs {MIN_INDEPENDENT_PER_DIM:g}"
                ),
            }
        )
    out["min_independent_per_dim"] = MIN_INDEPENDENT_PER_DIM
    return out


def current_cell(cell: dict) -> dict:
    """An atlas cell with every layer's flags under the current rule."""
    out = copy.deepcopy(cell)
    d = out["model"]["d_model"]
    for layer in (out.get("layers") or {}).values():
        for table in layer.values():
            for est in estimates(table):
                recompute(est, d)
    return out


def stale(results: dict) -> list[str]:
    """Where a stored flag disagrees with the current rule: one line each."""
    out = copy.deepcopy(results)
    d = out["store"]["model"]["d_model"]
    tables = {"sigma": out.get("sigma") or {}}
    for i, layer in ((out.get("profile") or {}).get("layers") or {}).items():
        tables[f"profile layer {i}"] = layer
    return [
        f"{where}, {reading}: {est['converged_recomputed']}"
        for where, table in tables.items()
        for reading, top in table.items()
        for est in estimates({reading: top})
        if recompute(est, d)
    ]
