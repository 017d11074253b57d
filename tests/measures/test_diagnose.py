"""The estimator's diagnostics and the split-robust estimate, on dictionaries with known
answers: a feature split in two, the Markov ceiling, and not-estimable sweeps."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from causaldim.config import AnalysisConfig
from causaldim.measures import attributed, diagnose
from causaldim.measures.analysis import analyze, not_estimable
from causaldim.measures.digest import digest
from causaldim.measures.score import Scores

D = 16


def unit_rows(n: int, seed: int = 0) -> torch.Tensor:
    w = torch.randn(n, D, generator=torch.Generator().manual_seed(seed))
    return w / w.norm(dim=1, keepdim=True)


def scores_of(atp_per_block: torch.Tensor, fired_per_block: torch.Tensor, seed=None) -> Scores:
    """Scores with these sums; with a seed, also v v^T sums (random, positive definite)."""
    blocks = len(atp_per_block)
    vv = torch.zeros(0)
    if seed is not None:
        x = torch.randn(blocks, 50, D, generator=torch.Generator().manual_seed(seed))
        vv = (x.transpose(1, 2) @ x).double()
    return Scores(
        atp_per_block.double(),
        fired_per_block.double(),
        torch.full((blocks,), 100),
        torch.full((blocks,), 400),
        vv,
    )


def split_codes(f: torch.Tensor, w_dec: torch.Tensor, i: int, gen) -> tuple:
    """Feature i split into two copies along its direction: on each token its activation
    goes to one child or the other (taking turns) or is shared between them."""
    share = torch.rand(len(f), generator=gen)
    share = torch.where(share < 0.3, 0.0, torch.where(share > 0.7, 1.0, share))
    f_split = torch.cat([f, (f[:, i] * (1 - share))[:, None]], 1)
    f_split[:, i] = f[:, i] * share
    return f_split, torch.cat([w_dec, w_dec[i : i + 1]])


def test_splitting_a_feature_leaves_the_seen_gradient_unchanged():
    gen = torch.Generator().manual_seed(1)
    w_dec = unit_rows(40)
    f = torch.rand(500, 40, generator=gen) * (torch.rand(500, 40, generator=gen) < 0.2)
    g = torch.randn(500, D, generator=gen)
    v = attributed.seen_gradient(f, g, w_dec)
    f2, w2 = split_codes(f, w_dec, 3, gen)
    f2, w2 = split_codes(f2, w2, 17, gen)
    v2 = attributed.seen_gradient(f2, g, w2)
    assert torch.allclose(v2, v, atol=1e-5)
    assert attributed.erank_of(v2.T @ v2) == pytest.approx(attributed.erank_of(v.T @ v), rel=1e-5)
    # the count of features above a bar is not left alone: feature 3's children share
    # its AtP, and neither reaches a bar just below the parent's
    atp, atp2 = (f * (g @ w_dec.T)).abs().mean(0), (f2 * (g @ w2.T)).abs().mean(0)
    eps = float(atp[3]) * 0.95
    assert (atp2[[3, 40]] < eps).all() and atp[3] > eps


@given(st.integers(1, 200), st.integers(0, 10_000))
@settings(max_examples=30, deadline=None)
def test_kappa_sae_is_bounded_by_d(width, seed):
    gen = torch.Generator().manual_seed(seed)
    f = torch.rand(64, width, generator=gen) ** 4
    v = attributed.seen_gradient(f, torch.randn(64, D, generator=gen), unit_rows(width, seed))
    assert 1.0 - 1e-9 <= attributed.erank_of(v.T @ v) <= D + 1e-6


def test_splits_are_seen_as_children_sharing_the_parents_firings():
    ref_dec = unit_rows(20)
    ref = scores_of(torch.linspace(0, 1, 20).expand(2, -1), torch.full((2, 20), 50.0))
    eps = float(ref.atp.quantile(0.9))  # parents: the top 2 features (18, 19)
    # each reference feature becomes two children at cosine 1 that share its firings 30/70
    wide_dec = torch.cat([ref_dec, ref_dec])
    wide = scores_of(
        torch.cat([ref.atp_sums, ref.atp_sums], 1),
        torch.cat([torch.full((2, 20), 15.0), torch.full((2, 20), 35.0)], 1),
    )
    (row,) = diagnose.splits(ref, eps, {40: (wide, digest(wide_dec, None, ref_dec))})
    assert row["parents"] == 2 and row["best_cosine"] == pytest.approx(1.0)
    assert row["children"] == 2.0
    assert row["top_child_share"] == pytest.approx(0.7)
    assert row["children_firings_over_parent"] == pytest.approx(1.0)


@given(
    st.lists(st.integers(8, 64), min_size=2, max_size=5, unique=True),
    st.integers(0, 10_000),
)
@settings(max_examples=25, deadline=None)
def test_n_causal_never_exceeds_the_markov_ceiling(widths, seed):
    gen = torch.Generator().manual_seed(seed)
    widths = sorted(widths)
    scores = {
        m: scores_of(
            torch.rand(4, m, generator=gen) ** 3, torch.randint(0, 30, (4, m), generator=gen)
        )
        for m in widths
    }
    cfg = AnalysisConfig(bootstrap=0)
    a = analyze(scores, {}, D, cfg, seed)
    for row in a["per_width"]:
        assert row["n_causal"] <= row["markov_ceiling"] + 1e-9
        assert row["atp_total"] == pytest.approx(float(scores[row["width"]].atp.sum()))


def test_kappa_hat_is_not_estimable_where_n_causal_does_not_grow():
    assert "4" in not_estimable([1, 2, 3], 2.0, [1.5, 2.5])
    assert "does not grow" in not_estimable([1, 2, 3, 4], 0.33, [0.2, 0.6])
    assert "reaches 1" in not_estimable([1, 2, 3, 4], 1.4, [0.9, 2.0])
    assert not_estimable([1, 2, 3, 4], 1.4, [1.1, 2.0]) is None
    assert "0 at the smallest" in not_estimable([1, 2, 3, 4], None, None)


def test_analysis_reports_both_normalisations_and_the_regime():
    gen = torch.Generator().manual_seed(3)
    widths = [32, 64, 128, 256]
    scores = {
        m: scores_of(
            torch.rand(8, m, generator=gen) ** 3, torch.randint(0, 30, (8, m), generator=gen), m
        )
        for m in widths
    }
    decoders = {m: unit_rows(m, m) for m in widths}
    digests = {m: digest(w, None, decoders[32] if m > 32 else None) for m, w in decoders.items()}
    a = analyze(scores, {}, D, AnalysisConfig(bootstrap=20), 0, digests)
    assert a["normalisation"] == "all" and a["sensitivity"]["normalisation"] == "firing"
    assert a["regime"]["reference_over_d"] == 2.0 and a["regime"]["widest_over_d"] == 16.0
    assert a["regime"]["paper_reference_over_d"] == pytest.approx(16384 / 2304)
    assert len(a["splits"]) == 3 and a["attributed"]["per_width"][0]["width"] == 32
    for r in a["attributed"]["per_width"]:
        assert 1 <= r["erank"] <= D
        # printed only where the resampled interval holds the point, never widened
        assert r["erank_95"] is None or r["erank_95"][0] <= r["erank"] <= r["erank_95"][1]
    assert a["attributed"]["groups"] == 8 and a["attributed"]["resamples"] == 20
    firing = analyze(
        {m: s.normalised("firing") for m, s in scores.items()}, {}, D, AnalysisConfig(bootstrap=0)
    )
    # each analysis's sensitivity line is the other's headline count
    assert firing["sensitivity"]["n_causal"] == [r["n_causal"] for r in a["per_width"]]
    assert [r["n_causal"] for r in firing["per_width"]] == a["sensitivity"]["n_causal"]
    assert a["estimable"] == (a["not_estimable"] is None)
    assert not math.isnan(a["epsilon"]) and np.isfinite(a["sensitivity"]["epsilon"])


def test_kappa_sae_warns_where_its_interval_does_not_hold_its_point():
    rows = [
        {"width": 256, "erank": 120.0, "erank_95": [111.0, 123.0]},
        {"width": 2048, "erank": 201.0, "erank_95": None},
    ]
    found = {"per_width": rows, "resamples": 50}
    (line,) = attributed.warnings(found)
    assert "at width(s) 2,048 " in line and "bias signal" in line
    assert attributed.warnings({"per_width": rows[:1], "resamples": 50}) == []
    assert attributed.warnings({"per_width": rows, "resamples": 0}) == []  # none drawn
    assert attributed.warnings(None) == []
