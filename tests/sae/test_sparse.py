"""The sparse training step of every architecture against the simple dense definition:
same loss, same gradients (encoder, decoder, biases, thresholds) as the optimiser gets
them (decoder gradients along their unit rows dropped), dense or as sparse rows."""

from __future__ import annotations

import pytest
import torch

from causaldim.sae import SAEConfig, build, sparse
from causaldim.sae.jumprelu import _Step

D, WIDTH = 24, 96


def dense_topk_loss(sae, x, dead, k_aux, aux_coef):
    """Scatter the top k into a full feature vector, decode with a matmul; AuxK the same
    way over the dead features."""
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


def dense_threshold_loss(sae, x, coef):
    """f over all [tokens, width] pre-activations; ReLU's penalty is L1 weighted by the
    decoder row norms, JumpReLU's the straight-through L0."""
    pre = sae.pre_acts(x)
    f = sae.activate(pre)
    mse = (sae.decode(f) - x).pow(2).sum(-1).mean()
    if sae.architecture == "relu":
        penalty = (f * sae.W_dec.norm(dim=1)).sum(-1)
    else:
        penalty = _Step.apply(pre, sae.threshold, sae.cfg.bandwidth).sum(-1)
    return mse + coef * penalty.mean()


def sparse_loss(sae, x, coef=0.1, dead=None, k_aux=8, dtype=torch.float32, rows=False):
    """Every architecture's step through the one signature; coef weighs its side loss
    (TopK's AuxK, the threshold SAEs' sparsity penalty); rows: sparse row gradients."""
    step = sparse.StepInputs(dtype, coef, dead, k_aux, coef, sparse_grads=rows)
    out = sae.train_forward(x, step)
    return (out.x_hat - x).pow(2).sum(-1).mean() + out.side_loss


def grads(sae, loss):
    """The gradients the optimiser is given (dense, whichever way they came)."""
    sae.zero_grad(set_to_none=True)
    loss.backward()
    sae.remove_parallel_grad()
    return {
        name: (p.grad.to_dense() if p.grad.is_sparse else p.grad).clone()
        for name, p in sae.named_parameters()
    }


def off_the_symmetric_start(arch: str, seed: int = 0):
    torch.manual_seed(seed)
    sae = build(SAEConfig(arch, D, WIDTH, k=5 if arch == "topk" else None, bandwidth=0.2))
    sae.reset(torch.Generator().manual_seed(seed))
    with torch.no_grad():  # random biases, encoder off W_dec^T, thresholds spread
        sae.b_enc.normal_(0, 0.3)
        sae.b_dec.normal_(0, 0.3)
        sae.W_enc.add_(0.1 * torch.randn_like(sae.W_enc))
        if arch == "relu":
            sae.b_enc.sub_(0.5)
        if arch == "jumprelu":
            sae.log_threshold.copy_(torch.empty(WIDTH).uniform_(-1.5, 0.5))
    return sae


def assert_same_loss_and_grads(sae, dense, fast):
    assert fast().item() == pytest.approx(dense().item(), rel=1e-5)
    g_dense, g_fast = grads(sae, dense()), grads(sae, fast())
    assert g_dense.keys() == g_fast.keys()
    for name in g_dense:
        assert g_dense[name].norm() > 0, name  # every parameter is really exercised
        err = (g_fast[name] - g_dense[name]).norm() / g_dense[name].norm()
        assert err < 1e-5, name


@pytest.fixture(params=[None, 128], ids=["one block", "blocks of 128 tokens"])
def blocks(request, monkeypatch):
    """The pre-activations whole, or in several blocks of tokens with the last one short."""
    if request.param:
        monkeypatch.setattr(sparse, "PRE_CHUNK_ELEMENTS", WIDTH * request.param)


rows = pytest.mark.parametrize("rows", [False, True], ids=["dense grads", "row grads"])


@rows
@pytest.mark.parametrize("with_dead", [False, True])
def test_topk_step_equals_the_dense_definition(with_dead, rows, blocks):
    sae = off_the_symmetric_start("topk")
    x = torch.randn(700, D)
    dead = (torch.arange(WIDTH) % 3 == 0) if with_dead else None
    assert_same_loss_and_grads(
        sae,
        lambda: dense_topk_loss(sae, x, dead, 8, 1 / 32),
        lambda: sparse_loss(sae, x, 1 / 32, dead, 8, rows=rows),
    )


@rows
@pytest.mark.parametrize("arch", ["relu", "jumprelu"])
def test_threshold_step_equals_the_dense_definition(arch, rows, blocks):
    sae = off_the_symmetric_start(arch)
    x = torch.randn(700, D)
    with torch.no_grad():
        l0 = float((sae.encode(x) > 0).sum(-1).float().mean())
    assert 2 < l0 < WIDTH / 2  # sparse, and not empty: the comparison means something
    assert_same_loss_and_grads(
        sae,
        lambda: dense_threshold_loss(sae, x, 0.1),
        lambda: sparse_loss(sae, x, 0.1, rows=rows),
    )


@pytest.mark.parametrize("arch", ["topk", "relu", "jumprelu"])
def test_row_gradients_hold_only_the_rows_a_step_named(arch):
    """No dense [width, d] gradient: the matrices' gradients are sparse, with exactly the
    features that fired (and, for JumpReLU, those in the window below the bar)."""
    sae = off_the_symmetric_start(arch)
    x = torch.randn(6, D)  # few tokens: most features go unnamed
    sae.zero_grad(set_to_none=True)
    out = sae.train_forward(x, sparse.StepInputs(sparsity_coef=0.1, sparse_grads=True))
    ((out.x_hat - x).pow(2).sum() + out.side_loss).backward()
    named = torch.unique(out.idx[out.vals != 0])
    for p in (sae.W_enc_t, sae.W_dec):
        assert p.grad.is_sparse
        rows = p.grad.coalesce().indices()[0]
        assert len(rows) < WIDTH
        assert set(named.tolist()) <= set(rows.tolist())


def test_tokens_without_any_active_feature_decode_to_b_dec():
    sae = off_the_symmetric_start("relu")
    with torch.no_grad():
        sae.b_enc.fill_(-1e3)  # nothing fires
    x = torch.randn(10, D)
    out = sae.train_forward(x)
    assert len(out.idx) == 0
    assert torch.equal(out.x_hat, sae.b_dec.expand(10, D))


@pytest.mark.parametrize("arch", ["topk", "relu", "jumprelu"])
def test_bf16_encoder_stays_close_to_float32(arch):
    sae = off_the_symmetric_start(arch, seed=1)
    x = torch.randn(256, D)
    ref = sparse_loss(sae, x, 0.0)
    low = sparse_loss(sae, x, 0.0, dtype=torch.bfloat16)
    assert low.item() == pytest.approx(ref.item(), rel=0.02)
    assert all(p.dtype == torch.float32 for p in sae.parameters())


@pytest.mark.parametrize("arch", ["relu", "jumprelu"])
def test_starting_bars_block_by_block_equal_those_of_the_whole(arch, monkeypatch):
    from causaldim.sae import base

    sae = off_the_symmetric_start(arch)
    x = torch.randn(300, D)
    whole = sae.pre_acts(x).quantile(1 - 5 / WIDTH, dim=0)
    monkeypatch.setattr(base, "CUT_BLOCK_ELEMENTS", 300 * 7)  # blocks of 7 features
    torch.testing.assert_close(sae.firing_cut(x, 5.0), whole, rtol=1e-6, atol=1e-6)
