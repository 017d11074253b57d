"""results.json as flat tables: one row a reading, width, fit, layer or SAE, for
DataFrames and the CSV files written beside results.json."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from pathlib import Path

from ..fileio import atomic_write_bytes
from .direct import by_metric

Row = dict[str, object]


def _pair(interval) -> tuple[object, object]:
    return (None, None) if not interval else (interval[0], interval[1])


def sigma_rows(results: dict) -> list[Row]:
    """The direct estimates, one row a reading (loss, logits, logits_uncentred, fisher,
    activations) and metric (raw; act, the activation-weighted twins); "erank" is the
    corrected one (the activations' plug-in for that reference line, which has no
    correction)."""
    d = results["store"]["model"]["d_model"]
    rows = []
    for reading, metric, e in by_metric(results["sigma"]):
        lo, hi = _pair(e.get("erank_corrected_95"))
        pr_lo, pr_hi = _pair(e.get("participation_ratio_unbiased_95"))
        value = e["erank"] if e.get("erank_corrected") is None else e["erank_corrected"]
        rows.append(
            {
                "reading": reading,
                "metric": metric,
                "definition": e.get("definition"),
                "erank": value,
                "erank_low": lo,
                "erank_high": hi,
                "erank_over_d": value / d,
                "converged": e.get("converged"),
                "eval_tokens_needed": e.get("eval_tokens_needed"),
                "n_independent": e.get("n_independent"),
                "common_mode_share": e.get("common_mode_share"),
                "participation_ratio": e.get("participation_ratio_unbiased"),
                "participation_ratio_low": pr_lo,
                "participation_ratio_high": pr_hi,
                "erank_plugin": e["erank"],
                "participation_ratio_plugin": e["participation_ratio"],
                "n_samples": e["n_samples"],
                "n_eff": e["n_eff"],
                "samples_per_dim": e["samples_per_dim"],
                **{f"directions_{k[:-1]}": v for k, v in e["directions_for"].items()},
                "warning": e.get("warning"),
            }
        )
    return rows


WIDTH_KEYS = (
    "n_repr",
    "n_causal",
    "n_too_rare",
    "inert_fraction",
    "l0",
    "fraction_variance_explained",
    "dead_fraction",
    "ce_loss_recovered",
    "atp_max",
    "markov_ceiling",
    "median_firings_train",
    "median_firings_eval",
    "top_firing_rate",
    "n_causal_other",
)


def width_rows(results: dict) -> list[Row]:
    """Each sweep's SAEs, one row an (architecture, width): the counts, the SAE's quality
    and the diagnostics; kappa_sae where the run measured it."""
    rows = []
    for arch, a in results["sweep"].items():
        attributed = {w["width"]: w for w in (a.get("attributed") or {}).get("per_width", [])}
        rare_other = (a.get("sensitivity") or {}).get("n_too_rare") or [None] * len(a["per_width"])
        for w, rare in zip(a["per_width"], rare_other, strict=True):
            lo, hi = _pair(w.get("n_causal_95"))
            att = attributed.get(w["width"], {})
            rows.append(
                {
                    "architecture": arch,
                    "width": w["width"],
                    **{k: w.get(k) for k in WIDTH_KEYS},
                    "n_causal_low": lo,
                    "n_causal_high": hi,
                    "n_too_rare_other": rare,
                    "kappa_sae": att.get("erank"),
                    "epsilon": a["epsilon"],
                    "normalisation": a["normalisation"],
                }
            )
    return rows


def fit_rows(results: dict) -> list[Row]:
    """Every saturating form fitted to each sweep, free and constrained to d, as the
    report shows them; 'chosen' marks the form the criterion picked, and 'estimable'
    whether the sweep's kappa_hat is to be read as a number at all."""
    rows = []
    for arch, a in results["sweep"].items():
        for constraint, k in (a.get("kappa") or {}).items():
            for form, f in k["fits"].items():
                lo, hi = _pair(f["interval_95"])
                rows.append(
                    {
                        "architecture": arch,
                        "estimable": a["estimable"],
                        "constraint": constraint,
                        "form": form,
                        "chosen": form == k["form"],
                        "kappa_hat": f["kappa"],
                        "kappa_hat_low": lo,
                        "kappa_hat_high": hi,
                        "aicc": f["aicc"],
                        "aic": f["aic"],
                        "at_bound": f["at_bound"],
                    }
                )
    return rows


def profile_rows(results: dict) -> list[Row]:
    """--profile: one row a (layer, reading, metric)."""
    prof = results.get("profile")
    if not prof:
        return []
    rows = []
    for layer in sorted(prof["layers"], key=int):
        for reading, metric, e in by_metric(prof["layers"][layer]):
            lo, hi = _pair(e.get("erank_corrected_95"))
            corrected = e.get("erank_corrected")
            rows.append(
                {
                    "layer": int(layer),
                    "reading": reading,
                    "metric": metric,
                    "erank": e["erank"] if corrected is None else corrected,
                    "erank_low": lo,
                    "erank_high": hi,
                    "converged": e.get("converged"),
                    "common_mode_share": e.get("common_mode_share"),
                    "participation_ratio": e.get("participation_ratio_unbiased"),
                    "erank_plugin": e.get("erank"),
                    "run_layer": int(layer) == prof["run_layer"],
                }
            )
    return rows


def sae_rows(results: dict) -> list[Row]:
    """The SAEs of the run: where they are, and whether they were trained, reused or
    imported."""
    return [{"name": name, **info} for name, info in results["saes"].items()]


def claim_rows(results: dict) -> list[Row]:
    """The paper's claims and their verdicts on this run (claims.py)."""
    from ..claims import claims

    return [c.to_dict() for c in claims(results)]


TABLES: dict[str, Callable[[dict], list[Row]]] = {
    "sigma": sigma_rows,
    "widths": width_rows,
    "fits": fit_rows,
    "profile": profile_rows,
    "saes": sae_rows,
    "claims": claim_rows,
}


def write_csvs(results: dict, folder: Path) -> list[Path]:
    """Every non-empty table as folder/NAME.csv (empty cells for None)."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, rows_of in TABLES.items():
        rows = rows_of(results)
        if not rows:
            continue
        fields = list(dict.fromkeys(k for row in rows for k in row))
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        path = folder / f"{name}.csv"
        atomic_write_bytes(path, buf.getvalue().encode())
        written.append(path)
    return written
