"""Removing the finite-sample bias of the direct estimates' spectra, with an interval
that holds on the data it is given.

The plug-in Sigma_hat = sum_i u_i u_i^T / n of rank-1 samples spreads its eigenvalues
(the top ones grow, the bottom ones shrink), so its erank reads low, the more so the fewer
independent samples there are per dimension. Tokens of one sequence are correlated and
the norms |u| heavy-tailed, so the independent samples are far fewer than the tokens.

erank, by deconvolving the spectrum with sequences as its units. sampling.py measures
how the samples were drawn (each one's weight a^2 = |u|^2, the correlation rho_k of
samples k apart in one sequence) and simulates that sampling for Sigma = I, per block of
sequences: Q_b. For a candidate spectrum lambda the plug-in it would give is eig(D Q D),
D = diag(lambda)^{1/2}, Q = sum_b Q_b; lambda is moved multiplicatively until that
matches the observed sorted eigenvalues (as QuEST inverts Marchenko-Pastur, but for the
data's own weighted, correlated sampling), and erank(lambda) is the estimate.

Chosen by measurement (benchmarks/debias.py, its table in docs/method.md), on planted
spectra k^-0.8 and k^-1.5, d 64 and 128, log-normal norms, AR(1) correlation along
sequences of 128 (rho 0, 0.5, 0.9) and directions that depend on the norm (a
token-dependent low-rank covariance, as J_t^T v has), against:
- the plug-in: -10% to -34% at 2 to 3 independent samples per dimension;
- the same deconvolution with independent samples (the previous estimator): -27.5% at
  rho = 0.9, where correlation leaves a tenth of the samples independent;
- split-sample eigenvalues (eigenvectors from half of the sequences, variances along them
  from the other half, NERCOME): +15% to +39% at 2 to 3 per dimension, +2% to +3% at 30:
  eigenvectors from half the data smear the spectrum, which reads high.
What it assumes: samples within a stream correlated alike in every direction, directions
independent of norms within the model (the low-rank cells measure what that costs).

The interval, from the data, never widened to hold the point:
- sampling: a delete-a-group jackknife over groups of sequence blocks (each replicate
  deconvolved from the point in a few steps), so a sequence's tokens stay together;
- simulation: the spread of the estimate over the Monte Carlo draws of Q;
- remaining bias: the change of the estimate from the first half of the blocks to all of
  them; if the bias falls like 1/n, what is left of it at n is about that change.
  half-width = t_{G-1} sqrt(se_sampling^2 + se_simulation^2) + |change|.

Converged: at least MIN_INDEPENDENT_PER_DIM independent equivalents per dimension
(sampling.independent_equivalents: n_eff lowered by the measured correlation); below
that the estimate is reported as not converged, with the sequences that would do.

PR, by U-statistics: for independent samples i, j, E[(u_i . u_j)^2] = tr Sigma^2 and
E[|u_i|^2 |u_j|^2] = (tr Sigma)^2; summing over pairs from different blocks only (which
drops i = j and every pair of one sequence) estimates both without bias, so they hold
under any correlation within a sequence. Their ratio is consistent, not unbiased (a few
percent high at n_eff / d of 2). Its interval is the same jackknife's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from scipy.stats import t as student_t

from ..threads import parallel_map
from . import sampling

# Where directions depend on norms (as J^T v's do: the largest directions come with the
# largest norms), the corrected erank read +3% to +5% high at 4 to 7.5 per dimension and
# within 2% from 8 on (benchmarks/debias.py, 'norm-coupled'; 100-200 trials a cell).
MIN_INDEPENDENT_PER_DIM = 8.0
# Below this many independent equivalents per dimension no corrected erank is computed:
# the correction would move it by half or more (0.2 per dimension turned a plug-in 223
# into 463 [416, 509]), and the report prints n/a there.
REPORT_FLOOR = 1.0
TOLERANCE = 1e-5  # the deconvolution stops when erank moves less than this, relatively
FLOOR = 1e-12  # relative: eigenvalues below this share of the trace are treated as 0


class Budget(NamedTuple):
    """How much work the correction of one reading may do."""

    draws: int  # Monte Carlo draws of the simulated sampling averaged for the estimate
    groups: int  # jackknife groups of sequence blocks (at most the blocks there are)
    iterations: int = 40  # at most, of the deconvolution from the plug-in spectrum
    replicate_iterations: int = 2  # from the point, in each jackknife replicate
    # Draws in each jackknife replicate: the same draws in every replicate, so their
    # Monte Carlo noise is common to all and leaves the replicates' spread alone; the
    # replicates were four fifths of the work at 3 iterations of all draws.
    replicate_draws: int = 2
    half_iterations: int = 8  # from the point, for the first half of the blocks


# The layer of the run. Fewer draws leave the average simulated spectrum noisy, and the
# ratio observed / simulated then over-corrects: +2.4% at 4 draws, +1.5% at 8, on a k^-1.5
# spectrum at 5 independent samples per dimension (benchmarks/debias.py).
FULL = Budget(draws=8, groups=16)
# Each layer of the profile: fewer draws and groups (a wider interval, the same estimator).
LIGHT = Budget(draws=4, groups=8, iterations=25, half_iterations=5)


class Samples(NamedTuple):
    """What the correction needs of a reading's samples besides their block sums."""

    weights: torch.Tensor  # [streams, seq_len]: each sample's |u|^2 at its position, else 0
    stream_block: torch.Tensor  # [streams]: the block of each stream's sequence
    lags: sampling.LagStats
    n_sequences: int


class Correction(NamedTuple):
    erank: float | None  # None below REPORT_FLOOR: not computed (nor what hangs on it)
    interval: list[float] | None  # 95%, see the module's docstring
    half: float | None  # the same estimator on the first half of the blocks
    eigenvalues: list[float]  # the deconvolved spectrum, unit trace, descending
    se_sampling: float | None  # jackknife over groups of sequence blocks
    se_simulation: float  # over the Monte Carlo draws
    n_independent: float  # independent equivalents (sampling.independent_equivalents)
    correlation: list[float]  # rho_k along sequences (sampling.LagStats), while >= 0.01
    converged: bool
    sequences_needed: int | None  # for MIN_INDEPENDENT_PER_DIM, where not converged
    participation_ratio: float | None
    participation_ratio_95: list[float] | None


def n_eff(trace: float, fourth: float) -> float:
    """(sum |u|^2)^2 / sum |u|^4: equal samples that would spread the spectrum as much."""
    return trace * trace / fourth if fourth > 0 else 0.0


def unbiased_traces(
    gram: torch.Tensor, traces: torch.Tensor, n: torch.Tensor, weights: torch.Tensor
) -> tuple[float, float]:
    """Unbiased (tr Sigma)^2 and tr Sigma^2 (up to one common factor) from pairs of
    samples in different blocks: gram[b, c] = <S_b, S_c>_F and traces[b] = tr S_b of the
    blocks' sums S_b of u u^T, n[b] their samples, each block counted weights[b] times
    (a block is never paired with itself)."""
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


def _simulated_spectrum(lam: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """eig(D Q D), unit trace, descending; in float64: float32's small eigenvalues are
    noise the deconvolution amplifies (the first half's erank wandered by +-3% between
    iterations and moved 0.5% with the thread count's rounding; float64 moved 1e-9)."""
    root = lam.sqrt()
    return _unit(torch.linalg.eigvalsh(root[:, None] * q * root[None, :]).flip(0))


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
        sim = torch.stack(parallel_map(lambda q, lam=lam: _simulated_spectrum(lam, q), qs)).mean(0)
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


def _jackknife_se(values: list[float]) -> float:
    g = len(values)
    mean = sum(values) / g
    return math.sqrt((g - 1) / g * sum((v - mean) ** 2 for v in values))


def correct(
    block_sums: torch.Tensor,
    counts: torch.Tensor,
    samples: Samples,
    seed: int,
    budget: Budget = FULL,
    floor: float = REPORT_FLOOR,
    observed_of: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> Correction:
    """The corrected erank, its interval and convergence, and the unbiased PR, from one
    reading's per-block sums of u u^T [blocks, d, d] and sample counts [blocks]; below
    `floor` independent equivalents per dimension, only the cheap part (how many, and how
    many sequences would do): no value is given there. observed_of(block weights), where
    given, is the matrix whose spectrum the blocks give (default: their weighted sum): a
    reading whose metric is itself estimated from the blocks (weighted.py) re-estimates
    it in every jackknife replicate and half, so its error enters the interval."""
    blocks, d = block_sums.shape[0], block_sums.shape[-1]
    device = block_sums.device
    sums = block_sums.double()
    rho = samples.lags.correlation()
    kept = int((rho >= 0.01).sum())  # what results.json shows of it
    n_indep = sampling.independent_equivalents(samples.weights, rho)
    scale = MIN_INDEPENDENT_PER_DIM * d / max(n_indep, 1e-9)
    needed = None if scale <= 1 else math.ceil(samples.n_sequences * scale)
    if n_indep < floor * d:  # too few to give a value: the cheap part alone
        return Correction(
            None, None, None, [], None, 0.0, n_indep, rho[:kept].tolist(), False, needed, None, None
        )
    flat = sums.reshape(blocks, -1)
    gram, traces = (flat @ flat.T).cpu(), sums.diagonal(dim1=1, dim2=2).sum(-1).cpu()
    ones = torch.ones(blocks, dtype=torch.float64, device="cpu")
    pr = unbiased_pr(gram, traces, counts, ones)
    weights = sampling.matched_weights(samples.weights, pr)
    gen = torch.Generator(device="cpu").manual_seed(seed + 7919)
    q = sampling.simulate(weights, samples.stream_block, blocks, rho, d, budget.draws, gen, device)

    def estimate(weights: torch.Tensor, start=None, iterations=budget.iterations, draws=None):
        w = weights.to(device).double()
        matrix = torch.einsum("b,bij->ij", w, sums) if observed_of is None else observed_of(w)
        observed = torch.linalg.eigvalsh(matrix.double().to(device))
        draws = budget.draws if draws is None else min(draws, budget.draws)
        qs = [torch.einsum("b,bij->ij", w.float(), q[j]).double() for j in range(draws)]
        return deconvolve(observed, qs, start, iterations), qs

    lam, qs = estimate(ones)
    point = erank_of(lam)

    # Monte Carlo: how far each draw alone would move the point
    sims = parallel_map(lambda qj: _simulated_spectrum(lam, qj), qs)
    mean_sim = torch.stack(sims).mean(0)
    per_draw = [
        erank_of((lam * mean_sim / s.clamp_min(1e-300)).sort(descending=True).values) for s in sims
    ]
    se_sim = (
        math.sqrt(torch.tensor(per_draw, device="cpu").var().item() / len(sims))
        if len(sims) > 1
        else 0.0
    )

    groups = min(budget.groups, blocks)
    group_of = torch.arange(blocks, device="cpu") * groups // blocks
    se_jk, pr_95 = None, None
    if groups > 1:
        leave_out = [(group_of != g).double() for g in range(groups)]
        replicates = parallel_map(
            lambda w: erank_of(
                estimate(w, lam, budget.replicate_iterations, budget.replicate_draws)[0]
            ),
            leave_out,
        )
        se_jk = _jackknife_se(replicates)
        pr_reps = [unbiased_pr(gram, traces, counts, w) for w in leave_out]
        if all(math.isfinite(v) for v in pr_reps) and math.isfinite(pr):
            half = float(student_t.ppf(0.975, groups - 1)) * _jackknife_se(pr_reps)
            pr_95 = [max(1.0, pr - half), min(float(d), pr + half)]  # a PR lies in [1, d]

    half_estimate = None
    first = (torch.arange(blocks, device="cpu") < blocks // 2).double()
    if blocks >= 2 and float(first @ counts.double().cpu()) > 0:
        half_estimate = erank_of(estimate(first, lam, budget.half_iterations)[0])

    interval = None
    if se_jk is not None:
        width = float(student_t.ppf(0.975, groups - 1)) * math.hypot(se_jk, se_sim)
        width += abs(point - half_estimate) if half_estimate is not None else 0.0
        # an erank lies in [1, d] whatever the sampling: an interval says no more
        interval = [max(1.0, point - width), min(float(d), point + width)]
        if pr_95 is not None:  # the PR is never above the erank
            pr_95 = [min(pr_95[0], interval[1]), min(pr_95[1], interval[1])]

    converged = n_indep >= MIN_INDEPENDENT_PER_DIM * d
    return Correction(
        point,
        interval,
        half_estimate,
        lam.cpu().tolist(),
        se_jk,
        se_sim,
        n_indep,
        rho[:kept].tolist(),
        converged,
        needed,
        pr,
        pr_95,
    )
