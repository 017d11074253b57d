"""The fused sparse TopK training step against the simple dense definition."""

from __future__ import annotations

import pytest
import torch

from causaldim.sae import SAEConfig, build, topk


def reference_loss(sae, x, dead, k_aux, aux_coef):
    """The dense definition: scatter the top k into a full feature vector, decode with a
    matmul; AuxK the same way over the dead features."""
    pre = sae.pre_acts(x)
    x_hat = sae.decode(sae.activate(pre))
    loss = (x_hat - x).pow(2).sum(-1).mean()
    if dead is not None:
        masked = pre.masked_fill(~dead, float("-inf"))
        vals, idx = masked.topk(min(k_aux, int(dead.sum())), dim=-1)
        f_aux = torch.zeros_like(pre).scatter_(-1, idx, vals.relu())
        residual = (x - x_hat).detach()
        e_hat = f_aux @ sae.W_dec
        denom = (residual - residual.mean(0)).pow(2).sum()
        loss = loss + aux_coef * (e_hat - residual).pow(2).sum() / denom
    return loss


def fused_loss(sae, x, dead, k_aux, aux_coef, dtype=torch.float32):
    out = sae.train_forward(x, dead, k_aux, dtype)
    return (out.x_hat - x).pow(2).sum(-1).mean() + aux_coef * out.aux_loss


def grads(sae, loss):
    sae.zero_grad(set_to_none=True)
    loss.backward()
    return {name: p.grad.clone() for name, p in sae.named_parameters()}


@pytest.mark.parametrize("with_dead", [False, True])
@pytest.mark.parametrize("block_tokens", [None, 128])
def test_fused_step_equals_the_dense_definition(with_dead, block_tokens, monkeypatch):
    if block_tokens:  # the pre-activations in several blocks of tokens, the last one short
        monkeypatch.setattr(topk, "PRE_CHUNK_ELEMENTS", 96 * block_tokens)
    torch.manual_seed(0)
    sae = build(SAEConfig("topk", 24, 96, k=5))
    sae.reset(torch.Generator().manual_seed(0))
    with torch.no_grad():  # not at the symmetric start: random biases, encoder off W_dec^T
        sae.b_enc.normal_(0, 0.3)
        sae.b_dec.normal_(0, 0.3)
        sae.W_enc.add_(0.1 * torch.randn_like(sae.W_enc))
    x = torch.randn(700, 24)
    dead = (torch.arange(96) % 3 == 0) if with_dead else None
    ref = reference_loss(sae, x, dead, 8, 1 / 32)
    fast = fused_loss(sae, x, dead, 8, 1 / 32)
    assert fast.item() == pytest.approx(ref.item(), rel=1e-5)
    g_ref, g_fast = grads(sae, ref), grads(sae, fused_loss(sae, x, dead, 8, 1 / 32))
    for name in g_ref:
        err = (g_fast[name] - g_ref[name]).norm() / g_ref[name].norm()
        assert err < 1e-5, name


def test_bf16_encoder_stays_close_to_float32():
    torch.manual_seed(1)
    sae = build(SAEConfig("topk", 64, 512, k=8))
    sae.reset(torch.Generator().manual_seed(1))
    x = torch.randn(256, 64)
    ref = fused_loss(sae, x, None, 8, 0.0)
    low = fused_loss(sae, x, None, 8, 0.0, torch.bfloat16)
    assert low.item() == pytest.approx(ref.item(), rel=0.02)
    assert all(p.dtype == torch.float32 for p in sae.parameters())
