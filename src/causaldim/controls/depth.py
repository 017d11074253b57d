"""Control 'depth': the whole measurement at several layers of one model, harvested in
the same model pass as the headline layer (each layer its own store and sweep): epsilon,
N_causal growth, kappa_hat and the direct eranks (corrected) per layer."""

from __future__ import annotations

from pathlib import Path

from ..config import AnalysisConfig
from ..fmt import ci, growth, num
from ..measures.sigma import DIRECT
from ..paper import EPSILON_FALL
from ..progress import bar
from ..report.doc import Doc
from ..report.figures import finish, pyplot
from . import Context, Control


def default_depth_layers(n_layers: int, headline: int) -> list[int]:
    """Five layers from near the bottom to near the top, with the headline layer: the
    first and last blocks are left out (embedding- and unembedding-dominated)."""
    picks = {1, n_layers // 4, n_layers // 2, (3 * n_layers) // 4, n_layers - 2, headline}
    return sorted(i for i in picks if 0 <= i < n_layers)


def depth_summary(per_layer: dict[int, tuple[dict, dict]]) -> dict:
    """per_layer: {layer: (sigma estimates as in results.json, the layer's analysis)}.
    Per layer: epsilon, N_causal and its growth, kappa_hat and the direct eranks
    (corrected, with their intervals and whether they converged); and the
    ratio of epsilon at the first layer to that at the last (the paper: a 20x fall from
    layer 1 to layer 23 of Gemma-2-2B)."""
    rows = []
    for layer, (sigma, a) in sorted(per_layer.items()):
        free = a["kappa"]["free"]
        rows.append(
            {
                "layer": layer,
                "epsilon": a["epsilon"],
                "n_causal": [r["n_causal"] for r in a["per_width"]],
                "n_repr": [r["n_repr"] for r in a["per_width"]],
                "n_causal_growth": a["wedge"]["n_causal_growth"],
                "kappa_hat": free["kappa"],
                "kappa_95": free["interval_95"],
                "erank": {r: sigma[r]["erank_corrected"] for r in DIRECT if r in sigma},
                "erank_95": {r: sigma[r]["erank_corrected_95"] for r in DIRECT if r in sigma},
                "converged": {r: sigma[r]["converged"] for r in DIRECT if r in sigma},
            }
        )
    first, last = rows[0]["epsilon"], rows[-1]["epsilon"]
    kappas = [r["kappa_hat"] for r in rows]
    logits = [r["erank"]["logits"] for r in rows if r["erank"].get("logits") is not None]
    return {
        "layers": [r["layer"] for r in rows],
        "widths": [r["width"] for r in next(iter(per_layer.values()))[1]["per_width"]],
        "rows": rows,
        "epsilon_first_over_last": first / last if last > 0 else None,
        "paper_epsilon_fall": EPSILON_FALL,
        "kappa_range": [min(kappas), max(kappas)],
        "logits_erank_range": [min(logits), max(logits)] if logits else None,
    }


def plot_depth(c: dict, path: Path) -> Path:
    plt = pyplot()
    fig, (left, ax) = plt.subplots(1, 2, figsize=(10, 4.2))
    layers = c["layers"]
    left.plot(layers, [r["epsilon"] for r in c["rows"]], "o-", color="C3", label="epsilon")
    left.set_yscale("log")
    left.set_xlabel("layer")
    left.set_ylabel("epsilon (AtP calibration)")
    left.set_title("epsilon by layer")
    left.legend(fontsize=7)
    for i, reading in enumerate(DIRECT):
        color = f"C{i}"
        values = [r["erank"].get(reading) for r in c["rows"]]
        if any(v is not None for v in values):
            ax.plot(layers, values, "o-", color=color, label=f"corrected erank ({reading})")
    ax.plot(
        layers, [max(r["kappa_hat"], 0.5) for r in c["rows"]], "s--", color="k", label="kappa_hat"
    )
    return finish(
        fig,
        ax,
        path,
        "layer",
        "dimensions",
        f"Direct eranks and kappa_hat by layer ({c['architecture']})",
        log_x=False,
        log_y=True,
    )


def _marked(row: dict, reading: str) -> str:
    """A corrected erank, starred where it has not converged."""
    text = num(row["erank"].get(reading))
    return text + "*" if row.get("converged", {}).get(reading) is False else text


def depth_section(doc: Doc, c: dict) -> None:
    doc.table(
        [
            "layer",
            "epsilon",
            "N_causal per width",
            "growth",
            "kappa_hat",
            "corrected erank " + " / ".join(DIRECT),
        ],
        [
            [
                r["layer"],
                f"{r['epsilon']:.3g}",
                " ".join(map(str, r["n_causal"])),
                growth(r["n_causal_growth"]),
                f"{num(r['kappa_hat'])} {ci(r['kappa_95'])}",
                " / ".join(_marked(r, k) for k in DIRECT),
            ]
            for r in c["rows"]
        ],
    )
    ratio, first, last = c["epsilon_first_over_last"], c["layers"][0], c["layers"][-1]
    kappas, logits = c["kappa_range"], c["logits_erank_range"]
    text = [
        f"epsilon at layer {first} is x{ratio:.2f} that at layer {last} (paper: a "
        f"{c['paper_epsilon_fall']}x fall "
        "from layer 1 to 23 of Gemma-2-2B)"
        if ratio is not None
        else f"epsilon at layer {last} is 0, so no ratio is defined"
    ]
    text.append(
        f"kappa_hat ranges from {num(min(kappas))} to {num(max(kappas))} over layers "
        f"{', '.join(map(str, c['layers']))}"
    )
    if logits:
        text.append(
            f"the direct kappa (gauge-invariant logits reading) from {num(min(logits))} to "
            f"{num(max(logits))}"
        )
    unconverged = any(False in r.get("converged", {}).values() for r in c["rows"])
    doc.p(
        "; ".join(text) + ". Each layer has its own epsilon (its smallest SAE's percentile), "
        "so N_causal compares across layers only through that calibration; the direct "
        "eranks need no SAE and compare across layers as they are."
        + (
            " A starred erank has not converged: its layer's eval tokens hold fewer than 4 "
            "independent equivalents per dimension, so it may still be low."
            if unconverged
            else ""
        )
    )


def _extra_layers(cfg: AnalysisConfig, n_layers: int, layer: int) -> list[int]:
    return cfg.depth_layers or default_depth_layers(n_layers, layer)


def _compute(ctx: Context) -> dict:
    # With a lighter sweep of its own, the headline layer is measured again with it too,
    # so that every layer's epsilon and counts come from SAEs trained alike.
    lighter = ctx.analysis_cfg.lighter_controls
    per_layer = {} if lighter else {ctx.plan.layer: (ctx.here.sigma_dicts(), ctx.analysis)}
    others = [(i, s) for i, s in sorted(ctx.stores.items()) if lighter or i != ctx.plan.layer]
    for layer, store in bar(others, desc="depth", enabled=ctx.progress, leave=False):
        there = ctx.measure_other(store, ctx.out / "depth" / f"L{layer}")
        per_layer[layer] = (there.sigma_dicts(), there.analysis[ctx.headline])
    return depth_summary(per_layer)


CONTROL = Control(
    "depth",
    "Depth",
    _compute,
    depth_section,
    plot_depth,
    trains_own_saes=True,
    uses_control_sweep=True,
    extra_layers=_extra_layers,
)
