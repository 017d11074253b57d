"""The two metrics of kappa: the activation-weighted reading is invariant under any
invertible linear map of the residual stream, the raw one is not."""

from __future__ import annotations

import pytest
import torch

from causaldim.config import AnalysisConfig
from causaldim.harvest.store import write_store
from causaldim.measures.kappa import measure, root

D, SEQ, N = 24, 16, 16 * 256


def columns(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """h with an anisotropic covariance, and gradients g whose covariance is not aligned
    with it (so that the metric matters)."""
    spread = torch.logspace(-1, 1, D, dtype=torch.float64)
    basis, _ = torch.linalg.qr(torch.randn(D, D, generator=gen, dtype=torch.float64))
    h = torch.randn(N, D, generator=gen, dtype=torch.float64) * spread @ basis.T
    other, _ = torch.linalg.qr(torch.randn(D, D, generator=gen, dtype=torch.float64))
    g = torch.randn(N, D, generator=gen, dtype=torch.float64) * spread.flip(0).sqrt() @ other.T
    return h, g


def kappa_of(tmp_path, name: str, h: torch.Tensor, g: torch.Tensor):
    store = write_store(
        tmp_path / name, {"eval": {"h": h.float(), "g": g.float()}}, SEQ, {"test": name}
    )
    return measure(store, AnalysisConfig(blocks=8))["loss"]


@pytest.mark.parametrize("kind", ["invertible", "diagonal"])
def test_kappa_act_is_invariant_under_a_linear_map_of_the_residual(tmp_path, kind):
    gen = torch.Generator().manual_seed(0)
    h, g = columns(gen)
    if kind == "invertible":
        m = torch.randn(D, D, generator=gen, dtype=torch.float64) / D**0.5 + 2 * torch.eye(D)
    else:
        m = torch.diag(
            torch.logspace(-1, 1, D, dtype=torch.float64)[torch.randperm(D, generator=gen)]
        )
    # h -> M h, u -> M^-T u (the chain rule's pull-back), as rows
    mapped_h, mapped_g = h @ m.T, g @ torch.linalg.inv(m)
    before = kappa_of(tmp_path, "before", h, g)
    after = kappa_of(tmp_path, "after", mapped_h, mapped_g)
    act_before, act_after = before.activation_weighted, after.activation_weighted
    for key in ("erank", "erank_corrected", "n_independent"):
        assert act_after[key] == pytest.approx(act_before[key], rel=1e-4), key
    for a, b in zip(act_after["erank_corrected_95"], act_before["erank_corrected_95"], strict=True):
        assert a == pytest.approx(b, rel=1e-3)
    # the raw reading moves: the same samples in other coordinates
    assert abs(after.erank / before.erank - 1) > 0.05
    assert abs(after.erank_corrected / before.erank_corrected - 1) > 0.05


def test_kappa_act_is_the_erank_of_the_whitened_sigma(tmp_path):
    gen = torch.Generator().manual_seed(1)
    h, g = columns(gen)
    est = kappa_of(tmp_path, "plain", h, g)
    hf, gf = h.float().double(), g.float().double()
    c = torch.cov(hf.T, correction=0)
    has_target = (torch.arange(N) % SEQ) < SEQ - 1
    sigma = gf[has_target].T @ gf[has_target] / int(has_target.sum())
    lam = torch.linalg.eigvalsh(root(c) @ sigma @ root(c)).clamp_min(0)
    p = lam / lam.sum()
    erank = float(torch.exp(-(p[p > 0] * p[p > 0].log()).sum()))
    assert est.activation_weighted["erank"] == pytest.approx(erank, rel=1e-4)
    assert est.activation_weighted["definition"].startswith("erank(C^1/2 E[g g^T]")
    lo, hi = est.activation_weighted["erank_corrected_95"]
    assert lo <= est.activation_weighted["erank_corrected"] <= hi
