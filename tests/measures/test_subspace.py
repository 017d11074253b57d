"""The causal subspace: decoder shares against known geometry (a run's artifact is
tested in test_pipeline.py)."""

from __future__ import annotations

import pytest
import torch

from causaldim.measures.digest import decoder_shares
from causaldim.measures.subspace import alignment, directions_holding


def test_decoder_shares_measure_the_part_inside_the_basis():
    d, k = 12, 3
    basis = torch.linalg.qr(torch.randn(d, d, dtype=torch.float64)).Q[:, :k]
    inside, outside = basis[:, 0] * 2.0, torch.linalg.qr(torch.randn(d, d)).Q[:, 0]
    outside = outside.double() - basis @ (basis.T @ outside.double())  # orthogonal to S
    half = basis[:, 1] + outside / outside.norm()  # equal parts in and out
    rows = torch.stack([inside, outside, half]).float()
    assert decoder_shares(rows, basis).tolist() == pytest.approx([1.0, 0.0, 0.5], abs=1e-6)
    random_rows = torch.randn(20_000, d)
    assert float(decoder_shares(random_rows, basis).mean()) == pytest.approx(k / d, rel=0.03)


def test_directions_holding_counts_the_top_of_the_trace():
    lam = torch.tensor([5.0, 3.0, 1.0, 0.5, 0.5])
    assert directions_holding(lam, 0.5) == 1
    assert directions_holding(lam, 0.8) == 2
    assert directions_holding(lam, 0.9) == 3
    assert directions_holding(lam, 1.0) == 5


def test_alignment_separates_causal_from_other_features():
    shares = torch.tensor([0.9, 0.8, 0.1, 0.2, 0.05, 0.5])
    atp = torch.tensor([5.0, 4.0, 0.1, 0.2, 0.05, 0.0])
    fired = torch.tensor([3, 3, 3, 3, 3, 0])  # the last never fired: left out
    a = alignment(shares, atp, fired, epsilon=1.0, chance=0.25)
    assert a["n_alive"] == 5 and a["n_causal"] == 2
    assert a["mean_share_causal"] == pytest.approx(0.85)
    assert a["mean_share_other"] == pytest.approx((0.1 + 0.2 + 0.05) / 3)
    assert a["spearman_share_atp"] == pytest.approx(1.0)
    none_causal = alignment(shares, atp, fired, epsilon=10.0, chance=0.25)
    assert none_causal["mean_share_causal"] is None and none_causal["n_causal"] == 0
