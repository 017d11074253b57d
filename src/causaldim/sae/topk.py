"""TopK SAE (Gao et al. 2024): keep the k largest pre-activations per token.

Training uses a fused, sparse step: the encoder product is the only dense work (optionally
in bf16); the decoder is an embedding_bag over the k selected rows, and the encoder's
backward touches only the selected (token, feature) pairs. `activate`/`decode` remain the
simple dense definition, which tests hold the fused step to.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from .base import SAE

PRE_CHUNK_ELEMENTS = 1 << 23  # pre-activations computed at once: 32 MB in float32


class _SelectTopK(torch.autograd.Function):
    """(x, b_dec, W_enc, b_enc) -> the k largest pre-activations per token (ReLU'd) and
    their indices, and optionally the k_aux largest among dead features (AuxK).
    pre = (x - b_dec) W_enc + b_enc is computed densely in `dtype`, a block of tokens at
    a time, so the [tokens, width] pre-activations never exist whole (2 GB at B=4096,
    W=131072) and each block is still in cache when top-k reads it. The backward gives
    gradients only through the selected entries, in float32."""

    @staticmethod
    def forward(ctx, x, b_dec, W_enc, b_enc, k, dead, k_aux, dtype):
        xc = x - b_dec
        W, b = W_enc.to(dtype), b_enc.to(dtype)
        k_aux = min(k_aux, int(dead.sum())) if dead is not None else 0
        picked = []
        for block in xc.to(dtype).split(max(1, PRE_CHUNK_ELEMENTS // W.shape[1])):
            pre = torch.addmm(b, block, W)
            picked.append(pre.topk(k, dim=-1, sorted=False))
            if k_aux:  # fewer dead features than k_aux picks some -inf: clamped to 0 below
                picked[-1] += pre.masked_fill_(~dead, float("-inf")).topk(k_aux, sorted=False)
        vals, idx = torch.cat([p[0] for p in picked]), torch.cat([p[1] for p in picked])
        if k_aux:
            aux_vals = torch.cat([p[2] for p in picked]).float().clamp_min(0)
            aux_idx = torch.cat([p[3] for p in picked])
        else:
            aux_vals, aux_idx = x.new_zeros(len(x), 0), idx.new_zeros(len(x), 0)
        vals = vals.float().relu()
        ctx.save_for_backward(xc, W_enc, idx, vals, aux_idx, aux_vals)
        ctx.mark_non_differentiable(idx, aux_idx)
        return vals, idx, aux_vals, aux_idx

    @staticmethod
    def backward(ctx, grad_vals, _grad_idx, grad_aux, _grad_aux_idx):
        xc, W_enc, idx, vals, aux_idx, aux_vals = ctx.saved_tensors
        grad_pre = grad_vals * (vals > 0)  # ReLU after the selection
        idx_all = idx
        if aux_idx.shape[1]:
            grad_pre = torch.cat([grad_pre, grad_aux * (aux_vals > 0)], 1)
            idx_all = torch.cat([idx, aux_idx], 1)
        width = W_enc.shape[1]
        grad_b_enc = grad_pre.new_zeros(width).index_add_(0, idx_all.flatten(), grad_pre.flatten())
        # dL/dW_enc^T[i] = sum over the (token, slot) pairs that selected i of
        # grad_pre * xc: exactly the weight gradient of an embedding_bag (bags = tokens,
        # per-sample weights grad_pre, output gradient xc). Its backward kernel computes
        # that without materialising the [tokens, k, d] products; called directly, it
        # also skips the forward an autograd call would need.
        tokens, slots = idx_all.shape
        grad_W_enc_t = torch.ops.aten._embedding_bag_dense_backward(
            xc,
            idx_all.flatten(),
            torch.arange(tokens, device=xc.device).repeat_interleave(slots),  # offset2bag
            torch.full((tokens,), slots, device=xc.device),  # bag sizes
            idx_all.new_empty(0),  # maximum indices: only for mode "max"
            width,
            False,  # scale_grad_by_freq
            0,  # mode "sum"
            grad_pre.flatten(),
            -1,  # no padding index
        )
        grad_b_dec = -(W_enc @ grad_b_enc)  # x - b_dec enters every pre-activation
        return None, grad_b_dec, grad_W_enc_t.T, grad_b_enc, None, None, None, None


class TrainOutput(NamedTuple):
    x_hat: torch.Tensor
    vals: torch.Tensor  # [tokens, k] selected activations (0 where ReLU cut them)
    idx: torch.Tensor  # [tokens, k] their features
    aux_loss: torch.Tensor  # AuxK loss (0 without dead features)


class TopKSAE(SAE):
    architecture = "topk"

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        vals, idx = pre.topk(self.cfg.k, dim=-1)
        return torch.zeros_like(pre).scatter_(-1, idx, vals.relu())

    def train_forward(
        self,
        x: torch.Tensor,
        dead: torch.Tensor | None = None,
        k_aux: int = 256,
        dtype: torch.dtype = torch.float32,
    ) -> TrainOutput:
        """The fused training forward: reconstruction and, with dead features, the AuxK
        loss (dead features try to reconstruct what the live ones missed)."""
        vals, idx, aux_vals, aux_idx = _SelectTopK.apply(
            x, self.b_dec, self.W_enc, self.b_enc, self.cfg.k, dead, k_aux, dtype
        )
        x_hat = F.embedding_bag(idx, self.W_dec, per_sample_weights=vals, mode="sum") + self.b_dec
        aux = x.new_zeros(())
        if aux_idx.shape[1]:
            residual = (x - x_hat).detach()
            e_hat = F.embedding_bag(aux_idx, self.W_dec, per_sample_weights=aux_vals, mode="sum")
            denom = (residual - residual.mean(0)).pow(2).sum().clamp_min(1e-12)
            aux = (e_hat - residual).pow(2).sum() / denom
        return TrainOutput(x_hat, vals, idx, aux)
