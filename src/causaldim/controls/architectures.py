"""Control 'architectures': the sweep with TopK, JumpReLU and ReLU SAEs at matched L0,
N_causal growth and kappa_hat side by side. A property of the layer should not depend on
the dictionary that reads it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..config import AnalysisConfig
from ..fmt import ci, growth, num
from ..measures.stats import spread
from ..report.doc import Doc
from ..report.figures import finish, pyplot
from ..sae import ARCHITECTURES
from ..sweep_config import SweepConfig
from . import Context, Control


def architecture_invariance(sweep: dict[str, dict]) -> dict:
    """N_causal growth and kappa_hat of each architecture's sweep, side by side."""
    rows = []
    for arch, a in sweep.items():
        rows.append(
            {
                "architecture": arch,
                "epsilon": a["epsilon"],
                "n_causal": [r["n_causal"] for r in a["per_width"]],
                "n_repr": [r["n_repr"] for r in a["per_width"]],
                "l0": [r.get("l0") for r in a["per_width"]],
                "n_causal_growth": a["wedge"]["n_causal_growth"],
                "n_repr_growth": a["wedge"]["n_repr_growth"],
                "kappa_hat": a["kappa"]["free"]["kappa"],
                "kappa_95": a["kappa"]["free"]["interval_95"],
                "kappa_at_most_d": a["kappa"]["at_most_d"]["kappa"],
                "n_causal_grows": (a["wedge"]["n_causal_growth"] or 0) > 1,
            }
        )
    return {
        "widths": [r["width"] for r in next(iter(sweep.values()))["per_width"]],
        "rows": rows,
        "kappa_spread": spread([r["kappa_hat"] for r in rows]),
    }


def plot_architectures(c: dict, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    for i, r in enumerate(c["rows"]):
        ax.plot(
            c["widths"],
            [max(v, 0.5) for v in r["n_causal"]],
            "o-",
            color=f"C{i}",
            label=f"{r['architecture']} N_causal",
        )
        ax.plot(
            c["widths"],
            r["n_repr"],
            "s:",
            color=f"C{i}",
            alpha=0.6,
            label=f"{r['architecture']} N_repr",
        )
    return finish(
        fig,
        ax,
        path,
        "SAE width m",
        "features (0 drawn at 0.5)",
        "The wedge per architecture, at matched L0",
        log_x=True,
        log_y=True,
    )


def architectures_section(doc: Doc, c: dict) -> None:
    doc.table(
        [
            "architecture",
            "epsilon",
            "N_causal per width",
            "N_causal growth",
            "N_repr growth",
            "kappa_hat [95%]",
        ],
        [
            [
                r["architecture"],
                f"{r['epsilon']:.3g}",
                " / ".join(map(str, r["n_causal"])),
                growth(r["n_causal_growth"]),
                growth(r["n_repr_growth"]),
                f"{num(r['kappa_hat'])} {ci(r['kappa_95'])}",
            ]
            for r in c["rows"]
        ],
    )
    spread = c.get("kappa_spread")
    grows = {r["architecture"]: r["n_causal_grows"] for r in c["rows"]}
    text = (
        f"N_causal grows with width for {', '.join(a for a, g in grows.items() if g) or 'none'}"
        f" of {len(grows)} architectures"
    )
    if spread is not None:
        text += (
            f"; kappa_hat differs by a factor {spread:.2f} across them (each calibrated on its "
            "own smallest width). A property of the layer should not depend on the dictionary "
            "that reads it; a large factor says the estimate does"
        )
    doc.p(text + ".")


def all_architectures(sweep: SweepConfig) -> list[str]:
    """Every architecture, the requested ones first."""
    return list(dict.fromkeys([*sweep.architectures, *ARCHITECTURES]))


def every_architecture(sweep: SweepConfig, analysis: AnalysisConfig) -> SweepConfig:
    """The sweep this control needs: every architecture; unless the controls have a
    lighter sweep of their own, where the three are trained apart (_compute)."""
    if analysis.lighter_controls:
        return sweep
    return dataclasses.replace(sweep, architectures=all_architectures(sweep))


def _compute(ctx: Context) -> dict:
    if not ctx.analysis_cfg.lighter_controls:
        return architecture_invariance(ctx.here.analysis)
    there = ctx.measure_other(
        ctx.store, ctx.out / "architectures", all_architectures(ctx.one_architecture)
    )
    return architecture_invariance(there.analysis)


CONTROL = Control(
    "architectures",
    "Architecture invariance",
    _compute,
    architectures_section,
    plot_architectures,
    per_architecture=False,
    widen_sweep=every_architecture,
    uses_control_sweep=True,
)
