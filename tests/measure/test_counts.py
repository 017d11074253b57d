"""Calibration, counts, the wedge and their bootstrap, on scores with known answers."""

from __future__ import annotations

import pytest
import torch

from causaldim.measure.counts import calibrate, counts, resampled_counts, wedge
from causaldim.measure.score import Scores


def scores(atp, fired, blocks: int = 1) -> Scores:
    """Scores whose per-token means are atp, spread evenly over `blocks` blocks of 100."""
    atp = torch.tensor(atp, dtype=torch.float64)
    fired = torch.tensor(fired)
    return Scores(
        (atp * 100).expand(blocks, -1).clone(),
        fired.expand(blocks, -1).clone(),
        torch.full((blocks,), 100),
        torch.full((blocks,), 400),
    )


def test_epsilon_makes_two_percent_of_the_reference_width_causal():
    ref = scores(torch.arange(1, 1001).tolist(), [1] * 1000)
    eps = calibrate(ref.atp)
    assert counts({1000: ref}, eps)[1000]["n_causal"] == 20
    assert calibrate(ref.atp, 99.0) > eps


def test_counts_and_wedge():
    small = scores([0.0, 1.0, 5.0, 9.0], [0, 3, 1, 2])
    large = scores([0.0] * 8 + [1.0, 5.0, 9.0, 9.5, 0.5, 0.2, 0.1, 7.0], [1] * 16)
    per_width = counts({4: small, 16: large}, epsilon=4.0)
    assert per_width[4] == {
        "n_repr": 3,
        "n_causal": 2,
        "inert_fraction": pytest.approx(1 / 3),
        "mean_l0": 4.0,
    }
    assert per_width[16]["n_repr"] == 16 and per_width[16]["n_causal"] == 4
    w = wedge(per_width)
    assert w["width_ratio"] == 4
    assert w["n_repr_growth"] == pytest.approx(16 / 3)
    assert w["n_causal_growth"] == pytest.approx(2.0)
    assert w["n_causal_loglog_slope"] == pytest.approx(0.5)  # log 2 / log 4


def test_resampled_counts_recalibrate_in_every_resample():
    gen = torch.Generator().manual_seed(0)
    ref = Scores(
        torch.rand(16, 100, generator=gen, dtype=torch.float64),
        torch.ones(16, 100, dtype=torch.long),
        torch.full((16,), 10),
        torch.full((16,), 40),
    )
    wide = Scores(
        torch.rand(16, 400, generator=gen, dtype=torch.float64),
        (torch.rand(16, 400, generator=gen) < 0.05).long(),
        torch.full((16,), 10),
        torch.full((16,), 40),
    )
    boot = resampled_counts({100: ref, 400: wide}, 100, 98.0, 50, seed=0)
    assert boot["n_causal"].shape == (50, 2)
    assert (boot["n_causal"][:, 0] == 2).all()  # 2% of the reference width, by construction
    assert boot["n_causal"][:, 1].std() > 0 and boot["n_repr"][:, 1].std() > 0
    assert (boot["n_repr"][:, 1] <= wide.n_repr).all()  # a resample never adds firing
    assert boot["epsilon"].std() > 0
