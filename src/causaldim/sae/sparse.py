"""The sparse training step every architecture shares.

A step's only dense work is the encoder product pre = (x - b_dec) W_enc + b_enc. Each
architecture keeps a few entries per token from it (TopK the k largest; ReLU the positive
ones; JumpReLU those above its threshold and those within the straight-through window
below it) as flat (value, feature, token) triples. The decoder is an embedding_bag over
those entries, and the encoder's backward touches only them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

PRE_CHUNK_ELEMENTS = 1 << 25  # pre-activations computed at once: 128 MB in float32


class StepInputs(NamedTuple):
    """What a training step gives the architecture beside the batch; each architecture
    uses what its step needs."""

    dtype: torch.dtype = torch.float32  # of the dense encoder product
    sparsity_coef: float = 0.0  # the L0 controller's coefficient (threshold SAEs)
    dead: torch.Tensor | None = None  # features silent for too long (TopK's AuxK)
    aux_k: int = 256  # AuxK: dead features that try to reconstruct the residual
    aux_coef: float = 1 / 32  # AuxK's weight


DEFAULT_STEP = StepInputs()


class TrainOutput(NamedTuple):
    x_hat: torch.Tensor
    vals: torch.Tensor  # kept activations, flat or [tokens, k] (0 where not firing)
    idx: torch.Tensor  # their features, same shape
    side_loss: torch.Tensor  # weighted: TopK's AuxK loss; threshold SAEs' sparsity penalty


def pre_act_blocks(x, b_dec, W_enc, b_enc, dtype):
    """x - b_dec, and pre in `dtype` a block of tokens at a time, so that the
    [tokens, width] pre-activations never exist whole (2 GB at B=4096, W=131072).
    Yields (first token, block of pre)."""
    xc = x - b_dec
    W, b = W_enc.to(dtype), b_enc.to(dtype)
    rows = max(1, PRE_CHUNK_ELEMENTS // W.shape[1])

    def blocks():
        for start in range(0, len(xc), rows):
            yield start, torch.addmm(b, xc[start : start + rows].to(dtype), W)

    return xc, blocks()


def encoder_backward(xc, W_enc, idx, token, grad, n_tokens):
    """Gradients of (b_dec, W_enc, b_enc) from grad of the kept pre-activations
    pre[token, idx] only (flat tensors)."""
    width = W_enc.shape[1]
    grad_b_enc = grad.new_zeros(width).index_add_(0, idx, grad)
    # dL/dW_enc^T[i] = sum over the entries that kept feature i of grad * xc[token]:
    # exactly the weight gradient of an embedding_bag (bags = tokens, per-sample weights
    # grad, output gradient xc). Its backward kernel computes that without materialising
    # [entries, d] products; called directly, it also skips the forward autograd needs.
    grad_W_enc_t = torch.ops.aten._embedding_bag_dense_backward(
        xc,
        idx,
        token,  # offset2bag: each entry's bag
        torch.bincount(token, minlength=n_tokens),  # bag sizes
        idx.new_empty(0),  # maximum indices: only for mode "max"
        width,
        False,  # scale_grad_by_freq
        0,  # mode "sum"
        grad,
        -1,  # no padding index
    )
    grad_b_dec = -(W_enc @ grad_b_enc)  # x - b_dec enters every pre-activation
    return grad_b_dec, grad_W_enc_t.T, grad_b_enc


class _KeepAbove(torch.autograd.Function):
    """(x, b_dec, W_enc, b_enc, cut) -> flat (pre, feature, token) of the entries with
    pre > cut (cut per feature, or a scalar), token-major; gradients only through them."""

    @staticmethod
    def forward(ctx, x, b_dec, W_enc, b_enc, cut, dtype):
        xc, blocks = pre_act_blocks(x, b_dec, W_enc, b_enc, dtype)
        kept = []
        for start, pre in blocks:
            t, i = (pre > cut.to(dtype)).nonzero(as_tuple=True)
            kept.append((pre[t, i].float(), i, t + start))
        vals, idx, token = (torch.cat(parts) for parts in zip(*kept, strict=True))
        ctx.save_for_backward(xc, W_enc, idx, token)
        ctx.mark_non_differentiable(idx, token)
        return vals, idx, token

    @staticmethod
    def backward(ctx, grad_vals, _grad_idx, _grad_token):
        xc, W_enc, idx, token = ctx.saved_tensors
        grads = encoder_backward(xc, W_enc, idx, token, grad_vals, len(xc))
        return None, *grads, None, None


def keep_above(sae, x: torch.Tensor, cut: torch.Tensor, dtype: torch.dtype):
    """The entries of sae's pre-activations above cut, as flat (pre, feature, token)."""
    return _KeepAbove.apply(x, sae.b_dec, sae.W_enc, sae.b_enc, cut.detach(), dtype)


def decode_entries(
    sae, vals: torch.Tensor, idx: torch.Tensor, token: torch.Tensor, n_tokens: int
) -> torch.Tensor:
    """x_hat from flat token-major entries (tokens without any decode to b_dec)."""
    counts = torch.bincount(token, minlength=n_tokens)
    offsets = counts.cumsum(0) - counts
    out = F.embedding_bag(idx, sae.W_dec, offsets, mode="sum", per_sample_weights=vals)
    return out + sae.b_dec


def threshold_train_forward(
    sae,
    x: torch.Tensor,
    cut: torch.Tensor,
    activate: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    penalty: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    step: StepInputs,
) -> TrainOutput:
    """The sparse step of an SAE whose features fire above a per-feature bar: keep the
    entries above `cut`, f = activate(pre, feature) on them, and the summed penalty(pre,
    f, feature) per token, weighted by the controller's coefficient."""
    pre, idx, token = keep_above(sae, x, cut, step.dtype)
    f = activate(pre, idx)
    x_hat = decode_entries(sae, f, idx, token, len(x))
    return TrainOutput(x_hat, f, idx, step.sparsity_coef * (penalty(pre, f, idx).sum() / len(x)))
