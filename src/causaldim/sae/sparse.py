"""The sparse training step every architecture shares.

A step's only dense work is the encoder product pre = (x - b_dec) W_enc + b_enc. Each
architecture keeps a few entries per token from it (TopK the k largest; ReLU the positive
ones; JumpReLU those above its threshold and those within the straight-through window
below it) as flat (value, feature, token) triples. The decoder is an embedding_bag over
those entries, and the encoder's backward touches only them.

The two weight matrices' gradients live only on the rows of features some entry names.
With StepInputs.sparse_grads they are given as such (sparse COO tensors of those rows),
never as dense [width, d] tensors: the lean optimiser (optim.py) takes them so, which is
what lets an SAE of a million features train beside its weights and moments alone.
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
    sparse_grads: bool = False  # W_enc_t's and W_dec's gradients as sparse rows (optim.py)


DEFAULT_STEP = StepInputs()


class TrainOutput(NamedTuple):
    x_hat: torch.Tensor
    vals: torch.Tensor  # kept activations, flat or [tokens, k] (0 where not firing)
    idx: torch.Tensor  # their features, same shape
    side_loss: torch.Tensor  # weighted: TopK's AuxK loss; threshold SAEs' sparsity penalty


def pre_act_blocks(x, b_dec, W_enc_t, b_enc, dtype):
    """x - b_dec, and pre in `dtype` a block of tokens at a time, so that the
    [tokens, width] pre-activations never exist whole (2 GB at B=4096, W=131072).
    Yields (first token, block of pre)."""
    xc = x - b_dec
    W, b = W_enc_t.T.to(dtype), b_enc.to(dtype)
    rows = max(1, PRE_CHUNK_ELEMENTS // W.shape[1])

    def blocks():
        for start in range(0, len(xc), rows):
            yield start, torch.addmm(b, xc[start : start + rows].to(dtype), W)

    return xc, blocks()


def row_gradient(out_grad, idx, token, weights, n_rows: int, sparse: bool) -> torch.Tensor:
    """The gradient of a [n_rows, d] matrix whose row idx[e] entered token token[e]'s
    output with weight weights[e] (flat entries): row i gets the sum over its entries of
    weights[e] * out_grad[token[e]]. Dense, or (sparse) a coalesced sparse COO tensor of
    the rows some entry names.

    That is the weight gradient of an embedding_bag (bags = tokens, per-sample weights);
    its backward kernel sums without materialising [entries, d] products, and called
    directly it skips the forward autograd would need."""
    rows, local = torch.unique(idx, return_inverse=True) if sparse else (None, idx)
    summed = torch.ops.aten._embedding_bag_dense_backward(
        out_grad,
        local,
        token,  # offset2bag: each entry's bag
        torch.bincount(token, minlength=len(out_grad)),  # bag sizes
        idx.new_empty(0),  # maximum indices: only for mode "max"
        n_rows if rows is None else len(rows),
        False,  # scale_grad_by_freq
        0,  # mode "sum"
        weights,
        -1,  # no padding index
    )
    if rows is None:
        return summed
    shape = (n_rows, out_grad.shape[1])
    return torch.sparse_coo_tensor(
        rows[None], summed, shape, is_coalesced=True, check_invariants=False
    )


def encoder_backward(xc, W_enc_t, idx, token, grad, sparse: bool):
    """Gradients of (b_dec, W_enc_t, b_enc) from grad of the kept pre-activations
    pre[token, idx] only (flat tensors)."""
    grad_b_enc = grad.new_zeros(len(W_enc_t)).index_add_(0, idx, grad)
    grad_W_enc_t = row_gradient(xc, idx, token, grad, len(W_enc_t), sparse)
    grad_b_dec = -(grad_b_enc @ W_enc_t)  # x - b_dec enters every pre-activation
    return grad_b_dec, grad_W_enc_t, grad_b_enc


class _KeepAbove(torch.autograd.Function):
    """(x, b_dec, W_enc_t, b_enc, cut) -> flat (pre, feature, token) of the entries with
    pre > cut (cut per feature, or a scalar), token-major; gradients only through them."""

    @staticmethod
    def forward(ctx, x, b_dec, W_enc_t, b_enc, cut, dtype, sparse):
        xc, blocks = pre_act_blocks(x, b_dec, W_enc_t, b_enc, dtype)
        kept = []
        for start, pre in blocks:
            t, i = (pre > cut.to(dtype)).nonzero(as_tuple=True)
            kept.append((pre[t, i].float(), i, t + start))
        vals, idx, token = (torch.cat(parts) for parts in zip(*kept, strict=True))
        ctx.save_for_backward(xc, W_enc_t, idx, token)
        ctx.mark_non_differentiable(idx, token)
        ctx.sparse = sparse
        return vals, idx, token

    @staticmethod
    def backward(ctx, grad_vals, _grad_idx, _grad_token):
        xc, W_enc_t, idx, token = ctx.saved_tensors
        grads = encoder_backward(xc, W_enc_t, idx, token, grad_vals, ctx.sparse)
        return None, *grads, None, None, None


def keep_above(sae, x: torch.Tensor, cut: torch.Tensor, step: StepInputs):
    """The entries of sae's pre-activations above cut, as flat (pre, feature, token)."""
    return _KeepAbove.apply(
        x, sae.b_dec, sae.W_enc_t, sae.b_enc, cut.detach(), step.dtype, step.sparse_grads
    )


class _Decode(torch.autograd.Function):
    """(vals, W_dec, idx, token) -> sum over each token's entries of vals * W_dec[idx]
    (flat, token-major entries); W_dec's gradient on the named rows only."""

    @staticmethod
    def forward(ctx, vals, W_dec, idx, token, n_tokens, sparse):
        counts = torch.bincount(token, minlength=n_tokens)
        offsets = counts.cumsum(0) - counts
        out = F.embedding_bag(idx, W_dec, offsets, mode="sum", per_sample_weights=vals)
        ctx.save_for_backward(vals, W_dec, idx, token, offsets)
        ctx.sparse = sparse
        return out

    @staticmethod
    def backward(ctx, grad):
        vals, W_dec, idx, token, offsets = ctx.saved_tensors
        grad_vals = grad_W = None
        if ctx.needs_input_grad[0]:
            grad_vals = torch.ops.aten._embedding_bag_per_sample_weights_backward(
                grad, W_dec, idx, offsets, token, 0, -1
            )
        if ctx.needs_input_grad[1]:
            grad_W = row_gradient(grad, idx, token, vals, len(W_dec), ctx.sparse)
        return grad_vals, grad_W, None, None, None, None


def decode_entries(
    sae, vals: torch.Tensor, idx: torch.Tensor, token: torch.Tensor, n_tokens: int, sparse: bool
) -> torch.Tensor:
    """x_hat - b_dec from flat token-major entries (0 for tokens without any)."""
    return _Decode.apply(vals, sae.W_dec, idx, token, n_tokens, sparse)


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
    pre, idx, token = keep_above(sae, x, cut, step)
    f = activate(pre, idx)
    x_hat = decode_entries(sae, f, idx, token, len(x), step.sparse_grads) + sae.b_dec
    return TrainOutput(x_hat, f, idx, step.sparsity_coef * (penalty(pre, f, idx).sum() / len(x)))
