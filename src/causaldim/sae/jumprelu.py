"""JumpReLU SAE (Rajamanoharan et al. 2024): f = pre * [pre > theta] with a learned
per-feature threshold, trained through straight-through estimators with a rectangle
kernel, and an L0 penalty. The activation functions work on dense [tokens, width] pre-
activations and on the flat entries of the sparse training step alike."""

from __future__ import annotations

import math

import torch
from torch import nn

from .base import SAE, SAEConfig
from .sparse import DEFAULT_STEP, StepInputs, TrainOutput, threshold_train_forward


def _kernel(x: torch.Tensor) -> torch.Tensor:
    return ((x > -0.5) & (x < 0.5)).to(x.dtype)


class _JumpReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, pre, theta, bandwidth):
        ctx.save_for_backward(pre, theta)
        ctx.bandwidth = bandwidth
        return pre * (pre > theta)

    @staticmethod
    def backward(ctx, grad):
        pre, theta = ctx.saved_tensors
        eps = ctx.bandwidth
        d_pre = grad * (pre > theta)
        d_theta = -(theta / eps) * _kernel((pre - theta) / eps) * grad
        return d_pre, d_theta.sum_to_size(theta.shape), None


class _Step(torch.autograd.Function):
    @staticmethod
    def forward(ctx, pre, theta, bandwidth):
        ctx.save_for_backward(pre, theta)
        ctx.bandwidth = bandwidth
        return (pre > theta).to(pre.dtype)

    @staticmethod
    def backward(ctx, grad):
        pre, theta = ctx.saved_tensors
        eps = ctx.bandwidth
        d_theta = -(1.0 / eps) * _kernel((pre - theta) / eps) * grad
        return None, d_theta.sum_to_size(theta.shape), None


class JumpReLUSAE(SAE):
    architecture = "jumprelu"
    init_sparsity_coef = 1e-3  # thresholds start calibrated; the penalty only holds them

    def __init__(self, cfg: SAEConfig):
        super().__init__(cfg)
        self.log_threshold = nn.Parameter(torch.full((cfg.width,), math.log(cfg.init_threshold)))

    @property
    def threshold(self) -> torch.Tensor:
        return self.log_threshold.exp()

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        return _JumpReLU.apply(pre, self.threshold, self.cfg.bandwidth)

    def train_forward(self, x: torch.Tensor, step: StepInputs = DEFAULT_STEP) -> TrainOutput:
        """The sparse step keeps the firing entries and those in the straight-through
        window below the threshold (the threshold's gradient comes from both); the
        penalty is L0."""
        theta, eps = self.threshold, self.cfg.bandwidth
        return threshold_train_forward(
            self,
            x,
            theta - eps / 2,
            lambda pre, i: _JumpReLU.apply(pre, theta[i], eps),
            lambda pre, f, i: _Step.apply(pre, theta[i], eps),
            step,
        )

    @torch.no_grad()
    def calibrate(self, x: torch.Tensor, target_l0: float) -> None:
        self.log_threshold.copy_(self.firing_cut(x, target_l0).clamp_min(1e-4).log())

    @torch.no_grad()
    def shift_sparsity(self, delta: float) -> None:
        self.log_threshold.add_(delta)

    def reset(self, generator=None) -> None:
        super().reset(generator)
        with torch.no_grad():
            self.log_threshold.fill_(math.log(self.cfg.init_threshold))
