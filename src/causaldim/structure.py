"""The structure experiments (METHOD.md section 4): how the measurement changes with
depth (several layers of one model, harvested in one pass) and with scale (two models of
one family at matched relative depth, compared by the shape of their AtP distributions,
not only by the calibrated counts)."""

from __future__ import annotations

import numpy as np
from scipy.stats import ks_2samp

from .score import Scores

DIRECT = ("loss", "logits", "fisher")


def default_depth_layers(n_layers: int, headline: int) -> list[int]:
    """Five layers from near the bottom to near the top, with the headline layer: the
    first and last blocks are left out (embedding- and unembedding-dominated)."""
    picks = {1, n_layers // 4, n_layers // 2, (3 * n_layers) // 4, n_layers - 2, headline}
    return sorted(i for i in picks if 0 <= i < n_layers)


def matched_layer(layer: int, n_layers: int, other_n_layers: int) -> int:
    """The layer of a model with other_n_layers blocks at the same relative depth."""
    return min(other_n_layers - 1, max(0, round((layer + 1) / n_layers * other_n_layers) - 1))


def depth_summary(per_layer: dict[int, tuple[dict, dict]]) -> dict:
    """per_layer: {layer: (sigma estimates as in results.json, the layer's analysis)}.
    Per layer: epsilon, N_causal and its growth, kappa_hat and the direct eranks; and the
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
                "erank": {r: sigma[r]["erank"] for r in DIRECT if r in sigma},
                "erank_95": {
                    r: (sigma[r]["bootstrap"] or {}).get("erank_95") for r in DIRECT if r in sigma
                },
            }
        )
    first, last = rows[0]["epsilon"], rows[-1]["epsilon"]
    return {
        "layers": [r["layer"] for r in rows],
        "widths": [r["width"] for r in next(iter(per_layer.values()))[1]["per_width"]],
        "rows": rows,
        "epsilon_first_over_last": first / last if last > 0 else None,
    }


# ------------------------------------------------------------------------------- scale


def normalised_log_atp(scores: Scores, epsilon: float) -> np.ndarray:
    """log10(AtP / epsilon) of the features that fired: a pure rescaling of every score
    moves epsilon with it and leaves this unchanged."""
    atp = scores.atp[scores.fired > 0].numpy()
    return np.log10(np.maximum(atp, 1e-300) / epsilon)


def ks_shape(a: np.ndarray, b: np.ndarray, permutations: int = 1000, seed: int = 0) -> dict:
    """Two-sample KS statistic between a and b, with a permutation p-value (the share of
    random relabellings of the pooled values whose statistic reaches the observed one)."""
    observed = float(ks_2samp(a, b).statistic)
    gen = np.random.default_rng(seed)
    pooled, hits = np.concatenate([a, b]), 0
    for _ in range(permutations):
        gen.shuffle(pooled)
        hits += ks_2samp(pooled[: len(a)], pooled[len(a) :]).statistic >= observed
    return {
        "ks": observed,
        "p_value": (hits + 1) / (permutations + 1),
        "permutations": permutations,
        "n": [len(a), len(b)],
    }


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
        rows.append(
            {
                "widths": [wa, wb],
                **ks_shape(xa, xb, permutations, seed + wa),
                "n_causal": [ra["n_causal"], rb["n_causal"]],
                "quantiles": [
                    [float(v) for v in np.quantile(xa, qs)],
                    [float(v) for v in np.quantile(xb, qs)],
                ],
            }
        )
    return {
        "models": list(names),
        "epsilon": [an_a["epsilon"], an_b["epsilon"]],
        "kappa_hat": [an_a["kappa"]["free"]["kappa"], an_b["kappa"]["free"]["kappa"]],
        "rows": rows,
    }
