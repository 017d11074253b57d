"""What the weights predict of kappa: norm gains read whatever their convention, the
norms that read the residual, and the eranks built from them."""

from __future__ import annotations

import pytest
import torch

from causaldim.measures.debias import erank_of
from causaldim.measures.weights import final_norm, gains, predictors, residual_norms
from causaldim.model.load import load_model, resolve_model


@pytest.mark.parametrize("family, offset", [("llama", 0.0), ("gemma3", 1.0)])
def test_gains_are_read_whatever_the_norms_convention(tiny_model, family, offset):
    lm = load_model(resolve_model(tiny_model(family)))
    norm = lm.layers[0].input_layernorm
    w = torch.linspace(-0.5, 3.0, norm.weight.numel())
    norm.weight.data.copy_(w)
    assert torch.allclose(gains(norm, len(w)), (w + offset).double(), rtol=1e-4)


def test_the_norms_that_read_the_residual(tiny_model):
    gemma = load_model(resolve_model(tiny_model("gemma3"))).layers[0]
    assert residual_norms(gemma) == [gemma.input_layernorm, gemma.pre_feedforward_layernorm]
    llama = load_model(resolve_model(tiny_model("llama"))).layers[0]
    assert residual_norms(llama) == [llama.input_layernorm, llama.post_attention_layernorm]


def test_predictors_follow_the_gains(tiny_model):
    lm = load_model(resolve_model(tiny_model("llama")))
    flat = predictors(lm)
    d = flat["d_model"]
    # random-init gains are all one: the gained head is the head, later gains are flat
    assert flat["unembedding_gained"] == pytest.approx(flat["unembedding"], rel=1e-6)
    assert all(v["later_gains"] == pytest.approx(d) for v in flat["layers"].values())
    g = torch.ones(d)
    g[:4] = 30.0  # four loud dimensions, as Gemma 3's final gains
    final_norm(lm).weight.data.copy_(g)
    loud = predictors(lm)
    assert loud["unembedding_gained"] < 0.5 * flat["unembedding_gained"]
    last = str(len(lm.layers) - 1)
    assert loud["layers"][last]["later_gains"] == pytest.approx(erank_of(g.double() ** 2))
    # earlier layers add the flat gains of the blocks after them: flatter, higher
    assert loud["layers"]["0"]["later_gains"] > loud["layers"][last]["later_gains"]
    assert loud["final_gains_range"] == pytest.approx([1.0, 30.0])


def test_equal_gains_predict_nothing_and_a_follower_correlates():
    from causaldim.report.metric import log_correlation

    flat = [
        {"raw": r, "act": None, "later_gains": 1.0 + 1e-9 * i}
        for i, r in enumerate((0.5, 0.7, 0.9))
    ]
    assert log_correlation(flat, "raw") is None  # an initialised model: rounding, not gains
    follows = [{"raw": 0.1 * g, "act": None, "later_gains": g} for g in (0.2, 0.4, 0.8)]
    assert log_correlation(follows, "raw") == pytest.approx(1.0)
