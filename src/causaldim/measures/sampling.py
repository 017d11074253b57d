"""How the direct readings' samples were drawn, measured from the samples themselves, and
simulated: the model the finite-sample correction (debias.py) inverts.

A reading's rank-1 samples u_t are neither independent nor equal. Tokens of one sequence
are correlated (a sequence is the independent unit), and the norms |u_t| are
heavy-tailed. Both lower the number of independent samples the plug-in spectrum rests
on, and so set how far it is spread. The model: within each stream (a sequence, or one
probe's draws along it) u_t = a_t Sigma^{1/2} z_t, with a_t^2 = |u_t|^2 as observed and
z_t Gaussian, correlated along the stream with corr(z_s, z_t) = rho_{|s - t|} I. Streams
are independent.

rho is read from the samples: the squared cosine of two samples at lag k of one stream,
against that of two samples of different sequences, gives rho_k^2 (for u = Sigma^{1/2} z
with corr rho_k, E cos^2 ~ rho_k^2 + (1 - rho_k^2) c with c the between-sequence value).
The lags are kept up to the first whose excess is not significant, and the tail beyond
continued geometrically: correlation the data cannot tell from noise is not invented, and
one that decays below the noise is not cut dead.
"""

from __future__ import annotations

import torch

SIGNIFICANT = 2.0  # standard errors: a lag's correlation is kept above this, one-sided
CHUNK_STREAMS = 64  # streams simulated at a time (bounds memory: CHUNK x T x d floats)


class LagStats:
    """Sums of squared cosines between samples of one stream, by lag, and between
    samples of different sequences (the baseline)."""

    def __init__(self, seq_len: int):
        self.sums = torch.zeros(seq_len, dtype=torch.float64, device="cpu")
        self.squares = torch.zeros(
            seq_len, dtype=torch.float64, device="cpu"
        )  # of cos^2, for its error
        self.counts = torch.zeros(seq_len, dtype=torch.float64, device="cpu")
        self.cross_sum, self.cross_count = 0.0, 0.0
        self._last: tuple[int, torch.Tensor] | None = None  # the last sequence seen

    def add(self, x: torch.Tensor, seq: torch.Tensor, pos: torch.Tensor) -> None:
        """x [n, K, d] (K probes, each its own stream), seq and pos [n]."""
        v = x.float()
        v = v / v.norm(dim=-1, keepdim=True).clamp_min(1e-30)
        seq, pos = seq.to(v.device), pos.long().to(v.device)
        for s in seq.unique().tolist():
            sel = seq == s
            vs, ps = v[sel], pos[sel]  # [m, K, d]
            if len(vs) > 1:
                # pairs of one probe only: different probes of a token are other streams
                cos2 = torch.einsum("ikd,jkd->kij", vs, vs).pow(2).sum(0)
                lag = (ps[:, None] - ps[None, :]).abs()
                upper = torch.triu(torch.ones_like(lag, dtype=torch.bool), 1)
                k = lag[upper].cpu()
                c2 = cos2[upper].double().cpu()
                self.sums += torch.bincount(k, c2, minlength=len(self.sums))[: len(self.sums)]
                self.squares += torch.bincount(k, c2 * c2, minlength=len(self.sums))[
                    : len(self.sums)
                ]
                pairs = torch.bincount(k, minlength=len(self.sums))[: len(self.sums)]
                self.counts += pairs.double() * vs.shape[1]
            last = self._last
            if last is not None and last[0] != s and last[1].shape[1] == vs.shape[1]:
                # the baseline: against the sequence seen before it
                cross = torch.einsum("ikd,jkd->kij", vs, last[1].to(v.device)).pow(2)
                self.cross_sum += float(cross.sum())
                self.cross_count += cross.numel()
            self._last = (s, vs)

    def correlation(self) -> torch.Tensor:
        """rho_k, k = 0 .. seq_len - 1 (rho_0 = 1): measured up to the first lag whose
        excess over the baseline is not SIGNIFICANT standard errors above 0 (or that no
        pair reached); beyond it, the tail the noise hides, continued geometrically from
        the last two measured lags (a correlation that decays as it did, not one that
        stops dead)."""
        rho2 = torch.zeros_like(self.sums)
        rho2[0] = 1.0
        if self.cross_count == 0:
            return rho2
        base = self.cross_sum / self.cross_count
        last = 0
        for k in range(1, len(rho2)):
            if self.counts[k] == 0:
                break
            mean = float(self.sums[k] / self.counts[k])
            spread = max(float(self.squares[k] / self.counts[k]) - mean * mean, 0.0)
            error = (spread / float(self.counts[k])) ** 0.5
            if mean - base <= SIGNIFICANT * error:
                break
            excess = (mean - base) / (1 - base)
            rho2[k], last = min(excess, 1.0), k
        if last >= 2 and rho2[last] < rho2[last - 1]:
            decay = float(rho2[last] / rho2[last - 1])
            tail = torch.arange(1, len(rho2) - last, dtype=torch.float64, device=rho2.device)
            rho2[last + 1 :] = rho2[last] * decay**tail
        return rho2.sqrt()


def _lag_matrix(rho: torch.Tensor) -> torch.Tensor:
    t = len(rho)
    return rho[
        (
            torch.arange(t, device=rho.device)[:, None]
            - torch.arange(t, device=rho.device)[None, :]
        ).abs()
    ]


def independent_equivalents(weights: torch.Tensor, rho: torch.Tensor) -> float:
    """(sum a^2)^2 / sum over streams of sum_{s,t} a_s^2 a_t^2 rho_{|s-t|}, for the
    weights a^2 laid out as [streams, seq_len] (0 where a stream has no sample): with
    rho = 0 beyond lag 0 it is n_eff (debias.n_eff), and correlation along a stream
    lowers it as it lowers the information in a mean (AR(1): by about (1 - rho) /
    (1 + rho)). For a covariance of Gaussian samples rho^2 would do; rho is the cautious
    count, chosen by measurement: counted with rho^2 the estimator called itself converged
    at rho = 0.9 where its intervals covered the truth in 4 trials of 6."""
    w = weights.double()
    within = torch.einsum("st,tu,su->", w, _lag_matrix(rho.double()), w)
    return float(w.sum() ** 2 / within) if within > 0 else 0.0


def matched_weights(weights: torch.Tensor, participation_ratio: float) -> torch.Tensor:
    """The weights a^2 to simulate with: the observed |u|^2, each raised to the power
    gamma in [0, 1] that makes the simulated samples' spread of norms equal the data's.
    An observed |u|^2 already holds the fluctuation of its direction's part (for
    Gaussian z, |Sigma^{1/2} z|^2 has relative second moment 1 + 2 / PR); simulating with
    it and a fresh z counts that fluctuation twice, which over-corrects most where PR is
    small. So gamma solves n sum w^2 / (sum w)^2 x (1 + 2 / PR) = n sum a^4 / (sum a^2)^2,
    the simulated and observed n / n_eff (gamma = 0, equal weights, where even those
    spread the norms more than the data do)."""
    kept = weights[weights > 0].double()
    if len(kept) < 2 or not participation_ratio > 0:
        return weights

    def ratio(gamma: float) -> float:
        w = kept.log().mul(gamma).exp()
        return float(len(w) * w.pow(2).sum() / w.sum().pow(2))

    target = ratio(1.0) / (1 + 2 / participation_ratio)
    if ratio(0.0) >= target:
        gamma = 0.0
    else:
        lo, hi = 0.0, 1.0
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if ratio(mid) < target else (lo, mid)
        gamma = (lo + hi) / 2
    out = weights.double().clone()
    positive = out > 0
    out[positive] = out[positive].log().mul(gamma).exp()
    return out


def toeplitz_root(rho: torch.Tensor) -> torch.Tensor:
    """R with R R^T = the correlation matrix rho_{|s-t|} (its negative eigenvalues, where
    the measured lags do not make a valid correlation, set to 0)."""
    values, vectors = torch.linalg.eigh(_lag_matrix(rho.double()))
    return vectors * values.clamp_min(0).sqrt()


def simulate(
    weights: torch.Tensor,
    stream_block: torch.Tensor,
    blocks: int,
    rho: torch.Tensor,
    d: int,
    draws: int,
    gen: torch.Generator,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """Q [draws, blocks, d, d]: per block, sum_t a_t^2 z_t z_t^T over its streams, z
    correlated along each stream by rho, z ~ N(0, I) marginally: the sampling of each
    block with the data's own weights and correlation, and Sigma = I. Draws are made on
    the CPU (the same on any device)."""
    root = toeplitz_root(rho).float().to(device)
    w = weights.float()
    q = torch.zeros(draws, blocks, d, d, dtype=torch.float32, device=device)
    for j in range(draws):
        for start in range(0, len(w), CHUNK_STREAMS):
            wc = w[start : start + CHUNK_STREAMS].to(device)
            e = torch.randn(len(wc), w.shape[1], d, generator=gen, device="cpu").to(device)
            z = root @ e
            zw = z * wc[:, :, None]
            owner = stream_block[start : start + CHUNK_STREAMS].to(device)
            for b in owner.unique().tolist():
                sel = owner == b
                q[j, b] += zw[sel].reshape(-1, d).T @ z[sel].reshape(-1, d)
    return q
