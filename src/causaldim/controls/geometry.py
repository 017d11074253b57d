"""Control 'geometry': do causal features (AtP > epsilon) differ from firing non-causal
ones in decoder row norm, or in cosine similarity to their nearest decoder neighbour?"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..fmt import num
from ..measures.score import Scores
from ..measures.stats import auc, interval_95
from ..report.doc import Doc
from ..report.figures import finish, pyplot
from ..sae import SAE
from . import Control


def nearest_neighbour_cosine(W_dec: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
    """Per decoder row, the largest cosine similarity with any other row."""
    unit = W_dec / W_dec.norm(dim=1, keepdim=True).clamp_min(1e-12)
    out = torch.empty(len(unit))
    for start in range(0, len(unit), chunk):
        sims = unit[start : start + chunk] @ unit.T
        sims[torch.arange(len(sims)), torch.arange(start, start + len(sims))] = -2.0
        out[start : start + chunk] = sims.max(1).values
    return out


def _compare(causal: np.ndarray, other: np.ndarray, gen: np.random.Generator, resamples: int):
    if len(causal) == 0 or len(other) == 0:
        return {"n_causal": len(causal), "n_other": len(other), "auc": None, "auc_95": []}
    boot = [
        auc(gen.choice(causal, len(causal)), gen.choice(other, len(other)))
        for _ in range(resamples)
    ]
    return {
        "n_causal": len(causal),
        "n_other": len(other),
        "median_causal": float(np.median(causal)),
        "median_other": float(np.median(other)),
        "auc": auc(causal, other),
        "auc_95": interval_95(boot),
        "causal_values": [float(v) for v in causal],
        "other_quantiles": [float(q) for q in np.quantile(other, np.linspace(0, 1, 21))],
    }


MATCH_LOG_TOLERANCE = 0.05  # firing counts within 5% count as matched


def frequency_matched(
    fired: np.ndarray, causal: np.ndarray, other: np.ndarray, gen: np.random.Generator
) -> np.ndarray:
    """For each causal feature (indices), a non-causal firing feature (mask) drawn among
    those nearest it in log firing count (within MATCH_LOG_TOLERANCE, or the nearest),
    with replacement: AtP selects features that fire often, and a feature that fires
    often has near neighbours, so an unmatched difference may be firing frequency and
    not geometry."""
    pool = np.flatnonzero(other)
    if len(pool) == 0 or len(causal) == 0:
        return pool[:0]
    logs = np.log(fired[pool].astype(float))  # a non-causal firing feature fired at least once
    picks = []
    for wanted in np.log(np.maximum(fired[causal].astype(float), 1.0)):
        distance = np.abs(logs - wanted)
        near = np.flatnonzero(distance <= max(distance.min(), MATCH_LOG_TOLERANCE))
        picks.append(pool[gen.choice(near)])
    return np.array(picks)


def geometric_privilege(
    saes: dict[int, SAE], scores: dict[int, Scores], epsilon: float, seed: int, resamples=200
) -> dict:
    """Do causal features (AtP > epsilon) differ from firing non-causal ones in decoder
    row norm, or in cosine similarity to their nearest decoder neighbour? Per width: the
    medians and the AUC (0.5: no difference) with a bootstrap interval over features."""
    gen = np.random.default_rng(seed)
    rows = []
    for width, sae in sorted(saes.items()):
        s = scores[width]
        causal = (s.atp > epsilon).numpy()
        other = ((s.fired > 0) & (s.atp <= epsilon)).numpy()
        norms = sae.W_dec.detach().double().norm(dim=1).numpy()
        norms = np.round(norms / norms.mean(), 5) * norms.mean()  # float noise is no signal
        nn_cos = nearest_neighbour_cosine(sae.W_dec.detach()).numpy()
        fired = s.fired.numpy()
        matched = frequency_matched(fired, np.flatnonzero(causal), other, gen)
        rows.append(
            {
                "width": width,
                "decoder_norm": _compare(norms[causal], norms[other], gen, resamples),
                "nn_cosine": _compare(nn_cos[causal], nn_cos[other], gen, resamples),
                # against non-causal features that fire as often (the rule decides on it)
                "nn_cosine_matched": _compare(nn_cos[causal], nn_cos[matched], gen, resamples),
                "decoder_norm_matched": _compare(norms[causal], norms[matched], gen, resamples),
                "median_firings": {
                    "causal": float(np.median(fired[causal])) if causal.any() else None,
                    "other": float(np.median(fired[other])) if other.any() else None,
                },
                "decoder_norm_spread": float(norms.max() / max(norms.min(), 1e-30) - 1),
            }
        )
    return {
        "epsilon": epsilon,
        "rows": rows,
        # per measure, the widths whose AUC interval excludes 0.5 (no difference)
        "widths_differing": {
            key: [r["width"] for r in rows if _excludes_half(r[key])]
            for key in ("decoder_norm", "nn_cosine")
        },
        "max_decoder_norm_spread": max(r["decoder_norm_spread"] for r in rows),
        "min_n_causal": min(r["decoder_norm"]["n_causal"] for r in rows),
    }


def plot_geometry(c: dict, path: Path) -> Path:
    """Per width: the non-causal features' nearest-neighbour cosine as a band (5-95th
    percentiles and median) and each causal feature's value as a dot."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    for i, r in enumerate(c["rows"]):
        g = r["nn_cosine"]
        if g.get("other_quantiles"):
            q = g["other_quantiles"]
            ax.plot(
                [i, i],
                [q[1], q[19]],
                color="grey",
                lw=6,
                alpha=0.4,
                label="non-causal: 5-95th pct" if i == 0 else None,
            )
            ax.plot(
                i, q[10], "_", color="black", ms=14, label="non-causal median" if i == 0 else None
            )
        if g.get("causal_values"):
            ax.plot(
                [i + 0.15] * len(g["causal_values"]),
                g["causal_values"],
                "o",
                color="C3",
                ms=4,
                label="causal features" if i == 0 else None,
            )
    ax.set_xticks(range(len(c["rows"])), [str(r["width"]) for r in c["rows"]])
    return finish(
        fig,
        ax,
        path,
        "SAE width m",
        "cosine to nearest decoder neighbour",
        f"Geometry of causal vs non-causal features ({c['architecture']})",
        log_x=False,
        log_y=False,
    )


def geometry_section(doc: Doc, c: dict) -> None:
    rows = []
    for r in c["rows"]:
        n, g = r["decoder_norm"], r["nn_cosine"]
        rows.append(
            [
                r["width"],
                n["n_causal"],
                n["n_other"],
                num(n.get("median_causal"), 3),
                num(n.get("median_other"), 3),
                _auc(n),
                num(g.get("median_causal"), 3),
                num(g.get("median_other"), 3),
                _auc(g),
                _auc(r.get("nn_cosine_matched") or {}),
            ]
        )
    doc.table(
        [
            "width",
            "causal",
            "non-causal",
            "norm, causal",
            "norm, other",
            "AUC norm [95%]",
            "NN cos, causal",
            "NN cos, other",
            "AUC NN cos [95%]",
            "AUC NN cos, firing-matched [95%]",
        ],
        rows,
    )
    text = []
    for label, key in (("decoder norm", "decoder_norm"), ("nearest-neighbour cosine", "nn_cosine")):
        clear = c["widths_differing"][key]
        text.append(
            f"{label}: the AUC interval excludes 0.5 at widths {', '.join(map(str, clear))}"
            if clear
            else f"{label}: no width shows a difference whose interval excludes 0.5"
        )
    if c["max_decoder_norm_spread"] < 1e-3:
        text.append(
            "the decoder rows all have one norm (training keeps them on a sphere), so the "
            "norm comparison cannot discriminate for these SAEs"
        )
    few = c["min_n_causal"]
    if few == 0:
        text.append("some widths have no causal feature: nothing to compare there")
    elif few < 10:
        text.append(f"with as few as {few} causal feature(s) at a width, intervals are wide")
    doc.p(
        "AUC = P(a causal feature's value exceeds a non-causal one's); 0.5 is no "
        "difference. Firing-matched: each causal feature against the non-causal feature "
        "nearest it in firing count (the claims decide on it: AtP selects features that "
        "fire often, which have nearer neighbours). " + "; ".join(text) + "."
    )


def _auc(g: dict) -> str:
    if g.get("auc") is None:
        return "n/a"
    lo, hi = g["auc_95"]
    return f"{g['auc']:.2f} [{lo:.2f}, {hi:.2f}]"


def _excludes_half(g: dict) -> bool:
    return g.get("auc") is not None and not g["auc_95"][0] <= 0.5 <= g["auc_95"][1]


CONTROL = Control(
    "geometry",
    "Geometric privilege",
    lambda ctx: geometric_privilege(ctx.saes, ctx.scores, ctx.epsilon, ctx.seed),
    geometry_section,
    plot_geometry,
    reads_weights=True,
)
