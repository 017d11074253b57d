"""An SAE-side estimate of causal dimensionality that feature splitting leaves alone.

N_causal counts features, and a wider SAE splits one direction into several features
that share its firings (and, under the "all" normalisation, its attribution): the count
moves with the split, not with the layer. This estimate does not count features. With
the SAE spliced in, the loss gradient reaches the residual through the active features
only: on each token

  v = sum_i f_i (g . d_i) d_i = D^T diag(f) D g     (d_i the decoder rows)

is g seen through the dictionary, each active direction weighted by its activation and
read by g (the same products f_i (g . d_i) AtP sums). Then

  kappa_SAE(m) = erank(E[v v^T]),

the SAE route's counterpart of erank(Sigma_loss) = erank(E[g g^T]):
- Splitting a feature into copies along one direction whose activations add up to the
  parent's (whether they fire together or take turns) leaves sum_i f_i d_i d_i^T, hence
  v, unchanged on every token (tests hold it).
- It is a d x d covariance: erank <= d, whatever the width.
- As the dictionary refines, E[v v^T] settles, and so does its erank (the report shows
  the change from the second widest width to the widest).
- Directions that g does not read contribute only through their small leaks into the
  ones it does, squared: on the planted toy of the `synthetic` control it lands near
  the planted k, where N_causal moves with the width.
Considered and set aside: the erank of the attribution-weighted decoder covariance
sum_i AtP_i d_i d_i^T (split-invariant too, but it weighs each feature's whole
direction, so the many features that barely leak into the read subspace spread it over
nearly all of d: 29 of 32 on the toy with k = 4); merging features by decoder cosine (a
threshold to choose, and no bound by d).
It is a plug-in erank: biased low at few samples per dimension, like the direct
readings' plug-ins, and not corrected as the direct kappa is, so the report does not set it
beside the direct kappa as its equal. Its interval resamples groups of eval-sequence
blocks (score.VV_GROUPS), the SAEs held fixed; resampling duplicates blocks, which lowers
a plug-in erank, so where the percentile interval does not hold the point it is not
printed (None), rather than widened.
"""

from __future__ import annotations

import math

import torch

from ..progress import bar
from ..threads import parallel_map
from .score import Scores
from .sigma import spectrum
from .stats import interval_95

RESAMPLES = 50  # per width: each costs one d x d eigendecomposition


def seen_gradient(f: torch.Tensor, g: torch.Tensor, w_dec: torch.Tensor) -> torch.Tensor:
    """v = sum_i f_i (g . d_i) d_i per token: [tokens, width] codes, [tokens, d] gradients,
    [width, d] decoder rows (what score.atp_scores accumulates as v v^T)."""
    return (f * (g @ w_dec.T)) @ w_dec


def erank_of(vv: torch.Tensor) -> float:
    return spectrum(torch.linalg.eigvalsh(vv.double())).erank


def warnings(found: dict | None) -> list[str]:
    """Where the resampled interval does not hold its point: a bias signal, said."""
    missed = [r["width"] for r in (found or {}).get("per_width", []) if r["erank_95"] is None]
    if not found or not found["resamples"] or not missed:
        return []
    return [
        "kappa_SAE's resampled interval does not hold its point at width(s) "
        f"{', '.join(f'{m:,}' for m in missed)} (resampling duplicates blocks, which lowers "
        "a plug-in erank: a bias signal); it is not printed there"
    ]


def estimate(
    scores: dict[int, Scores], resamples: int, seed: int = 0, progress: bool = False
) -> dict | None:
    """Per width: kappa_SAE and its 95% interval over resampled groups of eval blocks; and
    its relative change from the second widest width to the widest. None where the
    scores hold no v v^T sums (scored before they existed)."""
    widths = sorted(scores)
    if any(scores[m].vv_sums.numel() == 0 for m in widths):
        return None
    groups = len(scores[widths[0]].vv_sums)
    gen = torch.Generator().manual_seed(seed)
    draws = [
        torch.bincount(torch.randint(0, groups, (groups,), generator=gen), minlength=groups)
        for _ in range(resamples if groups > 1 else 0)
    ]
    rows = []
    for m in bar(widths, desc="kappa_SAE", unit="width", enabled=progress):
        vv = scores[m].vv_sums.double()
        point = erank_of(vv.sum(0))
        values = parallel_map(
            lambda w, vv=vv: erank_of(torch.einsum("g,gij->ij", w.double(), vv)), draws
        )
        iv = interval_95(values)
        held = bool(iv) and iv[0] <= point <= iv[1]
        rows.append({"width": m, "erank": point, "erank_95": iv if held else None})
    change = None
    if len(rows) > 1 and rows[-2]["erank"] > 0:
        change = rows[-1]["erank"] / rows[-2]["erank"] - 1
    return {
        "per_width": rows,
        "widest": rows[-1]["erank"],
        "widest_95": rows[-1]["erank_95"],
        "change_at_widest": change if change is None or math.isfinite(change) else None,
        "groups": groups,
        "resamples": len(draws),
    }
