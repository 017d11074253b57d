"""The causal subspace as an artifact: the eigenvectors of Sigma at layer L, saved per
reading, and how the SAE route relates to them.

OUT/subspace/L{layer}-{reading}.safetensors holds `eigenvectors` [d, d] (columns, in the
order of descending eigenvalues), `eigenvalues` (plug-in) and, for the direct readings,
`eigenvalues_corrected` (the deconvolved spectrum, whose order is the same), with the
number of directions holding 50/90/99% of the trace in its metadata. Sampling noise
moves the eigenvalues far more than the leading directions, so the plug-in eigenvectors
are the subspace's basis.

For an SAE, the share of decoder direction d_i inside the subspace S (the directions
holding 90% of Sigma_logits' trace, or of the reading at hand) is ||P_S d_i||^2 / ||d_i||^2;
a random direction has k / d on average. Do high-AtP features lie in S? The summary
compares the shares of the features AtP calls causal with the others', and correlates
share with AtP: it ties the paper's route to the definition of kappa.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from ..fileio import atomic_write_bytes
from .stats import spearman

SHARE_OF_TRACE = 0.9  # the subspace: the top directions holding this share of the trace


def subspace_path(out: Path, layer: int, reading: str) -> Path:
    return Path(out) / "subspace" / f"L{layer}-{reading}.safetensors"


def save_subspace(path: Path, eigenvectors: torch.Tensor, estimate) -> Path:
    """One reading's eigenvectors and spectra (estimate: its SigmaEstimate)."""
    tensors = {
        "eigenvectors": eigenvectors.float().contiguous(),
        "eigenvalues": torch.tensor(estimate.eigenvalues, dtype=torch.float64),
    }
    if estimate.eigenvalues_corrected is not None:
        tensors["eigenvalues_corrected"] = torch.tensor(
            estimate.eigenvalues_corrected, dtype=torch.float64
        )
    metadata = {f"directions_for_{k}": str(v) for k, v in estimate.directions_for.items()}
    metadata["reading"] = estimate.reading
    atomic_write_bytes(path, safetensors.torch.save(tensors, metadata))
    return path


def load_subspace(path: Path | str) -> dict:
    """What save_subspace wrote: the tensors, and `directions_for` {"50%": n, ...}."""
    path = Path(path)
    out: dict[str, Any] = dict(safetensors.torch.load_file(path))
    with safetensors.safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
    out["directions_for"] = {
        k.removeprefix("directions_for_"): int(v)
        for k, v in meta.items()
        if k.startswith("directions_for_")
    }
    out["reading"] = meta.get("reading")
    return out


def directions_holding(eigenvalues: torch.Tensor, share: float = SHARE_OF_TRACE) -> int:
    """How many of the top directions hold `share` of the trace (eigenvalues descending)."""
    lam = eigenvalues.double().clamp_min(0)
    cum = lam.cumsum(0) / lam.sum()
    return int((cum < share - 1e-12).sum()) + 1


def alignment(
    shares: torch.Tensor, atp: torch.Tensor, fired: torch.Tensor, epsilon: float, chance: float
) -> dict:
    """How the firing features of one SAE lie in the subspace, by AtP: the mean share of
    the causal features (AtP > epsilon) and of the others, against chance (k / d, a
    random direction's), and the rank correlation of share with AtP."""
    alive = fired > 0
    causal = alive & (atp > epsilon)
    other = alive & ~causal

    def mean(mask):
        return float(shares[mask].mean()) if mask.any() else None

    return {
        "chance": chance,
        "n_alive": int(alive.sum()),
        "n_causal": int(causal.sum()),
        "mean_share": mean(alive),
        "mean_share_causal": mean(causal),
        "mean_share_other": mean(other),
        "spearman_share_atp": spearman(shares[alive], atp[alive]),
    }


def basis_of(sigma: dict) -> tuple[str, torch.Tensor] | None:
    """The subspace SAEs are related to: (reading, basis [d, k]), the top directions
    holding SHARE_OF_TRACE of the corrected spectrum of the logits reading (loss where
    there are no logit probes); None where neither has one."""
    for reading in ("logits", "loss"):
        est = sigma.get(reading)
        if est is not None and est.eigenvectors is not None and est.erank_corrected is not None:
            spectrum = torch.tensor(est.eigenvalues_corrected, dtype=torch.float64)
            return reading, est.eigenvectors[:, : directions_holding(spectrum)]
    return None


def shares_of(digests: dict) -> dict:
    """Each decoder's shares in the subspace, from the digests {architecture: {width: ...}}."""
    return {arch: {m: d.shares for m, d in by_width.items()} for arch, by_width in digests.items()}


def causal_subspace(out: Path, layer: int, sigma: dict, shares: dict, scores, analysis) -> dict:
    """Save every direct reading's subspace under out/subspace/, and relate each SAE of the
    sweep to the subspace of basis_of(sigma): results.json["subspace"]. shares (each
    decoder row's share in it: digest.py) and scores: {architecture: {width: ...}};
    analysis: each architecture's (for epsilon)."""
    files = {}
    for reading, est in sigma.items():
        if est.eigenvectors is not None and est.erank_corrected is not None:
            path = save_subspace(subspace_path(out, layer, reading), est.eigenvectors, est)
            files[reading] = str(path.relative_to(out))
    found = basis_of(sigma)
    if found is None:
        return {"files": files, "reading": None}
    reading, basis = found
    d, k = basis.shape
    per_sae = {}
    for arch, by_width in shares.items():
        rows = []
        for width, share in sorted(by_width.items()):
            s = scores[arch][width]
            rows.append(
                {
                    "width": width,
                    **alignment(share, s.atp, s.fired, analysis[arch]["epsilon"], k / d),
                    "points": _points(share, s),
                }
            )
        per_sae[arch] = rows
    return {
        "files": files,
        "reading": reading,
        "share_of_trace": SHARE_OF_TRACE,
        "k": k,
        "d": d,
        "directions_for": sigma[reading].directions_for,
        "saes": per_sae,
    }


def _points(shares: torch.Tensor, scores, most: int = 2000) -> dict:
    """The figure's points: (AtP, share) of the firing features, evenly thinned to `most`."""
    alive = (scores.fired > 0).nonzero()[:, 0]
    if len(alive) > most:
        alive = alive[torch.linspace(0, len(alive) - 1, most).long()]
    return {"atp": scores.atp[alive].tolist(), "share": shares[alive].tolist()}
