"""Which directions matter, by intervention: keeping every direction changes nothing,
keeping none is mean-ablating the layer, and the activation-weighted projection is
Cov-orthogonal."""

from __future__ import annotations

import pytest
import torch

from causaldim.config import AnalysisConfig
from causaldim.harvest import harvest
from causaldim.measures.kappa import measure
from causaldim.measures.ladder import keep_top, ladder, ladder_of, rankings, smallest_within
from causaldim.measures.sweep import splice_evaluation
from causaldim.model.load import load_model, resolve_model


@pytest.fixture(scope="module")
def laddered(tmp_path_factory, tiny_harvest):
    cfg = tiny_harvest(tmp_path_factory.mktemp("ladder") / "run", layer=1)
    store = harvest(cfg, progress=False).store
    lm = load_model(resolve_model(cfg.model))
    est = measure(store, AnalysisConfig(blocks=4), readings=("logits", "activations"))["logits"]
    return lm, store, est, ladder(lm, store, est, n_sequences=4, seed=0)


def test_keeping_every_direction_changes_nothing(laddered):
    *_, found = laddered
    assert found["k"][-1] == 32 and found["k"][0] == 0
    for name, curve in found["rankings"].items():
        assert curve["kl"][-1] < 1e-6, name
        assert abs(curve["loss_change"][-1]) < 1e-5, name


def test_keeping_none_is_mean_ablating_the_layer(laddered):
    lm, store, _, found = laddered
    seqs = store.token_ids("train", 4)
    ce = splice_evaluation(lm, store, seqs, {})
    assert found["clean_loss"] == pytest.approx(ce["clean_loss"], rel=1e-5)
    assert found["n_predictions"] == ce["n_predictions"]
    for curve in found["rankings"].values():
        ablated = found["clean_loss"] + curve["loss_change"][0]
        assert ablated == pytest.approx(ce["mean_ablated_loss"], rel=1e-5)
        assert curve["kl"][0] > 10 * curve["kl"][-1] + 1e-3  # ablating moves the output


def test_the_activation_weighted_projection_is_cov_orthogonal():
    gen = torch.Generator().manual_seed(0)
    d = 12
    a = torch.randn(d, d, generator=gen, dtype=torch.float64)
    cov = a @ a.T + 0.1 * torch.eye(d, dtype=torch.float64)
    b = torch.randn(d, d, generator=gen, dtype=torch.float64)
    sigma = b @ b.T
    r = rankings(sigma, cov, seed=0)["act"]
    eye = torch.eye(d, dtype=torch.float64)
    for k in (1, 4, 11):
        p = r.basis[:, :k] @ r.dual[:, :k].T
        assert torch.allclose(p @ p, p, atol=1e-9)  # a projection
        # what is kept and what is ablated are uncorrelated under the activations' law
        assert torch.allclose(
            p @ cov @ (eye - p).T, torch.zeros(d, d, dtype=torch.float64), atol=1e-9
        )
    # keep_top applies the same projection to rows of h around the mean
    mu = torch.randn(d, generator=gen, dtype=torch.float64)
    h = torch.randn(5, d, generator=gen, dtype=torch.float64)
    p = r.basis[:, :4] @ r.dual[:, :4].T
    expected = mu + (h - mu) @ p.T
    assert torch.allclose(keep_top(r, 4, mu)(h.float()).double(), expected, atol=1e-4)


def test_the_smallest_k_within_a_bar_holds_from_there_on():
    ks = [0, 8, 16, 32]
    assert ladder_of(32) == ks and ladder_of(576)[-2:] == [512, 576]
    assert smallest_within(ks, [2.0, 0.04, 0.06, 0.0], 0.05) == 32  # 16 breaks the bar
    assert smallest_within(ks, [2.0, 0.04, 0.03, 0.0], 0.05) == 8
    assert smallest_within(ks, [2.0, 1.0, 0.5, 0.2], 0.05) is None
