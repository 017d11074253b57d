"""TopK SAE (Gao et al. 2024): keep the k largest pre-activations per token."""

from __future__ import annotations

import torch

from .base import SAE


class TopKSAE(SAE):
    architecture = "topk"

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        vals, idx = pre.topk(self.cfg.k, dim=-1)
        return torch.zeros_like(pre).scatter_(-1, idx, vals.relu())

    def aux_loss(
        self,
        x: torch.Tensor,
        x_hat: torch.Tensor,
        pre: torch.Tensor,
        dead: torch.Tensor,
        k_aux: int,
    ) -> torch.Tensor:
        """AuxK: dead features try to reconstruct what the live ones missed, so that
        they receive gradient and come back to life."""
        n_dead = int(dead.sum())
        if n_dead == 0:
            return pre.new_zeros(())
        masked = pre.masked_fill(~dead, float("-inf"))
        vals, idx = masked.topk(min(k_aux, n_dead), dim=-1)
        f_aux = torch.zeros_like(pre).scatter_(-1, idx, vals.relu())
        residual = (x - x_hat).detach()
        e_hat = f_aux @ self.W_dec
        denom = (residual - residual.mean(0)).pow(2).sum().clamp_min(1e-12)
        return (e_hat - residual).pow(2).sum() / denom
