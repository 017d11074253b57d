"""The controls on cases whose answers are known by construction."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from causaldim.config import AnalysisConfig
from causaldim.controls.four_cell import four_cell, randomized
from causaldim.controls.geometry import frequency_matched, geometric_privilege
from causaldim.controls.l0 import matched_l0
from causaldim.controls.thresholds import PERCENTILES, threshold_robustness
from causaldim.harvest.store import write_store
from causaldim.measures.score import Scores, atp_scores
from causaldim.measures.stats import auc
from causaldim.sae import SAEConfig, build

D, SEQ = 16, 16


def planted(tmp_path, n_seqs=64, seed=0):
    """Tokens are 2-sparse codes over the standard basis; the loss gradient points along
    e_0 only, so feature 0 is the one causal direction."""
    gen = torch.Generator().manual_seed(seed)
    n = n_seqs * SEQ

    def codes():
        idx = torch.rand(n, D, generator=gen).argsort(-1)[:, :2]
        return torch.zeros(n, D).scatter_(1, idx, 1 + torch.rand(n, 2, generator=gen))

    g = torch.zeros(n, D)
    g[:, 0] = torch.randn(n, generator=gen)
    return write_store(
        tmp_path / "store",
        {"eval": {"h": codes(), "g": g}, "train": {"h": codes()}},
        SEQ,
        {"toy": "2-sparse codes, g along e_0"},
    )


def identity_sae(arch="topk"):
    """The dictionary that generated the data: encoder and decoder the identity."""
    sae = build(SAEConfig(arch, D, D, k=2 if arch == "topk" else None))
    with torch.no_grad():
        sae.W_enc_t.copy_(torch.eye(D))
        sae.W_dec.copy_(torch.eye(D))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    return sae.requires_grad_(False)


def test_four_cell_ablation_on_a_known_dictionary(tmp_path):
    store = planted(tmp_path)
    cfg = AnalysisConfig(blocks=4)
    out = four_cell({D: identity_sae()}, store, 1e-6, cfg, seed=0)
    cells = out["rows"][0]["cells"]
    # Trained decoder: only feature 0 moves the loss, whatever the encoder picks.
    assert cells["trained/trained"]["n_causal"] == 1
    assert cells["random/trained"]["n_causal"] <= 1
    # A random decoder row has a component along e_0: every firing feature counts.
    assert cells["trained/random"]["n_causal"] == cells["trained/random"]["n_repr"] == D
    assert cells["random/random"]["n_causal"] == cells["random/random"]["n_repr"]
    assert all(c["l0"] == pytest.approx(2.0) for c in cells.values())  # TopK, k = 2
    assert out["rows"][0]["random_encoder_inflation"] == cells["random/trained"]["n_causal"]


def test_a_random_encoder_is_orthonormal_and_keeps_each_features_norms():
    gen = torch.Generator().manual_seed(0)
    for width in (8, 40):  # fewer and more features than dimensions
        sae = build(SAEConfig("topk", D, width, k=2))
        sae.reset(torch.Generator().manual_seed(1))
        with torch.no_grad():
            sae.W_enc_t.mul_(torch.rand(width, 1) + 0.5)
        r = randomized(sae, True, True, gen, torch.randn(64, D))
        if width <= D:  # orthonormal directions (beyond d: rows of an orthonormal basis)
            w = r.W_enc_t.double() / r.W_enc_t.double().norm(dim=1, keepdim=True)
            assert torch.allclose(w @ w.T, torch.eye(width, dtype=torch.float64), atol=1e-5)
        assert torch.allclose(r.W_enc_t.norm(dim=1), sae.W_enc_t.norm(dim=1), rtol=1e-5)
        assert torch.allclose(r.W_dec.norm(dim=1), sae.W_dec.norm(dim=1), rtol=1e-5)
        assert not torch.allclose(r.W_dec, sae.W_dec)


def test_a_random_threshold_encoder_is_brought_back_to_the_trained_l0(tmp_path):
    store = planted(tmp_path)
    sae = identity_sae("relu")
    with torch.no_grad():
        sae.b_enc.fill_(-0.5)  # codes are 0 or >= 1: L0 is exactly 2
    x = next(store.batches("train", ("h",), 1024))["h"]
    r = randomized(sae, True, False, torch.Generator().manual_seed(0), x)
    l0 = float((r.encode(x) > 0).sum(-1).float().mean())
    assert l0 == pytest.approx(2.0, rel=0.05)


def test_with_l0_free_a_random_encoder_keeps_the_trained_thresholds(tmp_path):
    """The paper's four cells let the encoder act as a sparsity filter: with match=False
    the thresholds stay as trained and L0 moves with the random encoder."""
    store = planted(tmp_path)
    sae = identity_sae("relu")
    with torch.no_grad():
        sae.b_enc.fill_(-0.5)  # codes are 0 or >= 1: L0 is exactly 2
    x = next(store.batches("train", ("h",), 1024))["h"]
    free = randomized(sae, True, False, torch.Generator().manual_seed(0), x, match=False)
    assert torch.equal(free.b_enc, torch.zeros(D))  # the random encoder's own bias
    l0 = float((free.encode(x) > 0).sum(-1).float().mean())
    assert l0 != pytest.approx(2.0, rel=0.05)  # not brought back to the trained L0
    out = four_cell({D: sae}, store, 1e-6, AnalysisConfig(blocks=4), seed=0, match=False)
    cells = out["rows"][0]["cells"]
    assert cells["trained/trained"]["l0"] == pytest.approx(2.0)
    assert cells["random/trained"]["l0"] != pytest.approx(2.0, rel=0.05)


def test_threshold_robustness_is_monotone_in_the_percentile(tmp_path):
    store = planted(tmp_path)
    saes = {}
    for width in (16, 32, 64):
        sae = build(SAEConfig("topk", D, width, k=2))
        sae.reset(torch.Generator().manual_seed(width))
        saes[width] = sae.requires_grad_(False)
    scores = {m: atp_scores(sae, store, blocks=8) for m, sae in saes.items()}
    evals = {m: {"l0": 2.0} for m in saes}
    out = threshold_robustness(scores, evals, D, AnalysisConfig(bootstrap=20), seed=0)
    rows = out["rows"]
    assert [r["percentile"] for r in rows] == list(PERCENTILES)
    eps = [r["epsilon"] for r in rows]
    assert eps == sorted(eps) and eps[0] < eps[-1]
    for j in range(3):  # a higher bar never counts more features
        counts = [r["n_causal"][j] for r in rows]
        assert counts == sorted(counts, reverse=True)
    # epsilon at the p-th percentile of the reference width leaves (100 - p)% above it
    ref = scores[16].atp
    assert rows[0]["n_causal"][0] == int((ref > eps[0]).sum())


def test_matched_l0_flags_what_strays_beyond_ten_percent():
    evals = {"topk": {16: {"l0": 32.0}}, "relu": {16: {"l0": 35.0}, 32: {"l0": 28.0}}}
    out = matched_l0(evals, 32.0)
    flags = {(r["architecture"], r["width"]): r["flagged"] for r in out["rows"]}
    assert flags == {("topk", 16): False, ("relu", 16): False, ("relu", 32): True}
    assert out["n_flagged"] == 1


def _geometry_case(width: int):
    """A TopK SAE of width features, its first 40 causal; (generator, sae, causal mask)."""
    gen = torch.Generator().manual_seed(0)
    sae = build(SAEConfig("topk", D, width, k=2))
    sae.reset(gen)
    causal = torch.zeros(width, dtype=torch.bool)
    causal[:40] = True
    return gen, sae, causal


def _scores_of(causal: torch.Tensor, fired: torch.Tensor) -> dict:
    atp = torch.where(causal, 1.0, 0.01).double()
    return {len(causal): Scores(atp[None], fired[None], torch.tensor([1]), torch.tensor([2]))}


def test_geometric_privilege_finds_a_planted_difference_and_not_a_missing_one():
    width = 200
    _, sae, causal = _geometry_case(width)
    with torch.no_grad():
        sae.W_dec[causal] *= 3.0  # causal features have longer decoder rows
    scores = _scores_of(causal, torch.ones(width, dtype=torch.float64))
    out = geometric_privilege({width: sae}, scores, 0.5, seed=0, resamples=50)
    row = out["rows"][0]
    assert row["decoder_norm"]["n_causal"] == 40 and row["decoder_norm"]["n_other"] == 160
    assert row["decoder_norm"]["auc"] == 1.0
    lo, hi = row["nn_cosine"]["auc_95"]  # directions were not touched: no difference
    assert lo < 0.5 < hi


def test_auc_is_a_probability_of_superiority():
    assert auc(np.array([3.0, 4.0]), np.array([1.0, 2.0])) == 1.0
    assert auc(np.array([1.0]), np.array([1.0])) == 0.5


def test_frequency_matching_pairs_each_causal_feature_with_one_that_fires_as_often():
    fired = np.array([100, 90, 5, 1, 95, 4, 0, 98])
    causal = np.array([0, 2])
    other = np.array([False, True, False, True, False, True, False, True])  # 6 never fired
    gen = np.random.default_rng(0)
    picks = [frequency_matched(fired, causal, other, gen).tolist() for _ in range(40)]
    assert {p[0] for p in picks} == {7}  # 98 is within 5% of 100; 90 is not
    assert {p[1] for p in picks} == {5}  # 4 is the nearest to 5
    fired[7] = 102
    picks = [frequency_matched(fired, causal, other, gen)[0] for _ in range(40)]
    assert set(picks) == {7}
    fired[1] = 98  # two within 5%: drawn from both
    assert {frequency_matched(fired, causal, other, gen)[0] for _ in range(40)} == {1, 7}
    assert frequency_matched(fired, causal, np.zeros(8, dtype=bool), gen).tolist() == []


def test_geometry_matched_on_firing_removes_a_difference_that_is_frequency():
    """Features that fire often sit close together (a cluster); AtP selects frequent
    ones: unmatched, causal features look closer to their neighbours; against non-causal
    features that fire as often, alike."""
    width = 300
    gen, sae, causal = _geometry_case(width)  # causal: 40 of the 100 frequent features
    frequent = torch.zeros(width, dtype=torch.bool)
    frequent[:100] = True
    with torch.no_grad():  # the frequent features crowd around one direction
        centre = torch.randn(D, generator=gen)
        sae.W_dec[frequent] = centre + 0.3 * torch.randn(100, D, generator=gen)
    scores = _scores_of(causal, torch.where(frequent, 500.0, 5.0).double())
    row = geometric_privilege({width: sae}, scores, 0.5, seed=0, resamples=100)["rows"][0]
    assert row["nn_cosine"]["auc_95"][0] > 0.6  # unmatched: a difference
    lo, hi = row["nn_cosine_matched"]["auc_95"]
    assert lo < 0.5 < hi  # matched: none
