"""What sets kappa: the direct kappa in both metrics beside what the weights alone predict
(results.json's "sigma", "profile" and "weights"), as a report section and a figure."""

from __future__ import annotations

import math
from pathlib import Path

from ..fmt import num
from ..measures.sigma import HEADLINE
from .doc import Doc
from .figures import legend_below, pyplot, save


def _value(e: dict | None) -> float | None:
    return None if not e else e.get("erank_corrected")


def depth_rows(results: dict) -> list[dict]:
    """Per measured layer: the headline's raw and activation-weighted kappa / d and the
    later gains' erank / d (the profile's layers, else the run's layer)."""
    d = results["store"]["model"]["d_model"]
    weights = (results.get("weights") or {}).get("layers", {})
    prof = results.get("profile")
    if prof:
        measured = {i: row.get(HEADLINE) for i, row in prof["layers"].items()}
    else:
        measured = {str(results["store"]["layer"]): results["sigma"].get(HEADLINE)}
    rows = []
    for i in sorted(measured, key=int):
        e = measured[i]
        raw, act = _value(e), _value((e or {}).get("activation_weighted"))
        rows.append(
            {
                "layer": int(i),
                "raw": None if raw is None else raw / d,
                "act": None if act is None else act / d,
                "later_gains": (weights.get(i) or {}).get("later_gains_over_d"),
            }
        )
    return rows


def log_correlation(rows: list[dict], key: str) -> float | None:
    """Pearson correlation of log(kappa / d) in a metric with log(later gains' erank / d)
    over the layers that have both (None below three layers or where either is flat to
    rounding)."""
    pairs = [
        (math.log(r[key]), math.log(r["later_gains"])) for r in rows if r[key] and r["later_gains"]
    ]
    if len(pairs) < 3:
        return None
    xs, ys = zip(*pairs, strict=True)
    if max(ys) - min(ys) < 1e-6 or max(xs) - min(xs) < 1e-6:
        return None  # flat (equal gains: an initialised model): rounding has no correlation
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxy = sum((x - mx) * (y - my) for x, y in pairs)
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    return None if sxx <= 0 or syy <= 0 else sxy / math.sqrt(sxx * syy)


def weights_section(doc: Doc, results: dict, figures: dict[str, Path]) -> None:
    w = results.get("weights")
    if not w:
        return
    d = w["d_model"]
    doc.h(2, "What sets kappa")
    gains = w.get("final_gains_range")
    doc.p(
        "The raw kappa counts directions in the residual's own coordinates, so how the model "
        "scales them (its norm gains) can set it; the activation-weighted kappa does not "
        "depend on that scale. From the weights alone, no forward pass: the unembedding's "
        f"centred Gram W_U^T P W_U has erank {num(w['unembedding'])} "
        f"({w['unembedding'] / d:.2f} d); with the final norm's gains on both sides"
        + (f" (from {gains[0]:.3g} to {gains[1]:.3g})" if gains else "")
        + f", {num(w['unembedding_gained'])} ({w['unembedding_gained'] / d:.2f} d). Each "
        "layer's later gains: the erank of the summed squared gains of the final norm and "
        "of the norms reading the residual in the blocks after it; where it follows kappa / "
        "d over depth, the gains, not the representation, set the raw kappa."
    )
    rows = depth_rows(results)

    def cell(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.3f}"

    doc.table(
        ["layer", "kappa / d (raw)", "kappa_act / d", "later gains' erank / d"],
        [[str(r["layer"]), cell(r["raw"]), cell(r["act"]), cell(r["later_gains"])] for r in rows],
    )
    raw, act = log_correlation(rows, "raw"), log_correlation(rows, "act")
    if raw is not None:
        doc.p(
            f"Over these {len(rows)} layers, the correlation of log(kappa / d) with log(later "
            f"gains' erank / d) is {raw:.2f} raw"
            + (f" and {act:.2f} activation-weighted" if act is not None else "")
            + "."
        )
    if "weights" in figures:
        doc.img(figures["weights"], "what sets kappa")


def plot_weights(results: dict, path: Path) -> Path:
    """kappa / d in both metrics and the later gains' erank / d against depth."""
    plt = pyplot()
    rows = depth_rows(results)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    x = [r["layer"] for r in rows]
    for key, label, style in (
        ("raw", "kappa / d, raw", "-o"),
        ("act", "kappa_act / d, activation-weighted", "-s"),
        ("later_gains", "later gains' erank / d (weights alone)", "--"),
    ):
        ax.plot(
            x,
            [r[key] if r[key] is not None else float("nan") for r in rows],
            style,
            ms=3,
            label=label,
        )
    ax.set_xlabel("layer (output of block)")
    ax.set_ylabel("fraction of d")
    ax.set_ylim(0, 1.05)
    ax.set_title("what sets kappa: the metric and the norm gains")
    legend_below(ax)
    fig.tight_layout()
    return save(fig, path)


def ladder_section(doc: Doc, results: dict, figures: dict[str, Path]) -> None:
    lad = results.get("ladder")
    if not lad:
        return
    doc.h(2, "Which directions matter, by intervention")
    doc.p(
        f"At layer {lad['layer']}, keep the top k directions of the residual by each ranking, "
        "mean-ablate the rest, and measure KL(clean || edited) of the next-token distribution "
        f"on {lad['sequences']} held-out sequences ({lad['n_predictions']:,} predictions; "
        f"{lad['split']}). The rankings: "
        + "; ".join(f"{name}, {c['what']}" for name, c in lad["rankings"].items())
        + ". An erank counts directions; this measures how many the output needs."
    )
    bars = [str(b) for b in lad["bars"]]

    def k_text(k: int | None) -> str:
        return "none of the ladder" if k is None else f"{k:,}"

    rows = [[name, *(k_text(lad["within"][name][b]) for b in bars)] for name in lad["rankings"]]
    doc.table(["ranking", *(f"smallest k with KL <= {b}" for b in bars)], rows)
    e = lad["eranks"]
    doc.p(
        f"Beside them, the eranks of the same reading: raw kappa {num(e['raw'])}, "
        f"activation-weighted {num(e['act'])}; the ladder's k are "
        f"{', '.join(str(k) for k in lad['k'])}."
    )
    if "ladder" in figures:
        doc.img(figures["ladder"], "KL against the directions kept")


def plot_ladder(results: dict, path: Path) -> Path:
    """KL(clean || edited) against the directions kept, per ranking, with the eranks."""
    plt = pyplot()
    lad = results["ladder"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ks = lad["k"]
    for name, c in lad["rankings"].items():
        ax.plot(ks, [max(v, 1e-6) for v in c["kl"]], "-o", ms=3, label=name)
    for bar in lad["bars"]:
        ax.axhline(bar, color="grey", lw=0.8, ls=":")
    for key, style in (("raw", "--"), ("act", "-.")):
        if lad["eranks"].get(key):
            ax.axvline(lad["eranks"][key], color="black", lw=0.8, ls=style, label=f"kappa ({key})")
    ax.set_yscale("log")
    ax.set_xlabel("directions kept (k)")
    ax.set_ylabel("KL(clean || edited), nats per prediction")
    ax.set_title(f"which directions matter at layer {lad['layer']}")
    legend_below(ax)
    fig.tight_layout()
    return save(fig, path)
