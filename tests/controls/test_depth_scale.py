"""Depth and scale: layer choice, the per-layer summary, and the KS shape comparison."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from causaldim.controls.depth import default_depth_layers
from causaldim.controls.scale import (
    ks_shape,
    matched_layer,
    normalised_log_atp,
    scale_comparison,
    split_half_ks,
)
from causaldim.measures.score import Scores


def scores_from(atp: np.ndarray) -> Scores:
    """One block whose mean AtP is `atp`; every feature fired."""
    width = len(atp)
    return Scores(
        atp_sums=torch.tensor(atp, dtype=torch.float64)[None],
        fired_counts=torch.ones(1, width, dtype=torch.float64),
        tokens=torch.tensor([1.0]),
        active=torch.tensor([float(width)]),
    )


def analysis_for(atp: np.ndarray, percentile: float = 98.0) -> dict:
    eps = float(np.percentile(atp, percentile))
    return {
        "epsilon": eps,
        "per_width": [{"n_causal": int((atp > eps).sum())}],
        "kappa": {"free": {"kappa": 1.0}},
    }


def test_default_depth_layers_span_the_model_and_hold_the_headline():
    assert default_depth_layers(30, 15) == [1, 7, 15, 22, 28]
    assert default_depth_layers(30, 3) == [1, 3, 7, 15, 22, 28]
    assert default_depth_layers(4, 2) == [1, 2, 3]


@pytest.mark.parametrize(
    ("layer", "n", "m", "expected"),
    [(15, 30, 30, 15), (11, 24, 48, 23), (2, 4, 6, 3), (0, 4, 8, 1)],
)
def test_matched_layer_keeps_relative_depth(layer, n, m, expected):
    assert matched_layer(layer, n, m) == expected


def test_ks_detects_a_difference_in_shape_and_not_a_pure_rescaling():
    rng = np.random.default_rng(0)
    a = rng.lognormal(0.0, 1.0, 2000)
    rescaled = 37.0 * rng.lognormal(0.0, 1.0, 2000)  # same shape, another scale
    wider = rng.lognormal(0.0, 2.0, 2000)  # another shape
    xa = normalised_log_atp(scores_from(a), analysis_for(a)["epsilon"])
    for other, differs in ((rescaled, False), (wider, True)):
        xb = normalised_log_atp(scores_from(other), analysis_for(other)["epsilon"])
        out = ks_shape(xa, xb, permutations=200, seed=1)
        if differs:
            assert out["ks"] > 0.1 and out["p_value"] < 0.01
        else:
            assert out["ks"] < 0.06 and out["p_value"] > 0.01
    # Without normalising by epsilon the rescaling alone would look like a difference.
    raw = ks_shape(np.log10(a), np.log10(rescaled), permutations=50)
    assert raw["ks"] > 0.5


def test_scale_comparison_pairs_widths_and_reports_each_models_counts():
    rng = np.random.default_rng(1)
    a = {64: rng.lognormal(0, 1, 64), 128: rng.lognormal(0, 1, 128)}
    b = {64: 5 * rng.lognormal(0, 1, 64), 128: 5 * rng.lognormal(0, 1, 128)}

    def side(x):
        an = analysis_for(x[64])
        an["per_width"] = [{"n_causal": int((v > an["epsilon"]).sum())} for v in x.values()]
        return {w: scores_from(v) for w, v in x.items()}, an

    out = scale_comparison(side(a), side(b), ("A", "B"), permutations=50)
    assert out["models"] == ["A", "B"] and [r["widths"] for r in out["rows"]] == [
        [64, 64],
        [128, 128],
    ]
    assert out["epsilon"] == pytest.approx([np.percentile(a[64], 98), np.percentile(b[64], 98)])
    for r in out["rows"]:
        assert 0 <= r["ks"] <= 1 and 0 < r["p_value"] <= 1
        assert len(r["quantiles"]) == 2 and len(r["quantiles"][0]) == 41


def _two_blocks(first: np.ndarray, second: np.ndarray) -> Scores:
    """Two blocks of one token each: feature i's AtP is first[i] on one, second[i] on the other."""
    width = len(first)
    return Scores(
        atp_sums=torch.tensor(np.stack([first, second]), dtype=torch.float64),
        fired_counts=torch.ones(2, width, dtype=torch.float64),
        tokens=torch.tensor([1.0, 1.0]),
        active=torch.tensor([float(width)] * 2),
    )


def test_the_within_model_null_is_the_split_half_ks_and_sets_the_margin():
    """Halves of one model's tokens give a small KS (sampling); a difference in shape
    between models counts only above both models' split-half KS."""
    rng = np.random.default_rng(3)
    same = _two_blocks(rng.lognormal(0, 1, 3000), rng.lognormal(0, 1, 3000))
    assert split_half_ks(same, 1.0) < 0.05
    noisy = _two_blocks(rng.lognormal(0, 1, 3000), rng.lognormal(0, 1.6, 3000))
    assert split_half_ks(noisy, 1.0) > 0.1  # halves that disagree: a wide null

    def side(scores):
        atp = scores.atp.numpy()
        an = analysis_for(atp)
        return {64: scores}, an

    wider = _two_blocks(rng.lognormal(0, 2.5, 3000), rng.lognormal(0, 2.5, 3000))
    out = scale_comparison(side(same), side(wider), ("A", "B"), permutations=50)
    (row,) = out["rows"]
    assert row["margin"] == pytest.approx(max(row["null_ks"])) and row["ks"] > row["margin"]
    assert out["n_widths_beyond_null"] == 1
    again = _two_blocks(rng.lognormal(0, 1, 3000), rng.lognormal(0, 1.6, 3000))
    out = scale_comparison(side(noisy), side(again), ("A", "B"), permutations=50)
    assert out["rows"][0]["ks"] < out["rows"][0]["margin"]  # within the noise of halves
    assert out["n_widths_beyond_null"] == 0
