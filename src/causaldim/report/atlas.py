"""The atlas written out: one row per cell, layer, outlier rule, reading and metric
(atlas.csv), and a figure of kappa / d against relative depth (a line per model and
context length, a panel per corpus, a row per metric). atlas_md.py says from the numbers
what moves kappa."""

from __future__ import annotations

import csv
from pathlib import Path

from ..measures.sigma import HEADLINE
from .direct import below_floor

FIELDS = (
    "model",
    "corpus",
    "seq_len",
    "layer",
    "depth",
    "outliers",
    "reading",
    "metric",
    "kappa",
    "low",
    "high",
    "kappa_over_d",
    "converged",
    "independent_per_dim",
    "eval_tokens_needed",
    "plug_in",
    "later_gains_over_d",
)
METRICS = {"raw": "raw", "act": "activation-weighted"}


def rows(cells: list[dict]) -> list[dict]:
    out = []
    for c in cells:
        d, n = c["model"]["d_model"], c["model"]["n_layers"]
        gains = (c.get("weights") or {}).get("layers", {})
        for layer, rules in sorted(c["layers"].items(), key=lambda kv: int(kv[0])):
            for rule, readings in rules.items():
                for reading, metric, e in _by_metric(readings):
                    est = {**e, "samples_per_dim": e["n_samples"] / d}
                    value = None if below_floor(est) else e.get("erank_corrected")
                    lo, hi = e.get("erank_corrected_95") or (None, None)
                    lo, hi = (lo, hi) if value else (None, None)
                    out.append(
                        {
                            **c["cell"],
                            "layer": int(layer),
                            "depth": round(int(layer) / max(n - 1, 1), 4),
                            "outliers": rule,
                            "reading": reading,
                            "metric": metric,
                            "kappa": value,
                            "low": lo,
                            "high": hi,
                            "kappa_over_d": None if value is None else value / d,
                            "converged": e.get("converged"),
                            "independent_per_dim": (e.get("n_independent") or 0) / d,
                            "eval_tokens_needed": e.get("eval_tokens_needed"),
                            "plug_in": e.get("erank"),
                            "later_gains_over_d": (gains.get(layer) or {}).get(
                                "later_gains_over_d"
                            ),
                        }
                    )
    return out


def _by_metric(readings: dict) -> list[tuple[str, str, dict]]:
    """Each output reading raw, and its activation-weighted twin where a cell has one."""
    out = []
    for reading, e in readings.items():
        if reading == "activations":
            continue
        out.append((reading, "raw", e))
        if e.get("activation_weighted"):
            out.append((reading, "act", e["activation_weighted"]))
    return out


def write_csv(table: list[dict], path: Path) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(table)
    return path


def short(name: str) -> str:
    """A local path by its last part (a hub name keeps its owner)."""
    return Path(name).name if name.startswith(("/", ".", "~")) else name


def figure(table: list[dict], path: Path) -> Path:
    """kappa / d of the headline reading (outliers left out) against relative depth."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mine = [r for r in table if r["reading"] == HEADLINE and r["outliers"] == "left out"]
    corpora = sorted({r["corpus"] for r in mine})
    metrics = [m for m in METRICS if any(r["metric"] == m for r in mine)]
    fig, axes = plt.subplots(
        len(metrics), len(corpora), figsize=(5 * len(corpora), 4 * len(metrics)), squeeze=False
    )
    for (metric, corpus), ax in zip(
        [(m, c) for m in metrics for c in corpora], axes.flatten(), strict=True
    ):
        for model in sorted({r["model"] for r in mine}):
            for seq_len in sorted({r["seq_len"] for r in mine}):
                line = [
                    r
                    for r in mine
                    if (r["corpus"], r["model"], r["seq_len"], r["metric"])
                    == (corpus, model, seq_len, metric)
                ]
                line.sort(key=lambda r: r["depth"])
                xs = [r["depth"] for r in line if r["kappa_over_d"] is not None]
                ys = [r["kappa_over_d"] for r in line if r["kappa_over_d"] is not None]
                style = "-" if seq_len == min(r["seq_len"] for r in mine) else "--"
                ax.plot(xs, ys, style, marker=".", label=f"{short(model)}, seq {seq_len}")
        ax.axhline(0.86, color="grey", lw=0.8, ls=":", label="the paper's 0.86 (raw)")
        ax.set(title=f"{short(corpus)}, {METRICS[metric]}", ylabel="kappa / d")
        ax.set_xlabel("relative depth (layer / (layers - 1))")
        ax.set_ylim(0, 1)
        ax.set_xlim(-0.03, 1.03)  # the whole depth, also where an atlas measured a few
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
