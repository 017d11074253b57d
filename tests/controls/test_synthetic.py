"""Control 'synthetic': a toy layer with a planted k-dimensional causal subspace."""

from __future__ import annotations

import json
import math

import pytest
import torch

from causaldim.config import AnalysisConfig
from causaldim.controls import synthetic
from causaldim.controls.synthetic import SyntheticSpec, planted, recovery, synthetic_store
from causaldim.measures.kappa import measure
from causaldim.measures.score import atp_scores
from causaldim.sae import SAEConfig, build
from causaldim.sweep_config import SweepConfig

SMALL = SyntheticSpec(
    d=32, k=4, n_features=64, feature_density=0.06, train_tokens=4096, eval_tokens=4096, seq_len=32
)


@pytest.mark.parametrize("d, k", [(64, 8), (32, 5)])
def test_the_direct_erank_equals_k_within_two_percent(tmp_path, d, k):
    spec = SyntheticSpec(d=d, k=k, n_features=4 * d, train_tokens=1024, eval_tokens=8192)
    est = measure(synthetic_store(tmp_path, spec, seed=1), AnalysisConfig(bootstrap=0))
    assert est["loss"].erank == pytest.approx(k, rel=0.02)
    assert sum(e > 1e-6 for e in est["loss"].eigenvalues) == k  # g has no part outside U
    # The representation itself uses nearly every dimension: erank(h) is not k.
    assert est["activations"].erank > 0.8 * d


def test_planted_directions_are_orthonormal_and_noncausal_ones_lie_outside_them():
    p = planted(SMALL, seed=3)
    assert torch.allclose(p.causal.T @ p.causal, torch.eye(SMALL.k), atol=1e-5)
    assert p.noncausal.shape == (SMALL.n_features, SMALL.d)
    assert torch.allclose(p.noncausal.norm(dim=1), torch.ones(SMALL.n_features), atol=1e-5)
    assert (p.noncausal @ p.causal).abs().max() < 1e-5
    assert torch.equal(planted(SMALL, seed=3).causal, p.causal)  # a function of the seed


def _rotate_pairs(u: torch.Tensor) -> torch.Tensor:
    """Planted directions mixed pairwise at 45 degrees: the same span, every cosine 0.71."""
    a, b = u[:, 0::2], u[:, 1::2]
    return torch.cat([a + b, a - b], dim=1) / math.sqrt(2)


def test_recovery_on_hand_made_dictionaries():
    p = planted(SMALL, seed=0)
    u, k = p.causal, SMALL.k
    others = p.noncausal[:10]
    atp = torch.tensor([1.0] * k + [0.0] * len(others))

    exact = recovery(torch.cat([u.T, others]), atp, 0.5, u)
    assert exact["recall"] == exact["recall_dictionary"] == 1.0
    assert exact["subspace_capture"] == pytest.approx(1.0)
    assert exact["n_selected_noncausal"] == 0

    rotated = recovery(torch.cat([_rotate_pairs(u).T, others]), atp, 0.5, u)
    assert rotated["recall"] == rotated["recall_dictionary"] == 0.0  # no row within 0.9
    assert rotated["subspace_capture"] == pytest.approx(1.0)  # but the span is U's
    assert max(rotated["best_cosine"]) == pytest.approx(1 / math.sqrt(2), abs=1e-5)

    half = torch.tensor([1.0] * (k // 2) + [0.0] * (k - k // 2) + [0.0] * len(others))
    part = recovery(torch.cat([u.T, others]), half, 0.5, u)
    assert part["recall"] == pytest.approx(0.5) and part["recall_dictionary"] == 1.0
    assert part["subspace_capture"] == pytest.approx(0.5)

    wrong = torch.tensor([0.0] * k + [1.0] * len(others))
    miss = recovery(torch.cat([u.T, others]), wrong, 0.5, u)
    assert miss["recall"] == 0.0 and miss["subspace_capture"] == pytest.approx(0.0, abs=1e-6)
    assert miss["n_selected_noncausal"] == len(others)
    assert miss["selected_noncausal_fraction"] == 1.0

    none = recovery(torch.cat([u.T, others]), torch.zeros(len(atp)), 0.5, u)
    assert none["recall"] == none["subspace_capture"] == 0.0
    assert none["selected_noncausal_fraction"] is None


def test_the_generating_dictionary_puts_all_attribution_on_the_planted_features(tmp_path):
    store = synthetic_store(tmp_path, SMALL, seed=0)
    p = planted(SMALL, seed=0)
    rows = torch.cat([p.causal.T, p.noncausal])
    sae = build(SAEConfig("topk", SMALL.d, len(rows), k=8))
    with torch.no_grad():
        sae.W_enc_t.copy_(rows)
        sae.W_dec.copy_(rows)
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    atp = atp_scores(sae.requires_grad_(False), store, blocks=8).atp
    causal, other = atp[: SMALL.k], atp[SMALL.k :]
    assert other.max() < 1e-4 * causal.min()  # non-causal rows are orthogonal to g
    out = recovery(sae.W_dec, atp, float(other.max()), p.causal)
    assert out["recall"] == 1.0 and out["n_selected_noncausal"] == 0


def test_the_sweep_is_held_to_the_toys_size():
    paper = SweepConfig(
        widths=[16_384, 65_536, 262_144, 1_048_576], architectures=["jumprelu", "topk"], k=64
    )
    cfg = synthetic.synthetic_sweep(paper, d=64)
    assert cfg.architectures == ["jumprelu"]
    assert cfg.k == 8
    assert cfg.widths == [64, 256, 1024, 4096]  # scaled down, ratios kept
    small = synthetic.synthetic_sweep(SweepConfig(widths=[256, 512], k=4), d=64)
    assert small.widths == [256, 512] and small.k == 4  # within the limits: unchanged


def test_a_tiny_sweep_on_the_toy_returns_sane_data(tmp_path):
    sweep = SweepConfig(widths=[32, 64, 128, 256], k=4, epochs=1, batch_tokens=256)
    analysis = AnalysisConfig(blocks=8, bootstrap=20)
    out = synthetic.synthetic_ground_truth(tmp_path, sweep, analysis, seed=0, spec=SMALL)
    json.dumps(out)  # plain data for results.json
    assert out["k"] == SMALL.k and out["d_model"] == SMALL.d
    assert abs(out["direct"]["relative_error"]) < 0.02
    assert out["direct"]["erank"] == pytest.approx(SMALL.k, rel=0.02)
    assert [r["width"] for r in out["rows"]] == sweep.widths
    assert out["epsilon"] > 0
    for r in out["rows"]:
        assert 0 <= r["n_causal"] <= r["n_repr"] <= r["width"]
        assert 0.0 <= r["recall"] <= r["recall_dictionary"] <= 1.0
        assert -1e-9 <= r["subspace_capture"] <= 1.0 + 1e-9
        assert 0 <= r["n_selected_noncausal"] <= r["n_causal"]
        assert len(r["best_cosine"]) == SMALL.k
        assert r["l0"] == pytest.approx(4.0)
    # epsilon is the 98th percentile of the smallest width: about 2% of it lies above
    assert out["rows"][0]["n_causal"] == pytest.approx(0.02 * 32, abs=2)
    assert out["kappa_over_k"] == pytest.approx(out["kappa_hat"] / SMALL.k)


def test_the_split_robust_estimate_recovers_the_planted_k(tmp_path):
    """kappa_SAE = erank(E[v v^T]) lands on the planted k at every width once the SAEs
    have learned the planted directions, while N_causal falls with the width. The toy at
    its default size with the planted directions firing 10x as often as the rest, so that
    the SAEs learn them (about 40 s); the default toy no longer favours them."""
    spec = synthetic.SyntheticSpec(eval_tokens=4096, causal_density=0.25)
    sweep = SweepConfig(widths=[64, 128], k=8, epochs=3, batch_tokens=256)
    out = synthetic.synthetic_ground_truth(
        tmp_path, sweep, AnalysisConfig(blocks=8, bootstrap=20), seed=0, spec=spec
    )
    assert all(r["recall_dictionary"] == 1.0 for r in out["rows"])  # the SAEs learned U
    for r in out["rows"]:
        assert r["kappa_SAE"] == pytest.approx(spec.k, rel=0.05)
    lo, hi = out["kappa_SAE_95"]
    assert lo <= out["kappa_SAE"] <= hi and hi < spec.k * 1.1
    assert out["kappa_SAE_over_k"] == pytest.approx(out["kappa_SAE"] / spec.k)
