"""What the analysis reads of an SAE's decoder, reduced to numbers per feature while the
weights are at hand, so that a sweep can drop an SAE's weights once it is scored
(--drop-weights) and still report everything:

- `shares`: each decoder row's share of its squared norm inside the causal subspace
  (subspace.py relates them to AtP);
- against the reference width's decoder (diagnose.splits): each row's nearest reference
  feature and that cosine, and each reference feature's best cosine with any row.

Saved beside the SAE's scores, as OUT/scores/NAME.decoder.safetensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import safetensors.torch
import torch

from ..fileio import atomic_write_bytes

ROWS = 4096  # decoder rows compared at a time (bounds the cosine matrix)
EMPTY = torch.zeros(0)


class DecoderDigest(NamedTuple):
    shares: torch.Tensor = EMPTY  # [width]; empty without a subspace
    nearest: torch.Tensor = EMPTY  # [width] long: the nearest reference feature
    nearest_cos: torch.Tensor = EMPTY  # [width]: its cosine
    best: torch.Tensor = EMPTY  # [reference width]: its best cosine with any row here


def unit_rows(w: torch.Tensor) -> torch.Tensor:
    w = w.detach().float()
    return w / w.norm(dim=1, keepdim=True).clamp_min(1e-12)


def decoder_shares(W_dec: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """Per decoder row, the share of its squared norm inside span(basis) ([d, k],
    orthonormal columns), in float64."""
    rows = W_dec.detach().double()
    inside = (rows @ basis.to(rows.device, torch.float64)).pow(2).sum(1)
    return (inside / rows.pow(2).sum(1).clamp_min(1e-30)).float().cpu()


def digest(
    W_dec: torch.Tensor,
    basis: torch.Tensor | None,
    reference: torch.Tensor | None,
    device: str | torch.device = "cpu",
) -> DecoderDigest:
    """The digest of one decoder ([width, d]): its shares in span(basis) (none without
    one) and its cosines against the reference decoder (none without one), computed on
    device ROWS rows at a time (no copy of the whole decoder)."""
    ref_unit = None if reference is None else unit_rows(reference.to(device))
    best = None if ref_unit is None else torch.full((len(ref_unit),), -1.0, device=device)
    shares, nearest, nearest_cos = [], [], []
    for start in range(0, len(W_dec), ROWS):
        rows = W_dec[start : start + ROWS].detach().to(device)
        if basis is not None:
            shares.append(decoder_shares(rows, basis))
        if ref_unit is not None:
            assert best is not None  # made with ref_unit
            cos = unit_rows(rows) @ ref_unit.T  # [rows, reference width]
            best = torch.maximum(best, cos.max(0).values)
            value, index = cos.max(1)
            nearest.append(index.cpu())
            nearest_cos.append(value.cpu())
    found = torch.cat(shares) if shares else EMPTY
    if ref_unit is None:
        return DecoderDigest(found)
    assert best is not None  # made with ref_unit
    return DecoderDigest(found, torch.cat(nearest), torch.cat(nearest_cos), best.cpu())


def digest_path(scores_path: Path) -> Path:
    """Where the digest of the SAE scored into scores_path goes."""
    return scores_path.with_suffix(".decoder.safetensors")


def save_digest(d: DecoderDigest, path: Path) -> None:
    atomic_write_bytes(
        path, safetensors.torch.save({k: v.contiguous() for k, v in d._asdict().items()})
    )


def load_digest(path: Path) -> DecoderDigest:
    return DecoderDigest(**safetensors.torch.load_file(path))
