"""TopK SAE (Gao et al. 2024): keep the k largest pre-activations per token.

Training uses the sparse step (`sparse.py`): the encoder product is the only dense work
(optionally in bf16); the decoder is an embedding_bag over the k selected rows, and the
encoder's backward touches only the selected (token, feature) pairs. `activate`/`decode`
remain the simple dense definition, which tests hold the sparse step to.
"""

from __future__ import annotations

import torch

from .base import SAE
from .sparse import (
    DEFAULT_STEP,
    StepInputs,
    TrainOutput,
    decode_entries,
    encoder_backward,
    pre_act_blocks,
)


class _SelectTopK(torch.autograd.Function):
    """(x, b_dec, W_enc, b_enc) -> the k largest pre-activations per token (ReLU'd) and
    their indices, and optionally the k_aux largest among dead features (AuxK); the
    backward gives gradients only through the selected entries, in float32."""

    @staticmethod
    def forward(ctx, x, b_dec, W_enc_t, b_enc, k, dead, k_aux, dtype, sparse):
        xc, blocks = pre_act_blocks(x, b_dec, W_enc_t, b_enc, dtype)
        k_aux = min(k_aux, int(dead.sum())) if dead is not None else 0
        picked = []
        for _, pre in blocks:
            picked.append(pre.topk(k, dim=-1, sorted=False))
            if k_aux:  # fewer dead features than k_aux picks some -inf: clamped to 0 below
                assert dead is not None  # k_aux counts dead features
                picked[-1] += pre.masked_fill_(~dead, float("-inf")).topk(k_aux, sorted=False)
        vals, idx = torch.cat([p[0] for p in picked]), torch.cat([p[1] for p in picked])
        if k_aux:
            aux_vals = torch.cat([p[2] for p in picked]).float().clamp_min(0)
            aux_idx = torch.cat([p[3] for p in picked])
        else:
            aux_vals, aux_idx = x.new_zeros(len(x), 0), idx.new_zeros(len(x), 0)
        vals = vals.float().relu()
        ctx.save_for_backward(xc, W_enc_t, idx, vals, aux_idx, aux_vals)
        ctx.mark_non_differentiable(idx, aux_idx)
        ctx.sparse = sparse
        return vals, idx, aux_vals, aux_idx

    @staticmethod
    def backward(ctx, grad_vals, _grad_idx, grad_aux, _grad_aux_idx):
        xc, W_enc_t, idx, vals, aux_idx, aux_vals = ctx.saved_tensors
        grad_pre = grad_vals * (vals > 0)  # ReLU after the selection
        if aux_idx.shape[1]:
            grad_pre = torch.cat([grad_pre, grad_aux * (aux_vals > 0)], 1)
            idx = torch.cat([idx, aux_idx], 1)
        tokens, slots = idx.shape
        token = torch.arange(tokens, device=xc.device).repeat_interleave(slots)
        grads = encoder_backward(xc, W_enc_t, idx.flatten(), token, grad_pre.flatten(), ctx.sparse)
        return None, *grads, None, None, None, None, None


class TopKSAE(SAE):
    architecture = "topk"
    fixed_l0 = True

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        assert self.cfg.k is not None  # a TopK SAE's config has its k
        vals, idx = pre.topk(self.cfg.k, dim=-1)
        return torch.zeros_like(pre).scatter_(-1, idx, vals.relu())

    def train_forward(self, x: torch.Tensor, step: StepInputs = DEFAULT_STEP) -> TrainOutput:
        """The sparse training forward: reconstruction and, with dead features, the AuxK
        loss (dead features try to reconstruct what the live ones missed)."""
        vals, idx, aux_vals, aux_idx = _SelectTopK.apply(
            x,
            self.b_dec,
            self.W_enc_t,
            self.b_enc,
            self.cfg.k,
            step.dead,
            step.aux_k,
            step.dtype,
            step.sparse_grads,
        )
        x_hat = self._decode_rows(vals, idx, step.sparse_grads) + self.b_dec
        aux = x.new_zeros(())
        if aux_idx.shape[1]:
            residual = (x - x_hat).detach()
            e_hat = self._decode_rows(aux_vals, aux_idx, step.sparse_grads)
            denom = (residual - residual.mean(0)).pow(2).sum().clamp_min(1e-12)
            aux = (e_hat - residual).pow(2).sum() / denom
        return TrainOutput(x_hat, vals, idx, step.aux_coef * aux)

    def _decode_rows(self, vals: torch.Tensor, idx: torch.Tensor, sparse: bool) -> torch.Tensor:
        """[tokens, slots] entries decoded (without b_dec)."""
        tokens, slots = idx.shape
        token = torch.arange(tokens, device=idx.device).repeat_interleave(slots)
        return decode_entries(self, vals.flatten(), idx.flatten(), token, tokens, sparse)
