"""Calibration, counts, the wedge and their bootstrap, on scores with known answers."""

from __future__ import annotations

import pytest
import torch

from causaldim.measures.counts import calibrate, counts, resampled_counts, wedge
from causaldim.measures.score import Scores


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
        "n_too_rare": 0,
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


def test_the_slope_rests_on_the_widths_with_counts_and_says_how_many():
    per_width = {
        256: {"n_repr": 200, "n_causal": 6},
        512: {"n_repr": 400, "n_causal": 0},
        1024: {"n_repr": 800, "n_causal": 0},
        2048: {"n_repr": 1600, "n_causal": 24},
    }
    w = wedge(per_width)
    assert w["widths"] == 4 and w["n_repr_loglog_widths"] == 4
    assert w["n_causal_loglog_widths"] == 2  # the zeros are left out, and counted
    assert w["n_causal_loglog_slope"] == pytest.approx(2 / 3)  # log 4 / log 8
    assert w["n_repr_loglog_slope"] == pytest.approx(1.0)


def planted_dictionary(tokens: int = 1000) -> Scores:
    """Two features with known answers over 4 blocks of `tokens` tokens: a rare one (10% of
    tokens) with effect 1.0 per firing, a frequent one (90%) with effect 0.2, and one that
    never fires."""
    rare, frequent = 0.1 * tokens, 0.9 * tokens
    return Scores(
        torch.tensor([[rare * 1.0, frequent * 0.2, 0.0]] * 4, dtype=torch.float64),
        torch.tensor([[rare, frequent, 0.0]] * 4, dtype=torch.float64),
        torch.full((4,), tokens),
        torch.full((4,), int(rare + frequent)),
    )


def test_both_normalisations_on_a_planted_dictionary():
    s = planted_dictionary()
    # over all tokens: frequency x effect, so the frequent weak feature outranks the rare one
    assert s.atp.tolist() == pytest.approx([0.1, 0.18, 0.0])
    firing = s.normalised("firing")
    # over its firings: the effect when present, so the rare strong feature leads
    assert firing.atp.tolist() == pytest.approx([1.0, 0.2, 0.0])
    w = torch.tensor([2.0, 0.0, 1.0, 1.0])  # a resample keeps both readings' meaning
    assert firing.resample(w)[0].tolist() == pytest.approx([1.0, 0.2, 0.0])
    assert s.resample(w)[0].tolist() == pytest.approx([0.1, 0.18, 0.0])
    assert (
        counts({3: s}, 0.15)[3]["n_causal"] == 1 and counts({3: firing}, 0.15)[3]["n_causal"] == 2
    )


def test_replicates_put_the_trainings_variance_into_the_intervals():
    """Two trainings of the wide width that disagree on how many features pass: resamples
    that draw a training per width spread over both counts; without, they cannot."""
    gen = torch.Generator().manual_seed(0)
    ref = Scores(
        torch.rand(16, 100, generator=gen, dtype=torch.float64),
        torch.ones(16, 100, dtype=torch.float64),
        torch.full((16,), 10),
        torch.full((16,), 40),
    )
    eps = calibrate(ref.atp)

    def wide(n_strong: int) -> Scores:
        atp = torch.full((16, 400), 0.001, dtype=torch.float64)
        atp[:, :n_strong] = 100 * eps * 10  # far above epsilon in every block
        return Scores(atp, torch.ones(16, 400, dtype=torch.float64), ref.tokens, ref.active)

    alone = resampled_counts({100: ref, 400: wide(5)}, 100, 98.0, 60, seed=0)
    assert set(alone["n_causal"][:, 1]) == {5.0}
    both = resampled_counts(
        {100: ref, 400: wide(5)}, 100, 98.0, 60, seed=0, replicates={400: [wide(20)]}
    )
    assert set(both["n_causal"][:, 1]) == {5.0, 20.0}
    assert (both["n_causal"][:, 0] == 2).all()  # the reference is calibrated as before


def firing_scores(sums, fired) -> Scores:
    """One block of 1,000 tokens: per feature its summed |f (g . d)| and eval firings."""
    return Scores(
        torch.tensor([sums], dtype=torch.float64),
        torch.tensor([fired], dtype=torch.float64),
        torch.tensor([1000]),
        torch.tensor([4000]),
    )


def test_a_feature_with_one_huge_firing_is_not_causal_under_the_firing_reading():
    # feature 0: one firing of effect 50; feature 1: 40 firings of mean effect 2
    s = firing_scores([50.0, 80.0, 0.0], [1, 40, 0])
    unfloored = s.normalised("firing", min_firings=1)
    assert unfloored.atp.tolist() == [50.0, 2.0, 0.0]  # scored by its single largest effect
    floored = s.normalised("firing", min_firings=20)
    assert floored.atp.tolist() == [0.0, 2.0, 0.0]
    assert floored.too_rare.tolist() == [True, False, False]
    assert not s.normalised("all", min_firings=20).too_rare.any()  # the floor is the firing's
    assert counts({3: floored}, epsilon=1.0)[3]["n_causal"] == 1
    assert counts({3: unfloored}, epsilon=1.0)[3]["n_causal"] == 2


def test_the_counts_with_and_without_the_floor_on_a_hand_made_table():
    # eight features: firings and summed effects (mean effect = sum / firings)
    fired = [1, 2, 5, 19, 20, 25, 100, 0]
    means = [9.0, 8.0, 7.0, 6.0, 0.5, 3.0, 1.5, 0.0]
    s = firing_scores([m * f for m, f in zip(means, fired, strict=True)], fired)
    without = counts({8: s.normalised("firing", 1)}, epsilon=1.0)[8]
    with_floor = counts({8: s.normalised("firing", 20)}, epsilon=1.0)[8]
    assert without["n_causal"] == 6 and without["n_too_rare"] == 0
    assert with_floor["n_causal"] == 2  # 25 firings at 3.0 and 100 at 1.5
    assert with_floor["n_too_rare"] == 4  # 1, 2, 5 and 19 firings
    assert with_floor["n_repr"] == without["n_repr"] == 7  # all that fire still count as firing
    assert with_floor["inert_fraction"] == pytest.approx(1 / 3)  # of the 3 scored, 1 is inert


def test_the_floor_applies_to_each_resample_counts():
    s = firing_scores([50.0, 80.0], [1, 40]).normalised("firing", 20)
    atp, fired = s.resample(torch.tensor([30.0]))  # the one block drawn 30 times
    assert fired.tolist() == [30.0, 1200.0]
    assert atp.tolist() == [50.0, 2.0]  # 30 firings clear the floor in this resample
