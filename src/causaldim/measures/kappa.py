"""The direct kappa of a layer from its store, in two metrics of the residual stream.

raw (the paper's definition): erank(Sigma), directions per unit of Euclidean change of
  h. Its eigenvalues change under any map of the residual that is not orthogonal, and
  the residual's coordinates are far from equal (Gemma 3's norm gains run 0.19 to 301).
activation-weighted: kappa_act = erank(C^1/2 Sigma C^1/2), C = Cov[h]; its eigenvalues are
  those of C Sigma, which no invertible linear map h -> M h changes (C -> M C M^T,
  Sigma -> M^-T Sigma M^-1). It is E||J delta||^2 for delta distributed as the
  activations' fluctuations: how many directions of the representation's own variation
  move the output, each weighed by what mean-ablating it costs to first order.

kappa_act is estimated as the raw reading is, on the samples C^1/2 u (read from the
store again, so the correction sees their own norms and correlation along sequences).
C is the activations' centred covariance over the same tokens and blocks, outliers
treated alike; every jackknife replicate and the first half re-estimate C from their own
blocks (debias.correct's observed_of), so C's sampling error enters the interval.
"""

from __future__ import annotations

import torch

from ..config import AnalysisConfig
from ..harvest.store import Store
from ..progress import bar
from . import debias
from .sigma import (
    DEFINITIONS,
    BlockSums,
    SigmaEstimate,
    accumulate,
    accumulate_parts,
    available,
    by_parts,
    estimate,
    probes_per_token,
    with_common_mode,
)

WEIGHTED_SEED = 101  # apart from the raw readings' seeds


def weighted_definition(reading: str) -> str:
    inner = DEFINITIONS[reading].removeprefix("erank(")[:-1]
    return f"erank(C^1/2 {inner} C^1/2), C = Cov[h]"


def root(c: torch.Tensor) -> torch.Tensor:
    """The symmetric square root of a PSD matrix, in float64 (negative rounding cut)."""
    values, vectors = torch.linalg.eigh(c.double())
    return (vectors * values.clamp_min(0).sqrt()) @ vectors.T


def weighted_estimate(
    reading: str,
    transformed: BlockSums,
    raw: BlockSums,
    acts: BlockSums,
    cfg: AnalysisConfig,
    seed: int,
    probes: int,
    budget: debias.Budget = debias.FULL,
) -> SigmaEstimate:
    """kappa_act of one reading: its samples summed as C^1/2 u (`transformed`), its plain
    block sums (`raw`) and the activations' centred sums in the same blocks (`acts`), from
    which each resample re-estimates C."""

    def observed_of(w):  # the metric from the same blocks as Sigma
        m = root(acts.matrix(w)).to(acts.xx.device)
        return m @ raw.matrix(w).to(m.device) @ m

    return estimate(
        reading,
        transformed,
        cfg,
        seed + WEIGHTED_SEED,
        probes,
        budget,
        observed_of=observed_of,
        definition=weighted_definition(reading),
    )


def weighted(
    stores: list[Store],
    cfg: AnalysisConfig,
    raw: dict[str, BlockSums],
    seed: int,
    device: str | torch.device = "cpu",
    budget: debias.Budget = debias.FULL,
    include_outliers: bool | None = None,
) -> dict[str, SigmaEstimate]:
    """kappa_act of each output reading in `raw` (their plain block sums, as
    sigma.accumulate gave them from these stores): {reading: SigmaEstimate}."""
    order = available(stores[0])
    probes = probes_per_token(stores[0].manifest["key"])
    readings = [r for r in raw if r != "activations"]
    found, transformed = {}, {}
    for parts, group in by_parts(stores, readings).items():
        same = "activations" in raw and by_parts(stores, ["activations"]).get(parts)
        acts = (
            raw["activations"]
            if same
            else accumulate_parts(parts, cfg, ("activations",), device, include_outliers)[
                "activations"
            ]
        )
        metric = root(acts.matrix()).to(acts.xx.device)
        sums = accumulate_parts(parts, cfg, group, device, include_outliers, metric)
        transformed.update(sums)
        for r in group:
            found[r] = weighted_estimate(
                r, sums[r], raw[r], acts, cfg, seed + order.index(r), probes.get(r, 1), budget
            )
    return with_common_mode(found, transformed)  # the shift's share in this metric


def measure(
    store: Store | list[Store],
    cfg: AnalysisConfig | None = None,
    seed: int = 0,
    device: str | torch.device = "cpu",
    progress: bool = False,
    readings: tuple[str, ...] | None = None,
    activation_weighted: bool = True,
) -> dict:
    """The readings the store holds (default: all): {reading: SigmaEstimate}, each output
    reading with its activation-weighted twin in `activation_weighted`; the sums and their
    eigendecompositions on device. A list of stores is read as one eval split."""
    cfg = cfg or AnalysisConfig()
    stores = store if isinstance(store, list) else [store]
    sums = accumulate(stores, cfg, readings, device=device)
    probes = probes_per_token(stores[0].manifest["key"])
    order = available(stores[0])  # each reading's seed as when all are measured
    found = {
        reading: estimate(reading, s, cfg, seed + order.index(reading), probes.get(reading, 1))
        for reading, s in bar(sums.items(), desc="direct Sigma", unit="reading", enabled=progress)
    }
    found = with_common_mode(found, sums)
    if activation_weighted and "activations" in available(stores[0]):
        twins = weighted(stores, cfg, sums, seed, device)
        found = {
            r: e._replace(activation_weighted=twins[r].to_dict()) if r in twins else e
            for r, e in found.items()
        }
    return found


def other_outlier_choice(
    store: Store | list[Store],
    cfg: AnalysisConfig,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> dict:
    """Each uncentred reading's corrected erank from the same eval tokens with the other
    choice of outliers (position 0 and large-norm tokens kept if the run leaves them out,
    or left out if it keeps them), within debias.LIGHT: how much the choice moves kappa."""
    stores = store if isinstance(store, list) else [store]
    include = not cfg.include_outliers
    order = available(stores[0])
    readings = tuple(r for r in order if r != "activations")
    sums = accumulate(stores, cfg, readings, device, include_outliers=include)
    probes = probes_per_token(stores[0].manifest["key"])
    found = {}
    for reading, s in sums.items():
        e = estimate(
            reading, s, cfg, seed + order.index(reading), probes.get(reading, 1), debias.LIGHT
        )
        found[reading] = {
            "outliers": "kept" if include else "left out",
            "n_tokens": e.n_tokens,
            "erank_corrected": e.erank_corrected,
            "erank_corrected_95": e.erank_corrected_95,
            "erank": e.erank,
            "n_independent": e.n_independent,
            "converged": e.converged,
        }
    return found
