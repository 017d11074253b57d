"""Control 'thresholds': the counts and kappa_hat with epsilon at the 95th, 98th, 99th
and 99.5th percentiles of the reference width's AtP. A finding that holds at one
percentile only is made by the threshold."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..config import AnalysisConfig
from ..fmt import ci, growth, num
from ..measures.analysis import analyze
from ..measures.score import Scores
from ..measures.stats import spread
from ..progress import bar
from ..report.doc import Doc
from ..report.figures import finish, pyplot
from . import Context, Control

PERCENTILES = (95.0, 98.0, 99.0, 99.5)


def threshold_robustness(
    scores: dict[int, Scores],
    evals: dict[int, dict],
    d_model: int,
    cfg: AnalysisConfig,
    seed: int = 0,
    percentiles: tuple[float, ...] = PERCENTILES,
    progress: bool = False,
) -> dict:
    """The counts and kappa_hat with epsilon at each percentile of the reference width's
    AtP: a finding that holds at one percentile only is made by the threshold."""
    rows = []
    for p in bar(percentiles, desc="thresholds", enabled=progress, leave=False):
        a = analyze(scores, evals, d_model, replace(cfg, percentile=p), seed, kappa_sae=False)
        free, bounded = a["kappa"]["free"], a["kappa"]["at_most_d"]
        rows.append(
            {
                "percentile": p,
                "epsilon": a["epsilon"],
                "epsilon_95": a["epsilon_95"],
                "n_causal": [r["n_causal"] for r in a["per_width"]],
                "n_causal_95": [r.get("n_causal_95", []) for r in a["per_width"]],
                "n_causal_growth": a["wedge"]["n_causal_growth"],
                "n_causal_loglog_slope": a["wedge"]["n_causal_loglog_slope"],
                "kappa_hat": free["kappa"],
                "kappa_95": free["interval_95"],
                "kappa_at_most_d": bounded["kappa"],
                "form": free["form"],
            }
        )
    growths = [r["n_causal_growth"] for r in rows if r["n_causal_growth"] is not None]
    return {
        "widths": sorted(scores),
        "rows": rows,
        # calibrations with a growth ratio (N_causal > 0 at the smallest width), and those
        # at which N_causal grows with width
        "n_growths": len(growths),
        "n_growing": sum(g > 1 for g in growths),
        # how far kappa_hat moves between the calibrations (None: fewer than 2 fits)
        "kappa_ratio": spread([r["kappa_hat"] for r in rows]),
    }


def plot_thresholds(c: dict, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    for i, r in enumerate(c["rows"]):
        ax.plot(
            c["widths"],
            [max(v, 0.5) for v in r["n_causal"]],
            "o-",
            color=plt.cm.plasma(i / max(len(c["rows"]) - 1, 1)),
            label=f"{r['percentile']:g}th pct: kappa_hat {num(r['kappa_hat'])} {ci(r['kappa_95'])}",
        )
    return finish(
        fig,
        ax,
        path,
        "SAE width m",
        "N_causal (0 drawn at 0.5)",
        f"N_causal at four calibrations of epsilon ({c['architecture']})",
        log_x=True,
        log_y=True,
    )


def thresholds_section(doc: Doc, c: dict) -> None:
    doc.table(
        [
            "percentile",
            "epsilon",
            "N_causal per width",
            "growth",
            "kappa_hat [95%]",
            "kappa_hat <= d",
        ],
        [
            [
                f"{r['percentile']:g}",
                f"{r['epsilon']:.3g}",
                " / ".join(map(str, r["n_causal"])),
                growth(r["n_causal_growth"]),
                f"{num(r['kappa_hat'])} {ci(r['kappa_95'])}",
                num(r["kappa_at_most_d"]),
            ]
            for r in c["rows"]
        ],
    )
    n, growing = c["n_growths"], c["n_growing"]
    text = []
    if n and growing == n:
        text.append("N_causal grows with width at every calibration")
    elif n and not growing:
        text.append("N_causal does not grow with width at any calibration")
    elif n:
        text.append(
            f"N_causal grows at {growing} of {n} calibrations only, so the "
            "wedge depends on where epsilon is set"
        )
    if c["kappa_ratio"] is not None:
        text.append(
            f"kappa_hat moves by a factor {c['kappa_ratio']:.2f} between the "
            "calibrations: epsilon is a free parameter of the SAE estimate, unlike the "
            "direct eranks"
        )
    doc.p(
        ". ".join(text) + "." if text else "No growth ratios (N_causal is 0 at the smallest width)."
    )


def _compute(ctx: Context) -> dict:
    return threshold_robustness(
        ctx.scores,
        ctx.here.evals[ctx.headline],
        ctx.store.d_model,
        ctx.analysis_cfg,
        ctx.seed,
        progress=ctx.progress,
    )


CONTROL = Control(
    "thresholds", "Threshold robustness", _compute, thresholds_section, plot_thresholds
)
