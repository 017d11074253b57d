"""Why N_causal does what it does in a sweep: the numbers that diagnose the paper's
estimator, from the scores, the SAEs' training stats and their decoders' digests.

- A(m) = sum_i AtP_i, the total attribution. Markov's inequality bounds the count:
  N_causal(m) = #{i: AtP_i > epsilon} <= A(m) / epsilon, whatever the width. Under the
  "all" normalisation A(m) is about flat in width (the features share one residual's
  attribution), so the ceiling is too.
- The regime: the reference and widest widths over d (the paper: 7.1 d and 455 d), and
  the median feature's firings in training (tokens x epochs) and in eval.
- The firing rate of the top 2% of features by AtP: under "all", AtP rewards firing
  often, so the features over a 98th-percentile bar are the frequent ones.
- How the reference's top features split: at each wider width, each of them gets the
  wider features whose nearest reference decoder direction it is (cosine >= CHILD_COSINE)
  as children; the best cosine says whether the direction survives, the largest child's
  share of the children's firings says whether its firings are shared out.
"""

from __future__ import annotations

import torch

from .digest import DecoderDigest
from .score import Scores

TOP_SHARE = 0.02  # "the top 2% of features", the share a 98th-percentile bar leaves
CHILD_COSINE = 0.5  # a wider feature this close to its nearest reference feature is its child
L0_TOLERANCE = 0.10  # relative distance between L0s that is flagged (and control 'l0')


def _median(x: torch.Tensor) -> float | None:
    return float(x.double().median()) if len(x) else None


def per_width(scores: Scores, epsilon: float, train_firings: dict | None) -> dict:
    """The diagnostics of one width."""
    atp, fired = scores.atp, scores.fired
    total = float(atp.sum())
    top = atp.argsort(descending=True)[: max(1, round(TOP_SHARE * len(atp)))]
    return {
        "atp_total": total,
        "markov_ceiling": total / epsilon if epsilon > 0 else None,
        "median_firings_eval": _median(fired),
        "median_firings_train": (train_firings or {}).get("median"),
        "top_firing_rate": _median(fired[top] / max(scores.n_tokens, 1)),
    }


def splits(
    reference: Scores, epsilon: float, wider: dict[int, tuple[Scores, DecoderDigest]]
) -> list[dict]:
    """For the reference's causal features (AtP > epsilon), at each wider width (its scores
    and its decoder's digest against the reference): medians over them of the best
    decoder cosine, the number of children, the largest child's share of the children's
    eval firings, and the children's firings over the parent's own."""
    parents = (reference.atp > epsilon).nonzero().flatten()
    parent_fired = reference.fired[parents].double()
    out = []
    for width, (scores, d) in sorted(wider.items()):
        fired = scores.fired.double()
        n_children, top_share, kept = [], [], []
        for p, own in zip(parents.tolist(), parent_fired.tolist(), strict=True):
            children = (d.nearest == p) & (d.nearest_cos >= CHILD_COSINE)
            f = fired[children]
            n_children.append(int(children.sum()))
            if f.sum() > 0:
                top_share.append(float(f.max() / f.sum()))
            if own > 0:
                kept.append(float(f.sum()) / own)
        out.append(
            {
                "width": width,
                "parents": len(parents),
                "best_cosine": _median(d.best[parents]) if len(parents) else None,
                "children": _median(torch.tensor(n_children, dtype=torch.float64, device="cpu")),
                "top_child_share": _median(
                    torch.tensor(top_share, dtype=torch.float64, device="cpu")
                ),
                "children_firings_over_parent": _median(
                    torch.tensor(kept, dtype=torch.float64, device="cpu")
                ),
            }
        )
    return out


def imported_l0_spread(evals: dict[str, dict[int, dict]]) -> dict:
    """The spread of imported SAEs' eval L0s: max / min, flagged above 1 + L0_TOLERANCE.
    Imported SAEs come at their makers' L0s (Gemma Scope's differ from width to width), so
    the counts across widths may compare sparsities, as control 'l0' tests for
    trained ones; this runs whether or not that control was asked for."""
    rows = [
        (ev["l0"], f"{arch}-w{width}")
        for arch, by_width in evals.items()
        for width, ev in sorted(by_width.items())
    ]
    (low, low_name), (high, high_name) = min(rows), max(rows)
    ratio = high / low if low > 0 else None
    flagged = ratio is None or ratio > 1 + L0_TOLERANCE
    return {
        "min": low,
        "max": high,
        "ratio": ratio,
        "tolerance": L0_TOLERANCE,
        "flagged": flagged,
        "warning": (
            f"the imported SAEs' eval L0s differ by more than {100 * L0_TOLERANCE:.0f}%: "
            f"{low:.1f} ({low_name}) to {high:.1f} ({high_name})"
            + (f", x{ratio:.2f}" if ratio else "")
            + "; the counts across widths compare different sparsities, so the wedge may "
            "follow L0 as much as width: prefer SAEs of matched L0 (Gemma Scope: the "
            "average_l0_N closest across widths)"
        )
        if flagged
        else None,
    }
