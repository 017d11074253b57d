"""What every SAE shares: f = act(W_enc^T (x - b_dec) + b_enc), x_hat = W_dec^T f + b_dec.

Weights live in the residual stream's own units (any input normalisation used while
training is folded in before saving), so an SAE encodes the store's h directly and
W_dec's rows are the feature directions d_i that attribution patching uses.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from .sparse import StepInputs, TrainOutput

ROW_BLOCK_ELEMENTS = 1 << 24  # decoder rows gathered at once to project sparse gradients
CUT_BLOCK_ELEMENTS = 1 << 24  # pre-activations at once for the starting firing bars


@dataclass
class SAEConfig:
    architecture: str
    d_in: int
    width: int
    k: int | None = None  # TopK: active features per token
    init_threshold: float = 0.01  # JumpReLU: threshold before calibration on data
    bandwidth: float = 0.05  # JumpReLU: straight-through kernel width (normalised units;
    # the paper's 0.001 moves thresholds too slowly for sweeps of a few hundred steps)

    def to_dict(self) -> dict:
        return asdict(self)


class SAE(nn.Module):
    """Base class; subclasses define `activate(pre)` (the dense definition, used to
    encode) and `train_forward(x, step: StepInputs) -> TrainOutput` (the sparse training
    step, held to it by tests), and say how their L0 is set."""

    architecture = "base"
    fixed_l0 = False  # True: L0 is set by construction (TopK), no sparsity to control
    init_sparsity_coef = 0.0  # where the L0 controller starts (normalised units)

    def __init__(self, cfg: SAEConfig):
        super().__init__()
        self.cfg = cfg
        d, m = cfg.d_in, cfg.width
        # The encoder is stored feature-major, [m, d] like nn.Linear's weight: the sparse
        # TopK backward makes its gradient one feature row at a time, and the fused Adam
        # wants contiguous parameters (on a transposed view it runs ~5x slower).
        self.W_enc_t = nn.Parameter(torch.empty(m, d))
        self.b_enc = nn.Parameter(torch.zeros(m))
        self.W_dec = nn.Parameter(torch.empty(m, d))
        self.b_dec = nn.Parameter(torch.zeros(d))

    @property
    def W_enc(self) -> torch.Tensor:
        """[d, m], a view: pre = (x - b_dec) @ W_enc + b_enc."""
        return self.W_enc_t.T

    def reset(self, generator: torch.Generator | None = None) -> None:
        """Unit-norm random decoder rows; the encoder starts as the decoder's transpose.
        Drawn on the CPU, so that every device starts from the same weights."""
        with torch.no_grad():
            w = torch.randn(self.W_dec.shape, generator=generator, device="cpu")
            self.W_dec.copy_(w / w.norm(dim=1, keepdim=True))
            self.W_enc_t.copy_(self.W_dec)
            self.b_enc.zero_()
            self.b_dec.zero_()

    def pre_acts(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.b_dec) @ self.W_enc + self.b_enc

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def train_forward(self, x: torch.Tensor, step: StepInputs) -> TrainOutput:
        raise NotImplementedError

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.activate(self.pre_acts(x))

    def decode(self, f: torch.Tensor) -> torch.Tensor:
        return f @ self.W_dec + self.b_dec

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(x))

    @torch.no_grad()
    def calibrate(self, x: torch.Tensor, target_l0: float) -> None:
        """Start at the target L0 on the first batch x (no-op where L0 is fixed)."""

    @torch.no_grad()
    def shift_sparsity(self, delta: float) -> None:
        """Raise every feature's firing bar by delta (no-op where L0 is fixed)."""

    @torch.no_grad()
    def firing_cut(self, x: torch.Tensor, target_l0: float) -> torch.Tensor:
        """Per feature, the pre-activation exceeded by a fraction target_l0 / width of x's
        tokens, so that each feature starts with an equal share of the target L0. A block
        of features at a time: [tokens, width] pre-activations would be 16 GiB for 4,096
        tokens at a width of 1,048,576."""
        if len(x) == 1:
            return self.pre_acts(x)[0]
        q = 1 - min(1.0, target_l0 / self.cfg.width)
        xc = x - self.b_dec
        block = max(1, CUT_BLOCK_ELEMENTS // len(x))
        cuts = []
        for start in range(0, self.cfg.width, block):
            rows = slice(start, start + block)
            pre = torch.addmm(self.b_enc[rows], xc, self.W_enc_t[rows].T)
            cuts.append(pre.float().quantile(q, dim=0))
        return torch.cat(cuts)

    @torch.no_grad()
    def normalize_decoder(self) -> None:
        self.W_dec.div_(self.W_dec.norm(dim=1, keepdim=True).clamp_min(1e-12))

    @torch.no_grad()
    def remove_parallel_grad(self) -> None:
        """Keep decoder rows on the unit sphere: drop the gradient along each row (the rows
        are unit vectors already: `reset` and `normalize_decoder` keep them so)."""
        grad = self.W_dec.grad
        if grad is None:
            return
        if grad.is_sparse:  # the rows some entry named (sae/sparse.py, sparse_grads)
            grad = grad.coalesce()
            rows, values = grad.indices()[0], grad.values()
            block = max(1, ROW_BLOCK_ELEMENTS // self.cfg.d_in)  # rows gathered at once
            for start in range(0, len(rows), block):
                w, v = self.W_dec[rows[start : start + block]], values[start : start + block]
                v.addcmul_(torch.linalg.vecdot(v, w, dim=1)[:, None], w, value=-1)
            self.W_dec.grad = grad
            return
        along = torch.linalg.vecdot(grad, self.W_dec, dim=1)
        grad.addcmul_(along[:, None], self.W_dec, value=-1)

    @torch.no_grad()
    def fold_normalization(self, mean: torch.Tensor, scale: float) -> None:
        """Trained on (x - mean) / scale; afterwards encode raw x exactly the same way:
        pre = (x - (mean + scale b_dec)) (W_enc / scale) + b_enc, x_hat = f (scale W_dec)
        + (mean + scale b_dec)."""
        self.b_dec.copy_(mean + scale * self.b_dec)
        self.W_enc.div_(scale)
        self.W_dec.mul_(scale)
