"""Control 'scale': two models of one family at matched relative depth, compared by the
shape of their AtP distributions (a KS distance after normalising by each model's own
epsilon), not only by the calibrated counts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from scipy.stats import ks_2samp

from ..config import AnalysisConfig, HarvestConfig
from ..fmt import num
from ..harvest import Plan, harvest, plan
from ..measures.score import Scores
from ..model.load import resolve_model
from ..report.doc import Doc
from ..report.figures import finish, pyplot
from . import Context, Control


def matched_layer(layer: int, n_layers: int, other_n_layers: int) -> int:
    """The layer of a model with other_n_layers blocks at the same relative depth."""
    return min(other_n_layers - 1, max(0, round((layer + 1) / n_layers * other_n_layers) - 1))


def normalised_log_atp(scores: Scores, epsilon: float) -> np.ndarray:
    """log10(AtP / epsilon) of the features that fired: a pure rescaling of every score
    moves epsilon with it and leaves this unchanged."""
    atp = scores.atp[scores.fired > 0].numpy()
    return np.log10(np.maximum(atp, 1e-300) / epsilon)


def ks_shape(a: np.ndarray, b: np.ndarray, permutations: int = 1000, seed: int = 0) -> dict:
    """Two-sample KS statistic between a and b, with a permutation p-value (the share of
    random relabellings of the pooled values whose statistic reaches the observed one)."""
    # scipy's decorators leave ks_2samp's result typed without its fields (here and below)
    observed = float(ks_2samp(a, b).statistic)  # pyright: ignore[reportAttributeAccessIssue]
    gen = np.random.default_rng(seed)
    pooled, hits = np.concatenate([a, b]), 0
    for _ in range(permutations):
        gen.shuffle(pooled)
        ks = ks_2samp(pooled[: len(a)], pooled[len(a) :])
        hits += ks.statistic >= observed  # pyright: ignore[reportAttributeAccessIssue]
    return {
        "ks": observed,
        "p_value": (hits + 1) / (permutations + 1),
        "permutations": permutations,
        "n": [len(a), len(b)],
    }


def split_half_ks(scores: Scores, epsilon: float) -> float | None:
    """The within-model null: the KS statistic between the normalised AtP of the features
    scored on the first half of the eval blocks and on the second. Sampling alone moves the
    shape this much; a difference between models must exceed it to be one of the models."""
    blocks = len(scores.tokens)
    if blocks < 2:
        return None
    first = (torch.arange(blocks) < blocks // 2).double()
    halves = []
    for w in (first, 1 - first):
        atp, fired = scores.resample(w)
        x = atp[fired > 0].numpy()
        halves.append(np.log10(np.maximum(x, 1e-300) / epsilon))
    if min(len(h) for h in halves) == 0:
        return None
    return float(ks_2samp(*halves).statistic)  # pyright: ignore[reportAttributeAccessIssue]


def scale_comparison(
    a: tuple[dict[int, Scores], dict],
    b: tuple[dict[int, Scores], dict],
    names: tuple[str, str],
    permutations: int = 1000,
    seed: int = 0,
) -> dict:
    """a, b: (AtP scores by width, the analysis) of two models. Per width rank (the two
    sweeps have the same widths): the KS comparison of the normalised AtP distributions,
    the counts each model's own epsilon gives, and quantiles for the figure."""
    rows = []
    (scores_a, an_a), (scores_b, an_b) = a, b
    for (wa, sa), (wb, sb), ra, rb in zip(
        sorted(scores_a.items()),
        sorted(scores_b.items()),
        an_a["per_width"],
        an_b["per_width"],
        strict=True,
    ):
        xa = normalised_log_atp(sa, an_a["epsilon"])
        xb = normalised_log_atp(sb, an_b["epsilon"])
        qs = np.linspace(0, 1, 41)
        null = [split_half_ks(sa, an_a["epsilon"]), split_half_ks(sb, an_b["epsilon"])]
        known = [k for k in null if k is not None]
        rows.append(
            {
                "widths": [wa, wb],
                **ks_shape(xa, xb, permutations, seed + wa),
                # each model's split-half KS; the margin a difference must exceed
                "null_ks": null,
                "margin": max(known) if known else None,
                "n_causal": [ra["n_causal"], rb["n_causal"]],
                "quantiles": [
                    [float(v) for v in np.quantile(xa, qs)],
                    [float(v) for v in np.quantile(xb, qs)],
                ],
            }
        )
    return {
        "models": list(names),
        "n_widths_differ": sum(bool(r["p_value"] < 0.05) for r in rows),
        # beyond sampling: p < 0.05 and a KS above both models' split-half KS
        "n_widths_beyond_null": sum(
            bool(r["p_value"] < 0.05 and r["margin"] is not None and r["ks"] > r["margin"])
            for r in rows
        ),
        "epsilon": [an_a["epsilon"], an_b["epsilon"]],
        "kappa_hat": [an_a["kappa"]["free"]["kappa"], an_b["kappa"]["free"]["kappa"]],
        "rows": rows,
    }


def plot_scale(c: dict, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    r = c["rows"][-1]  # the widest pair
    qs = [i / (len(r["quantiles"][0]) - 1) for i in range(len(r["quantiles"][0]))]
    for model, quantiles, style in zip(c["models"], r["quantiles"], ("-", "--"), strict=True):
        ax.plot(quantiles, qs, style, label=f"{model} (layer of {r['widths'][0]:,} features)")
    ax.axvline(0.0, color="grey", lw=0.8, label="epsilon")
    return finish(
        fig,
        ax,
        path,
        "log10(AtP / epsilon), firing features",
        "cumulative fraction",
        f"AtP distributions after normalising by epsilon: KS {r['ks']:.3f}, p {r['p_value']:.3g}",
        log_x=False,
        log_y=False,
    )


def scale_section(doc: Doc, c: dict) -> None:
    doc.table(
        [
            "widths",
            "KS (log AtP / epsilon)",
            "permutation p",
            "within-model KS (split halves)",
            "features",
            "N_causal",
        ],
        [
            [
                f"{r['widths'][0]:,}",
                f"{r['ks']:.3f}",
                f"{r['p_value']:.3g}",
                " / ".join("n/a" if k is None else f"{k:.3f}" for k in r.get("null_ks", [None]))
                if "null_ks" in r
                else "n/a",
                f"{r['n'][0]:,} / {r['n'][1]:,}",
                f"{r['n_causal'][0]} / {r['n_causal'][1]}",
            ]
            for r in c["rows"]
        ],
    )
    doc.p(
        f"{c['models'][0]} (layer {c['layers'][0]} of {c['n_layers'][0]}, d={c['d_model'][0]}) "
        f"against {c['models'][1]} (layer {c['layers'][1]} of {c['n_layers'][1]}, "
        f"d={c['d_model'][1]}), the same widths: the normalised AtP distributions differ in "
        f"shape (permutation p < 0.05) at {c['n_widths_differ']} of {len(c['rows'])} widths"
        + (
            f", beyond what splitting one model's eval tokens in halves moves it (the "
            f"within-model null) at {c['n_widths_beyond_null']}"
            if "n_widths_beyond_null" in c
            else ""
        )
        + "; "
        f"kappa_hat {num(c['kappa_hat'][0])} against {num(c['kappa_hat'][1])}. Normalising by each "
        "model's own epsilon removes any pure rescaling of the scores, so a difference here "
        "is one of shape; with equal widths for models of different d the SAEs are not "
        "equally wide relative to their layers."
    )


def _side_plan(cfg: HarvestConfig, analysis_cfg: AnalysisConfig, main: Plan) -> Plan | None:
    """The second model's harvest, at the headline layer's relative depth."""
    if not analysis_cfg.scale_model:
        return None
    other = resolve_model(analysis_cfg.scale_model, cfg.trust_remote_code)
    layer = matched_layer(main.layer, main.source.n_layers, other.n_layers)
    return plan(
        replace(cfg, model=analysis_cfg.scale_model, layer=layer, out=str(Path(cfg.out) / "scale"))
    )


def _compute(ctx: Context) -> dict:
    side = ctx.side_plans.get("scale")
    if side is None:
        return {"skipped": "needs a second model of the family: pass --scale-model"}
    other = harvest(side.config, progress=ctx.progress, the_plan=side).store
    there = ctx.measure_other(other, ctx.out / "scale")
    assert ctx.analysis_cfg.scale_model is not None  # the side plan is its
    names = (ctx.plan.config.model, ctx.analysis_cfg.scale_model)
    return {
        "layers": [ctx.plan.layer, side.layer],
        "n_layers": [ctx.plan.source.n_layers, side.source.n_layers],
        "d_model": [ctx.store.d_model, other.d_model],
        **scale_comparison(
            (ctx.scores, ctx.analysis),
            (there.scores[ctx.headline], there.analysis[ctx.headline]),
            names,
            seed=ctx.seed,
        ),
    }


CONTROL = Control(
    "scale",
    "Scale",
    _compute,
    scale_section,
    plot_scale,
    trains_own_saes=True,
    uses_control_sweep=True,
    side_plan=_side_plan,
)
