"""Adam for wide SAEs: the same update as torch.optim.Adam (no weight decay), in less
memory.

float32 Adam holds four copies of every weight (the weight, its gradient and both
moments): 77 GiB for a 1,048,576-wide SAE at d = 2,304. LeanAdam holds two and a half:
- gradients of the weight matrices arrive as sparse rows (sae/sparse.py: a step names a
  few features, and the rest have gradient 0), so no dense gradient exists;
- a row without gradient is still updated as dense Adam updates it (its moments decay
  and its weight moves by m / sqrt(v)), so this is Adam, not the lazy SparseAdam;
- the first moments of the matrices are kept in bfloat16 (moment_dtype): they change by
  a tenth each step, well above bfloat16's resolution. The second moments stay float32:
  at beta2 = 0.999 their per-step change is below bfloat16's resolution, and rounding to
  nearest would freeze them;
- the update works a block of rows at a time, so no temporary is the size of a weight.
"""

from __future__ import annotations

import math

import torch

OPTIMIZERS = ("adam", "lean")
BLOCK_ELEMENTS = 1 << 24  # elements updated at once: 64 MB of float32 temporaries


def moment_bytes(optimizer: str) -> tuple[int, int]:
    """Bytes a weight-matrix element holds beside the weight: (gradient, moments)."""
    return (4, 8) if optimizer == "adam" else (0, 2 + 4)


def build_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=(0.9, 0.999), fused=True)
    return LeanAdam(params, lr=lr)


class LeanAdam(torch.optim.Optimizer):
    """Adam that takes dense or row-sparse (COO over dim 0) gradients, with the first
    moments of matrices in moment_dtype (see the module's docstring)."""

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        moment_dtype: torch.dtype = torch.bfloat16,
    ):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps})
        self.moment_dtype = moment_dtype

    def _first_moment_dtype(self, p: torch.Tensor) -> torch.dtype:
        return self.moment_dtype if p.dim() > 1 else p.dtype

    @torch.no_grad()
    def step(self, closure=None):
        assert closure is None, "LeanAdam takes no closure"
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group)

    def _update(self, p: torch.Tensor, group: dict) -> None:
        beta1, beta2 = group["betas"]
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(p, dtype=self._first_moment_dtype(p))
            state["exp_avg_sq"] = torch.zeros_like(p)
        state["step"] += 1
        t = float(state["step"])
        step_size = group["lr"] / (1 - beta1**t)
        root_bc2 = math.sqrt(1 - beta2**t)
        grad = p.grad
        assert grad is not None  # step() updates only the weights with a gradient
        if grad.is_sparse:
            grad = grad.coalesce()
            rows, values = grad.indices()[0], grad.values()
        else:
            rows, values = None, grad
        m_all, v_all = state["exp_avg"], state["exp_avg_sq"]
        per_row = max(1, p[0].numel()) if p.dim() else 1
        block = max(1, BLOCK_ELEMENTS // per_row)
        n = len(p) if p.dim() else 1
        for r0 in range(0, n, block):
            r1 = min(n, r0 + block)
            if p.dim():
                pp, m_kept, v = p[r0:r1], m_all[r0:r1], v_all[r0:r1]
            else:
                pp, m_kept, v = p, m_all, v_all
            m = m_kept.float() if m_kept.dtype != torch.float32 else m_kept
            m.mul_(beta1)
            v.mul_(beta2)
            if rows is None:
                g = values[r0:r1] if p.dim() else values
                m.add_(g, alpha=1 - beta1)
                v.addcmul_(g, g, value=1 - beta2)
            else:
                lo, hi = torch.searchsorted(rows, rows.new_tensor([r0, r1])).tolist()
                local, g = rows[lo:hi] - r0, values[lo:hi]
                m.index_add_(0, local, g, alpha=1 - beta1)
                v.index_add_(0, local, g * g, alpha=1 - beta2)
            denom = v.sqrt().div_(root_bc2).add_(group["eps"])
            if m is not m_kept:  # kept narrow: the update uses what is kept
                m_kept.copy_(m)
                m = m_kept.float()
            pp.addcdiv_(m, denom, value=-step_size)

    def load_state_dict(self, state_dict: dict) -> None:
        """As torch's, which casts every moment to its weight's dtype; the first moments
        of matrices go back to moment_dtype (exact: they were saved in it)."""
        super().load_state_dict(state_dict)
        for p, state in self.state.items():
            if "exp_avg" in state:
                state["exp_avg"] = state["exp_avg"].to(self._first_moment_dtype(p))
