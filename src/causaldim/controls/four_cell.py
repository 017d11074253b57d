"""Control 'four_cell': N_causal with {trained, random orthonormal} encoder x {trained,
random} decoder at the headline epsilon. If AtP counted features because of what the
trained dictionary found, random cells should not reach the trained count."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from ..config import AnalysisConfig
from ..fmt import growth
from ..harvest.store import Store
from ..measures.score import Scores, atp_scores
from ..paper import RANDOM_ENCODER_INFLATION
from ..report.doc import Doc
from ..report.figures import finish, pyplot
from ..sae import SAE
from ..sae.train import match_l0
from . import Context, Control


def _random_directions(rows: int, d: int, gen: torch.Generator, orthonormal: bool):
    """[rows, d] random directions: an orthonormal set (a tight frame when rows > d), or
    independent Gaussian directions."""
    if not orthonormal:
        return torch.randn(rows, d, generator=gen, dtype=torch.float64)
    a = torch.randn(max(rows, d), min(rows, d), generator=gen, dtype=torch.float64)
    q = torch.linalg.qr(a).Q  # orthonormal columns
    return q if rows >= d else q.T


def _with_norms(directions: torch.Tensor, norms: torch.Tensor) -> torch.Tensor:
    unit = directions / directions.norm(dim=1, keepdim=True).clamp_min(1e-30)
    return (unit * norms.double()[:, None]).float()


def randomized(
    sae: SAE,
    encoder: bool,
    decoder: bool,
    gen: torch.Generator,
    l0_tokens: torch.Tensor,
    match: bool = True,
) -> SAE:
    """A copy of sae with a random orthonormal encoder and/or a random decoder, each
    feature keeping its trained vector norms. A random encoder gets b_enc = 0; where L0
    is not fixed by construction it is matched again to the trained SAE's on l0_tokens,
    unless match=False, which keeps the trained thresholds and lets L0 move (the paper's
    reading: the encoder as a sparsity filter)."""
    out = copy.deepcopy(sae)
    d, m = sae.cfg.d_in, sae.cfg.width
    with torch.no_grad():
        if encoder:
            enc_norms = sae.W_enc_t.norm(dim=1)
            out.W_enc_t.copy_(_with_norms(_random_directions(m, d, gen, True), enc_norms))
            out.b_enc.zero_()
            if sae.architecture != "topk" and match:
                target = float((sae.encode(l0_tokens) > 0).sum(-1).float().mean())
                match_l0(out, l0_tokens, target)
        if decoder:
            dec_norms = sae.W_dec.norm(dim=1)
            out.W_dec.copy_(_with_norms(_random_directions(m, d, gen, False), dec_norms))
    return out


CELLS = (("trained", "trained"), ("random", "trained"), ("trained", "random"), ("random", "random"))


def four_cell(
    saes: dict[int, SAE],
    store: Store,
    epsilon: float,
    cfg: AnalysisConfig,
    seed: int = 0,
    l0_tokens: int = 8192,
    trained_scores: dict[int, Scores] | None = None,
    match: bool = True,
) -> dict:
    """N_causal with {trained, random orthonormal} encoder x {trained, random} decoder, at
    the headline epsilon, per width; and the random encoder's inflation factor (the
    paper: 9.27x). If AtP counted features because of what the trained dictionary found,
    random cells should not reach the trained count. The trained SAEs' own scores are
    reused when given (trained_scores)."""
    gen = torch.Generator().manual_seed(seed)
    sample = next(store.batches("train", ("h",), l0_tokens))["h"]
    rows = []
    for width, sae in sorted(saes.items()):
        cells = {}
        for enc, dec in CELLS:
            if (enc, dec) == ("trained", "trained") and trained_scores is not None:
                s = trained_scores[width]
            else:
                cell = randomized(sae, enc == "random", dec == "random", gen, sample, match)
                s = atp_scores(cell, store, cfg.blocks, cfg.read_tokens)
            cells[f"{enc}/{dec}"] = {
                "n_causal": int((s.atp > epsilon).sum()),
                "n_repr": s.n_repr,
                "l0": s.mean_l0,
            }
        base = cells["trained/trained"]["n_causal"]
        rows.append(
            {
                "width": width,
                "cells": cells,
                "random_encoder_inflation": (
                    cells["random/trained"]["n_causal"] / base if base else None
                ),
            }
        )
    inflation = [
        r["random_encoder_inflation"] for r in rows if r["random_encoder_inflation"] is not None
    ]
    return {
        "epsilon": epsilon,
        "cells": [f"{e}/{d}" for e, d in CELLS],
        "rows": rows,
        "random_encoder_inflation_range": [min(inflation), max(inflation)] if inflation else None,
        "paper_random_encoder_inflation": RANDOM_ENCODER_INFLATION,
        # widths where a random decoder counts more causal features than the trained one
        "n_random_decoder_above_trained": sum(
            r["cells"]["trained/random"]["n_causal"] > r["cells"]["trained/trained"]["n_causal"]
            for r in rows
        ),
    }


def plot_four_cell(c: dict, path: Path) -> Path:
    plt = pyplot()
    rows = c["rows"]
    fig, ax = plt.subplots(figsize=(8, 4.4))
    n = len(c["cells"])
    for j, cell in enumerate(c["cells"]):
        xs = [i + (j - (n - 1) / 2) * 0.2 for i in range(len(rows))]
        ax.bar(
            xs,
            [max(r["cells"][cell]["n_causal"], 0.5) for r in rows],
            0.2,
            label=f"encoder/decoder: {cell}",
            color=f"C{j}",
        )
    ax.set_xticks(range(len(rows)), [str(r["width"]) for r in rows])
    return finish(
        fig,
        ax,
        path,
        "SAE width m",
        "N_causal at the headline epsilon (0 drawn at 0.5)",
        f"Trained vs random encoder and decoder ({c['architecture']})",
        log_x=False,
        log_y=True,
    )


def four_cell_section(doc: Doc, c: dict) -> None:
    doc.p(
        f"With L0 held (the {c['architecture']} cells: "
        + ("k features fire in every cell" if c["architecture"] == "topk" else "L0 re-matched")
        + ")."
    )
    _cells_table(doc, c)
    free = c.get("free_l0")
    if not free:
        return
    if "skipped" in free:
        doc.p(f"With L0 free: not measured: {free['skipped']}.")
        return
    sweep = free["sweep"]
    doc.p(
        f"With L0 free: {free['architecture']} SAEs ({sweep['epochs']} epoch(s), widths "
        f"{', '.join(f'{w:,}' for w in sweep['widths'])}) whose thresholds stay as trained, so "
        "a random encoder changes how many features fire (L0 per cell in brackets), at "
        f"their own epsilon ({free['epsilon']:.3g}). This is the paper's setting: the encoder "
        "as a sparsity filter."
    )
    _cells_table(doc, free, with_l0=True)


def _cells_table(doc: Doc, c: dict, with_l0: bool = False) -> None:
    def cell(r: dict, name: str) -> str:
        x = r["cells"][name]
        return f"{x['n_causal']} ({x['l0']:.1f})" if with_l0 else str(x["n_causal"])

    doc.table(
        ["width", *[f"N_causal {cell}" for cell in c["cells"]], "random-encoder inflation"],
        [
            [
                r["width"],
                *[cell(r, name) for name in c["cells"]],
                growth(r["random_encoder_inflation"]),
            ]
            for r in c["rows"]
        ],
    )
    if with_l0:
        return
    infl = c["random_encoder_inflation_range"]
    if infl:
        first = (
            f"At the headline epsilon ({c['epsilon']:.3g}), a random orthonormal encoder with "
            f"the trained decoder gives x{infl[0]:.2f} to x{infl[1]:.2f} the trained "
            f"count (paper: x{c['paper_random_encoder_inflation']})."
        )
    else:
        first = (
            f"At the headline epsilon ({c['epsilon']:.3g}), the trained SAEs count no causal "
            "feature at any width where a random encoder could be compared, so there is no "
            "inflation factor."
        )
    doc.p(
        f"{first} A random decoder counts more causal features than the trained one at "
        f"{c['n_random_decoder_above_trained']} of {len(c['rows'])} widths. Counts that "
        "random dictionaries match or exceed measure how AtP and epsilon treat any "
        "dictionary, not structure the SAE found."
    )


FREE_L0 = "jumprelu"  # the cells whose L0 may move: a per-feature threshold, kept as trained


def free_l0_cells(ctx: Context) -> dict:
    """The four cells on JumpReLU SAEs whose thresholds stay as trained, so that a random
    encoder may change how many features fire (TopK cells hold L0 at k in every cell):
    the run's own JumpReLU sweep where it has one, else the controls' sweep trained under
    OUT/architectures (shared with the architectures control, so trained once)."""
    if FREE_L0 in ctx.here.scores:
        saes, scores = ctx.here.saes_of(FREE_L0), ctx.here.scores[FREE_L0]
        epsilon, sweep = ctx.here.analysis[FREE_L0]["epsilon"], ctx.sweep_cfg
    elif ctx.sweep_cfg.imports:
        return {"skipped": "the run's SAEs are imported and include no JumpReLU sweep"}
    else:
        there = ctx.measure_other(ctx.store, ctx.out / "architectures", [FREE_L0])
        saes, scores = there.saes_of(FREE_L0), there.scores[FREE_L0]
        epsilon, sweep = there.analysis[FREE_L0]["epsilon"], ctx.control_sweep
    cells = four_cell(
        saes, ctx.store, epsilon, ctx.analysis_cfg, ctx.seed, trained_scores=scores, match=False
    )
    return {
        "architecture": FREE_L0,
        "sweep": {"widths": sorted(saes), "epochs": sweep.epochs},
        **cells,
    }


def _compute(ctx: Context) -> dict:
    out = four_cell(
        ctx.saes, ctx.store, ctx.epsilon, ctx.analysis_cfg, ctx.seed, trained_scores=ctx.scores
    )
    return {**out, "free_l0": free_l0_cells(ctx)}


CONTROL = Control(
    "four_cell",
    "Four-cell encoder/decoder ablation",
    _compute,
    four_cell_section,
    plot_four_cell,
    reads_weights=True,
)
