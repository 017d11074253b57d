"""The paper's controls (METHOD.md section 4), computed from the same store and sweep as
the headline numbers: what kappa_hat measures, and what it does not.

Each control is a function returning plain data for results.json["controls"]; the
report renders its table, figure and interpretation from that data alone.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import torch

from .ablation import atp_vs_ablation
from .analysis import analyze
from .config import AnalysisConfig
from .faults import fault_point
from .sae import SAE
from .sae.train import match_l0
from .score import Scores, atp_scores
from .store import Store

PERCENTILES = (95.0, 98.0, 99.0, 99.5)
L0_TOLERANCE = 0.10  # relative distance from the target L0 that is flagged


def threshold_robustness(
    scores: dict[int, Scores],
    evals: dict[int, dict],
    d_model: int,
    cfg: AnalysisConfig,
    seed: int = 0,
    percentiles: tuple[float, ...] = PERCENTILES,
) -> dict:
    """The counts and kappa_hat with epsilon at each percentile of the reference width's
    AtP: a finding that holds at one percentile only is made by the threshold."""
    rows = []
    for p in percentiles:
        a = analyze(scores, evals, d_model, replace(cfg, percentile=p), seed)
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
    return {"widths": sorted(scores), "rows": rows}


def matched_l0(evals: dict[str, dict[int, dict]], target: float) -> dict:
    """Eval-split L0 per architecture and width against the target; rows further than
    L0_TOLERANCE from it are flagged (sparsity drift could then fake a wedge)."""
    rows = []
    for arch, by_width in evals.items():
        for width, ev in sorted(by_width.items()):
            rel = ev["l0"] / target - 1
            rows.append(
                {
                    "architecture": arch,
                    "width": width,
                    "l0": ev["l0"],
                    "relative_error": rel,
                    "flagged": abs(rel) > L0_TOLERANCE,
                }
            )
    return {
        "target": target,
        "tolerance": L0_TOLERANCE,
        "rows": rows,
        "n_flagged": sum(r["flagged"] for r in rows),
    }


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
                "n_causal_growth": a["wedge"]["n_causal_growth"],
                "n_repr_growth": a["wedge"]["n_repr_growth"],
                "kappa_hat": a["kappa"]["free"]["kappa"],
                "kappa_95": a["kappa"]["free"]["interval_95"],
                "kappa_at_most_d": a["kappa"]["at_most_d"]["kappa"],
            }
        )
    kappas = [r["kappa_hat"] for r in rows if r["kappa_hat"] > 0]
    return {
        "widths": [r["width"] for r in next(iter(sweep.values()))["per_width"]],
        "rows": rows,
        "kappa_spread": max(kappas) / min(kappas) if len(kappas) > 1 else None,
    }


# ----------------------------------------------------------------- four-cell ablation


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
    sae: SAE, encoder: bool, decoder: bool, gen: torch.Generator, l0_tokens: torch.Tensor
) -> SAE:
    """A copy of sae with a random orthonormal encoder and/or a random decoder, each
    feature keeping its trained vector norms. A random encoder gets b_enc = 0; where L0
    is not fixed by construction it is matched again to the trained SAE's on l0_tokens."""
    out = copy.deepcopy(sae)
    d, m = sae.cfg.d_in, sae.cfg.width
    with torch.no_grad():
        if encoder:
            enc_norms = sae.W_enc_t.norm(dim=1)
            out.W_enc_t.copy_(_with_norms(_random_directions(m, d, gen, True), enc_norms))
            out.b_enc.zero_()
            if sae.architecture != "topk":
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
                cell = randomized(sae, enc == "random", dec == "random", gen, sample)
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
    return {"epsilon": epsilon, "cells": [f"{e}/{d}" for e, d in CELLS], "rows": rows}


# ----------------------------------------------------------------- geometric privilege


def nearest_neighbour_cosine(W_dec: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
    """Per decoder row, the largest cosine similarity with any other row."""
    unit = W_dec / W_dec.norm(dim=1, keepdim=True).clamp_min(1e-12)
    out = torch.empty(len(unit))
    for start in range(0, len(unit), chunk):
        sims = unit[start : start + chunk] @ unit.T
        sims[torch.arange(len(sims)), torch.arange(start, start + len(sims))] = -2.0
        out[start : start + chunk] = sims.max(1).values
    return out


def auc(a: np.ndarray, b: np.ndarray) -> float:
    """P(a random draw of a exceeds one of b), ties counting half: 0.5 is no difference."""
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(a, b).statistic) / (len(a) * len(b))


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
        "auc_95": [float(q) for q in np.quantile(boot, [0.025, 0.975])],
        "causal_values": [float(v) for v in causal],
        "other_quantiles": [float(q) for q in np.quantile(other, np.linspace(0, 1, 21))],
    }


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
        rows.append(
            {
                "width": width,
                "decoder_norm": _compare(norms[causal], norms[other], gen, resamples),
                "nn_cosine": _compare(nn_cos[causal], nn_cos[other], gen, resamples),
                "decoder_norm_spread": float(norms.max() / max(norms.min(), 1e-30) - 1),
            }
        )
    return {"epsilon": epsilon, "rows": rows}


def run_controls(
    names: list[str],
    store: Store,
    saes: dict[str, dict[int, SAE]],
    scores: dict[str, dict[int, Scores]],
    evals: dict[str, dict[int, dict]],
    sweep: dict[str, dict],
    headline: str,
    target_l0: float,
    cfg: AnalysisConfig,
    seed: int,
    load_lm,
    more: dict[str, Callable[[], dict]],
    progress=None,
) -> dict:
    """The selected controls, each on the headline architecture unless it compares
    architectures; load_lm() is called only if a control needs the model. `more` holds
    the controls that measure beyond this store (other layers, models, a toy model)."""
    a = sweep[headline]
    eps = a["epsilon"]
    jobs = {
        "thresholds": lambda: threshold_robustness(
            scores[headline], evals[headline], store.d_model, cfg, seed
        ),
        "architectures": lambda: architecture_invariance(sweep),
        "l0": lambda: matched_l0(evals, target_l0),
        "four_cell": lambda: four_cell(
            saes[headline], store, eps, cfg, seed, trained_scores=scores[headline]
        ),
        "geometry": lambda: geometric_privilege(saes[headline], scores[headline], eps, seed),
        "ablation": lambda: atp_vs_ablation(
            load_lm(),
            store,
            saes[headline],
            scores[headline],
            eps,
            a["percentile"],
            cfg.ablation_features,
            cfg.ablation_sequences,
            seed=seed,
        ),
        **more,
    }
    out = {}
    for name in names:
        if progress:
            progress(name)
        fault_point(f"control.{name}")
        result = jobs[name]()
        out[name] = (
            result if name in ("architectures", "l0") else {"architecture": headline, **result}
        )
    return out
