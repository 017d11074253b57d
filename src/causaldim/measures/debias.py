"""Removing the finite-sample bias of the direct estimates' spectra.

The plug-in Sigma_hat = sum_i u_i u_i^T / n of rank-1 samples spreads its eigenvalues
(the top ones grow, the bottom ones shrink), so its erank and participation ratio (PR)
read low, and the more so the fewer samples there are per dimension. The samples here are
neither independent nor equal: tokens of one sequence are correlated, and the norms |u|
are heavy-tailed, so a few samples carry much of the trace. What counts is

  n_eff = (sum_i |u_i|^2)^2 / sum_i |u_i|^4,

the number of equal samples that would spread the spectrum as much (for weighted
Wishart-like sums the Marchenko-Pastur spread is set by it, not by n).

Two estimators remove the bias, both computed from sums kept per block of sequences, so
that tokens of one sequence stay together in every resample:

- PR, by U-statistics. For independent samples i, j, E[(u_i . u_j)^2] = tr Sigma^2 and
  E[|u_i|^2 |u_j|^2] = (tr Sigma)^2; summing over pairs from different blocks only
  (which drops i = j and every pair of one sequence) gives ratio-unbiased estimates of
  both, from the blocks' Gram matrix <S_b, S_c> and traces alone.
- erank, by deconvolving the spectrum (a Monte Carlo inversion of the sampling map, as
  QuEST inverts Marchenko-Pastur, but for weighted samples). The model: u_i = a_i
  Sigma^{1/2} z_i with z_i ~ N(0, I) and a_i^2 = |u_i|^2 as observed, so the simulation
  has the data's own heavy-tailed weights (and, in a bootstrap resample, its duplicated
  blocks). For a candidate spectrum lambda the sampling map is simulated with the same
  weights, l_sim(lambda) = eig(D Q D), D = diag(lambda)^{1/2}, Q = sum_i a_i^2 z_i z_i^T;
  lambda is moved multiplicatively until l_sim matches the observed sorted eigenvalues,
  and erank(lambda) is the estimate. Q is kept per block for a few Gaussian draws, so a
  resample's Q is a weighted sum of blocks (each block's draw picked at random per
  resample, so that the simulation's own noise enters the interval), and every step of
  the iteration costs only eigendecompositions of d x d matrices.
  Why this over the alternatives: shrinkage formulas (Ledoit-Wolf) assume equal
  samples, which heavy-tailed norms are not; moment methods (Kong-Valiant) resolve a
  d = 576 spectrum poorly from a handful of moments at n / d of a few; extrapolating the
  nested curve assumes a form for the bias. The deconvolution needs only the sampling
  model, and the planted-spectrum tests hold it to the truth at n_eff / d from 2 to 64.
  What it assumes: directions independent of norms, and samples independent across
  blocks; correlation within a sequence is not simulated (it lowers the true number of
  independent samples, which would leave some bias in place).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch


class Budget(NamedTuple):
    """How much work the correction of one reading may do."""

    draws: int  # Gaussian draws of the simulation averaged for the point estimate
    resamples: int  # bootstrap resamples of the corrected erank (each costs a few steps)
    iterations: int = 40  # at most, of the deconvolution from the plug-in spectrum
    resample_iterations: int = 3  # from the point estimate, in each bootstrap resample


FULL = Budget(draws=4, resamples=50)  # the layer of the run
# Each layer of the profile: the point estimate moves by about 0.3% from FULL's (the
# simulation's noise), and its interval rests on fewer resamples of fewer steps.
LIGHT = Budget(draws=2, resamples=20, resample_iterations=2)
TOLERANCE = 1e-5  # the deconvolution stops when erank moves less than this, relatively
FLOOR = 1e-12  # relative: eigenvalues below this share of the trace are treated as 0
CHUNK = 8192  # samples simulated at a time


def n_eff(trace: float, fourth: float) -> float:
    """(sum |u|^2)^2 / sum |u|^4: equal samples that would spread the spectrum as much."""
    return trace * trace / fourth if fourth > 0 else 0.0


def unbiased_traces(
    gram: torch.Tensor, traces: torch.Tensor, n: torch.Tensor, weights: torch.Tensor
) -> tuple[float, float]:
    """Ratio-unbiased (tr Sigma)^2 and tr Sigma^2 (up to one common factor) from pairs of
    samples in different blocks: gram[b, c] = <S_b, S_c>_F and traces[b] = tr S_b of the
    blocks' sums S_b of u u^T, n[b] their samples, each block counted weights[b] times
    (copies of one block never pair with each other)."""
    w = weights.double()
    pairs = float(w @ n) ** 2 - float((w * w) @ (n * n))
    if pairs <= 0:
        return math.nan, math.nan
    square_of_trace = (float(w @ traces) ** 2 - float((w * w) @ (traces * traces))) / pairs
    trace_of_square = (float(w @ gram @ w) - float((w * w) @ gram.diagonal())) / pairs
    return square_of_trace, trace_of_square


def unbiased_pr(
    gram: torch.Tensor, traces: torch.Tensor, n: torch.Tensor, weights: torch.Tensor
) -> float:
    """(tr Sigma)^2 / tr Sigma^2 from unbiased_traces: the participation ratio."""
    sq_tr, tr_sq = unbiased_traces(gram, traces, n, weights)
    return sq_tr / tr_sq if tr_sq > 0 else math.nan


def _unit(x: torch.Tensor) -> torch.Tensor:
    x = x.clamp_min(0)
    return x / x.sum()


def simulated_sum(
    sq: torch.Tensor,
    block: torch.Tensor,
    block_weights: torch.Tensor,
    d: int,
    gen: torch.Generator,
    device="cpu",
) -> torch.Tensor:
    """Q = sum_i w_b(i) a_i^2 z_i z_i^T with z_i ~ N(0, I_d): the isotropic part of the
    weighted sampling, with the samples' own weights a_i^2 = sq[i], each block counted
    block_weights[b] times (a duplicated block is one sample set counted twice, not two
    independent ones). The draws are made on the CPU (the same on any device)."""
    weights = (sq * block_weights.double()[block]).float()
    q = torch.zeros(d, d, dtype=torch.float64, device=device)
    for start in range(0, len(weights), CHUNK):
        w = weights[start : start + CHUNK]
        keep = w > 0
        if not keep.any():
            continue
        z = torch.randn(len(w), d, generator=gen, device="cpu")[keep].to(device)
        q += ((z * w[keep].to(device)[:, None]).T @ z).double()
    return q


def deconvolve(
    observed: torch.Tensor,
    simulated: list[torch.Tensor],
    start: torch.Tensor | None = None,
    iterations: int = FULL.iterations,
) -> torch.Tensor:
    """The spectrum lambda (descending, unit trace) whose simulated plug-in eigenvalues,
    eig(D Q D) averaged over the matrices Q in `simulated`, match `observed`; from
    `start` (default: observed itself). Each step multiplies lambda by observed /
    simulated, sorted alike; it stops when erank(lambda) settles."""
    target = _unit(observed.double().sort(descending=True).values)
    floor = FLOOR * float(target.max())
    lam = _unit((target if start is None else start.double().to(target.device)).clamp_min(floor))
    qs = [q.double().to(target.device) for q in simulated]
    before = erank_of(lam)
    for _ in range(iterations):
        root = lam.sqrt()
        sim = torch.stack(
            [_unit(torch.linalg.eigvalsh(root[:, None] * q * root[None, :]).flip(0)) for q in qs]
        ).mean(0)
        ratio = target.clamp_min(floor) / sim.clamp_min(floor)
        lam = _unit((lam * ratio).sort(descending=True).values.clamp_min(floor * 1e-3))
        now = erank_of(lam)
        if abs(now / before - 1) < TOLERANCE:
            break
        before = now
    return lam


def erank_of(lam: torch.Tensor) -> float:
    p = _unit(lam.double())
    p = p[p > 0]
    return math.exp(float(-(p * p.log()).sum()))
