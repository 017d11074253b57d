"""The logit probes drawn in the model's width, and the headline pass that skips the head."""

from __future__ import annotations

import pytest
import torch

from causaldim.harvest.model_pass import (
    gaussian_probes,
    grads_at,
    head_probes,
    headline_at,
)
from causaldim.model.load import load_model, resolve_model


def _shifted_llama(tiny_model):
    """The tiny Llama with a large mean row in its head: the centred and uncentred probes'
    covariances W^T C W and W^T W then differ far beyond sampling error."""
    lm = load_model(resolve_model(tiny_model("llama")))
    a = torch.randn(32, generator=torch.Generator().manual_seed(3))
    lm.model.lm_head.weight.data += torch.ones(320, 1) * a[None, :]
    return lm


def _sigma(u: torch.Tensor) -> torch.Tensor:
    """mean u u^T over rows and probes, [B, T, K, d] -> [T, d, d] (per position)."""
    return torch.einsum("btki,btkj->tij", u.double(), u.double()) / (u.shape[0] * u.shape[2])


def _vocabulary_probes(lm, layer: int, ids: torch.Tensor, k: int, gen) -> tuple:
    """The probes over the vocabulary pulled back through the head (the reference)."""
    from causaldim.model.hooks import tap_blocks

    with torch.enable_grad(), tap_blocks({layer: lm.layers[layer]}, "leaf") as captured:
        logits = lm.model(input_ids=ids, use_cache=False).logits
        centred, means = gaussian_probes(logits, k, gen)
        h = captured[layer]
        uc = [torch.autograd.grad(logits, h, c, retain_graph=True)[0] for c in centred]
        us = [
            torch.autograd.grad(logits, h, m.expand_as(logits), retain_graph=True)[0] for m in means
        ]
    return torch.stack(uc, 2), torch.stack(us, 2)


def test_width_probes_give_the_vocabulary_probes_sigma_within_sampling_error(tiny_model):
    """One sequence repeated in every row: each row is an independent draw of the probes
    for the same Jacobian, so per position the rows' mean of u u^T estimates Sigma. The
    width probes' and the vocabulary probes' estimates agree within their sampling error
    (measured from the rows), centred and literal; the uncentred covariance W^T W in
    place of the centred one is far outside it."""
    lm = _shifted_llama(tiny_model)
    layer, rows, k = 1, 256, 4
    ids = torch.randint(0, 320, (1, 8), generator=torch.Generator().manual_seed(4))
    ids = ids.expand(rows, 8)
    width = grads_at(lm, (layer,), ids, k, 0, torch.Generator().manual_seed(5))[layer]
    vocab_c, vocab_s = _vocabulary_probes(lm, layer, ids, k, torch.Generator().manual_seed(6))

    def apart(x, y):  # the difference of two estimates in units of its sampling error
        a, b = _sigma(x), _sigma(y)
        halves = [_sigma(x[: rows // 2]) - _sigma(x[rows // 2 :])]
        halves.append(_sigma(y[: rows // 2]) - _sigma(y[rows // 2 :]))
        noise = sum(float(d.pow(2).sum()) for d in halves) ** 0.5 / 2  # sd of a - b
        return float((a - b).pow(2).sum()) ** 0.5 / noise

    assert apart(width.u_logits, vocab_c) < 2.0
    assert apart(width.u_logits + width.u_shift, vocab_c + vocab_s) < 2.0
    # A wrong covariance is caught: the uncentred probe's products against the centred.
    assert apart(width.u_logits + width.u_shift, vocab_c) > 10.0


def test_width_probes_have_the_centred_gram_as_covariance(tiny_model):
    lm = _shifted_llama(tiny_model)
    probes = head_probes(lm)
    w = lm.model.lm_head.weight.detach().double()
    c = torch.eye(320, dtype=torch.float64) - 1 / 320
    x, s = probes.draw(torch.Size([40_000]), torch.Generator().manual_seed(7))
    cov = x.double().T @ x.double() / len(x)
    want = w.T @ c @ w
    assert (cov - want).norm() / want.norm() < 0.03
    assert (cov - w.T @ w).norm() / want.norm() > 1.0  # the uncentred Gram is far off
    ones = w.sum(0)
    cov_s = s.double().T @ s.double() / len(s)
    assert (cov_s - torch.outer(ones, ones) / 320).norm() / ones.pow(2).sum() * 320 < 0.05
    cross = x.double().T @ s.double() / len(x)  # independent parts
    assert cross.norm() / (want.norm() * float(ones.norm()) / 320**0.5) < 0.03


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_headline_pass_gives_the_full_pass_logit_products(tiny_model, family):
    """Same probes, same Jacobian: the head-free pass equals the full pass's centred logit
    products (no Fisher probe, which would draw from the generator first)."""
    lm = load_model(resolve_model(tiny_model(family)))
    ids = torch.randint(0, 320, (3, 12), generator=torch.Generator().manual_seed(8))
    probes = head_probes(lm)
    full = grads_at(lm, (1, 2), ids, 2, 0, torch.Generator().manual_seed(9), probes)
    head_free = headline_at(lm, (1, 2), ids, 2, probes, torch.Generator().manual_seed(9))
    for layer in (1, 2):
        a, b = full[layer], head_free[layer]
        assert torch.equal(a.h, b.h)
        assert b.g is None and b.u_fisher is None and b.u_shift is None  # the headline's alone
        x, y = a.u_logits, b.u_logits
        assert torch.allclose(x, y, rtol=1e-4, atol=1e-5 * float(x.abs().max()))
        assert float(x.abs().max()) > 0


def test_a_soft_capped_head_keeps_the_vocabulary_probes(tiny_model):
    """Gemma 2 soft-caps its logits after the head: no width probes for it."""
    lm = load_model(resolve_model(tiny_model("gemma2")))
    assert lm.model.config.final_logit_softcapping
    assert head_probes(lm) is None
    assert head_probes(load_model(resolve_model(tiny_model("llama")))) is not None
