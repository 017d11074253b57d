"""Calibration, counts and the wedge on scores with known answers."""

from __future__ import annotations

import pytest
import torch

from causaldim.score import Scores
from causaldim.wedge import calibrate, counts, wedge


def scores(atp, fired):
    return Scores(torch.tensor(atp, dtype=torch.float32), torch.tensor(fired), 100, 4.0)


def test_epsilon_makes_two_percent_of_the_reference_width_causal():
    ref = scores(torch.arange(1, 1001).tolist(), [1] * 1000)
    eps = calibrate(ref)
    assert counts({1000: ref}, eps)[1000]["n_causal"] == 20
    assert calibrate(ref, 99.0) > eps


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
