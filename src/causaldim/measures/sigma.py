"""Direct causal dimensionality: Sigma = E[u u^T] for each output reading, from the store.

Readings (each a field of the store's eval split, one rank-1 sample per token and probe):
  loss         u = g = dLoss/dh                      (no model work beyond the pass)
  logits       u = J^T v, v ~ N(0, I_vocab)          E[u u^T] = E[J^T J]
  fisher       u = J^T (onehot(y) - p), y ~ p         E[u u^T] = E[J^T (diag p - p p^T) J]
  activations  the centred covariance of h itself: the directions the representation
               uses, as opposed to those that move the output (a reference line)

Sums are kept per block of sequences, so that one pass gives the estimate, a bootstrap
over sequence blocks, a split-half comparison and a convergence curve.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ..config import AnalysisConfig
from ..harvest.store import Store
from . import debias
from .debias import n_eff
from .stats import interval_95

READINGS = {"loss": "g", "logits": "u_logits", "fisher": "u_fisher", "activations": "h"}
DIRECT = ("loss", "logits", "fisher")  # the readings of the output; activations is a reference


class Spectrum(NamedTuple):
    erank: float  # exp(entropy of normalised eigenvalues), Roy & Vetterli (2007)
    participation_ratio: float  # (sum l)^2 / sum l^2, a lower bound on erank
    directions_for: dict  # {"50%": n, "90%": n, "99%": n} of the trace


def spectrum(eigenvalues: torch.Tensor) -> Spectrum:
    lam = eigenvalues.double().clamp_min(0).sort(descending=True).values
    total = float(lam.sum())
    if total <= 0:
        return Spectrum(0.0, 0.0, {"50%": 0, "90%": 0, "99%": 0})
    p = lam / total
    nz = p[p > 0]
    erank = math.exp(float(-(nz * nz.log()).sum()))
    pr = 1.0 / float((p * p).sum())  # (sum l)^2 / sum l^2, without squaring tiny l
    cum = p.cumsum(0)
    n_for = {f"{int(q * 100)}%": int((cum < q - 1e-12).sum()) + 1 for q in (0.5, 0.9, 0.99)}
    return Spectrum(erank, pr, n_for)


class BlockSums:
    """Per-block sums of x x^T (and of x, for a centred covariance) on device, counts
    (on the CPU), and each sample's squared norm and block (the weights of the
    finite-sample correction, debias.py). The sums are kept in `dtype` (float32 halves
    the memory of many layers' sums; a block holds a few hundred tokens) and combined in
    float64."""

    def __init__(
        self, d: int, blocks: int, centred: bool = False, device="cpu", dtype=torch.float64
    ):
        self.xx = torch.zeros(blocks, d, d, dtype=dtype, device=device)
        self.x = torch.zeros(blocks, d, dtype=dtype, device=device) if centred else None
        self.n = torch.zeros(blocks, dtype=torch.float64, device="cpu")
        self._sq: list[torch.Tensor] = []
        self._block: list[torch.Tensor] = []

    def add(self, block: int, x: torch.Tensor) -> None:
        x = x.to(self.xx.device, torch.float32)
        self.xx[block] += (x.T @ x).to(self.xx.dtype)
        if self.x is not None:
            self.x[block] += x.sum(0).to(self.xx.dtype)
        self.n[block] += len(x)
        self._sq.append(x.double().pow(2).sum(1).cpu())
        self._block.append(torch.full((len(x),), block, dtype=torch.long, device="cpu"))

    def samples(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every sample's |x|^2 and block, in the order added."""
        if not self._sq:
            empty = torch.zeros(0, device="cpu")
            return empty.double(), empty.long()
        return torch.cat(self._sq), torch.cat(self._block)

    def matrix(self, weights: torch.Tensor | None = None) -> torch.Tensor:
        """The estimate from the blocks with these weights (default: all, once)."""
        w = torch.ones_like(self.n) if weights is None else weights.double()
        n = float(w @ self.n)
        w = w.to(self.xx.device)
        sigma = torch.einsum("b,bij->ij", w, self.xx.double()) / n
        if self.x is not None:
            mu = (w @ self.x.double()) / n
            sigma = sigma - torch.outer(mu, mu)
        return sigma


class SigmaEstimate(NamedTuple):
    reading: str
    n_tokens: int
    n_samples: int  # rank-1 samples: tokens x probes
    samples_per_dim: float
    eigenvalues: list[float]  # descending
    erank: float
    erank_over_d: float
    participation_ratio: float
    directions_for: dict
    bootstrap: dict | None  # 95% intervals over resampled sequence blocks
    split_half: dict  # erank and PR of each half of the blocks
    convergence: list[dict]  # erank and PR over growing numbers of samples
    warning: str | None
    # Finite-sample bias removed (debias.py; None for the centred activations reading):
    n_eff: float  # (sum |u|^2)^2 / sum |u|^4, equal samples that spread the spectrum as much
    erank_corrected: float | None  # erank of the deconvolved spectrum
    erank_corrected_95: list[float] | None  # percentile interval over resampled blocks
    erank_corrected_half: float | None  # the same from the first half of the blocks
    eigenvalues_corrected: list[float] | None  # the deconvolved spectrum, unit trace
    participation_ratio_unbiased: float | None  # from U-statistics over block pairs
    participation_ratio_unbiased_95: list[float] | None
    # columns, in the order of `eigenvalues`: the basis of the causal subspace (saved by
    # subspace.py, not in results.json)
    eigenvectors: torch.Tensor | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in self._asdict().items() if k != "eigenvectors"}


def accumulate(
    store: Store, cfg: AnalysisConfig, readings: tuple[str, ...] | None = None, device="cpu"
):
    """One pass over the eval split; returns {reading: BlockSums} (summed on device)."""
    fields = store.manifest["splits"]["eval"]["fields"]
    readings = readings or tuple(r for r, f in READINGS.items() if f in fields)
    d, seq_len = store.d_model, store.manifest["seq_len"]
    blocks = store.blocks("eval", cfg.blocks)
    sums = {r: BlockSums(d, blocks, r == "activations", device) for r in readings}
    read = tuple(dict.fromkeys([READINGS[r] for r in readings] + ["seq", "pos"]))
    batches = store.batches("eval", read, cfg.read_tokens, not cfg.include_outliers)
    for batch in batches:
        add_rows(sums, batch, store.block_of("eval", batch["seq"], blocks), seq_len)
    return sums


def add_rows(
    sums: dict[str, BlockSums], rows: dict[str, torch.Tensor], block_of: torch.Tensor, seq_len: int
) -> None:
    """Add rows of the eval split (its fields by name, outliers already left out; each
    row's block in block_of) to each reading's sums, block by block in the rows' order."""
    has_target = rows["pos"] < seq_len - 1  # the last position predicts nothing
    for b in block_of.unique().tolist():
        in_block = block_of == b
        for r, s in sums.items():
            x = rows[READINGS[r]]
            keep = in_block & has_target if r == "loss" else in_block
            s.add(b, x[keep].reshape(-1, x.shape[-1]))


def estimate(
    reading: str,
    sums: BlockSums,
    cfg: AnalysisConfig,
    seed: int = 0,
    probes_per_token: int = 1,
    budget: debias.Budget = debias.FULL,
) -> SigmaEstimate:
    """Eigenvalues, erank, PR and their uncertainty for one reading's block sums; the
    finite-sample correction within `budget`."""
    d = sums.xx.shape[-1]
    n_samples = int(sums.n.sum())
    values, vectors = torch.linalg.eigh(sums.matrix())
    eig, vectors = values.flip(0).cpu(), vectors.flip(1).cpu().float()
    point = spectrum(eig)
    blocks = len(sums.n)

    boot, resampled = None, []  # resampled: (block weights, plug-in eigenvalues)
    if cfg.bootstrap and blocks > 1:
        gen = torch.Generator().manual_seed(seed)
        draws = torch.randint(0, blocks, (cfg.bootstrap, blocks), generator=gen, device="cpu")
        stats = []
        for row in draws:
            w = torch.bincount(row, minlength=blocks)
            eig_w = torch.linalg.eigvalsh(sums.matrix(w))
            stats.append(spectrum(eig_w))
            resampled.append((w, eig_w))
        boot = {"resamples": cfg.bootstrap, "blocks": blocks}
        for name, value in (
            ("erank", point.erank),
            ("participation_ratio", point.participation_ratio),
        ):
            boot.update(_intervals(name, value, [getattr(s, name) for s in stats]))

    halves, half_eigenvalues = {}, {}
    for name, w in (
        ("first", torch.arange(blocks, device="cpu") < blocks // 2),
        ("second", torch.arange(blocks, device="cpu") >= blocks // 2),
    ):
        if w.any() and float(w.double() @ sums.n) > 0:
            half_eigenvalues[name] = torch.linalg.eigvalsh(sums.matrix(w))
            s = spectrum(half_eigenvalues[name])
            halves[name] = {"erank": s.erank, "participation_ratio": s.participation_ratio}

    curve = []
    for k in sorted({max(1, round(blocks * f)) for f in (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1)}):
        w = (torch.arange(blocks, device="cpu") < k).double()
        s = spectrum(torch.linalg.eigvalsh(sums.matrix(w)))
        curve.append(
            {
                "n_samples": int(w @ sums.n),
                "erank": s.erank,
                "participation_ratio": s.participation_ratio,
            }
        )

    sq, _ = sums.samples()
    effective = n_eff(float(sq.sum()), float(sq.pow(2).sum()))
    debiased = (
        _debiased(sums, eig, half_eigenvalues.get("first"), resampled, seed, budget)
        if sums.x is None
        else dict.fromkeys(DEBIASED)
    )
    warnings = []
    if effective / d < cfg.min_samples_per_dim:
        warnings.append(
            f"only {effective:,.0f} effective samples (n_eff) for d={d} "
            f"({effective / d:.1f} per dimension; {n_samples:,} rank-1 samples, unequal "
            "norms): finite samples bias the plug-in erank"
            + ("" if sums.x is not None else ", which the corrected erank removes")
            + "; harvest more eval tokens or probes"
        )
    half = debiased["erank_corrected_half"]
    if half is not None:
        change = debiased["erank_corrected"] / half - 1
        what = "the corrected erank"
    elif len(curve) > 1 and curve[-2]["n_samples"] * 2 >= curve[-1]["n_samples"] * 0.9:
        change, what = point.erank / curve[-2]["erank"] - 1, "erank"
    else:
        change = None
    if change is not None and abs(change) > cfg.converged_change:
        warnings.append(
            f"not converged: {what} changed by {100 * change:+.1f}% over the last doubling "
            "of samples; harvest more eval tokens or probes"
        )
    warning = "; ".join(warnings) or None
    return SigmaEstimate(
        reading,
        n_samples // probes_per_token,
        n_samples,
        n_samples / d,
        eig.tolist(),
        point.erank,
        point.erank / d,
        point.participation_ratio,
        point.directions_for,
        boot,
        halves,
        curve,
        warning,
        effective,
        **debiased,
        eigenvectors=vectors,
    )


DEBIASED = (
    "erank_corrected",
    "erank_corrected_95",
    "erank_corrected_half",
    "eigenvalues_corrected",
    "participation_ratio_unbiased",
    "participation_ratio_unbiased_95",
)


def _debiased(
    sums: BlockSums,
    eig: torch.Tensor,
    half_eig: torch.Tensor | None,
    resampled: list,
    seed: int,
    budget: debias.Budget,
) -> dict:
    """The corrected erank and the unbiased PR of an uncentred reading, each with its
    interval over the bootstrap's resampled blocks (the first budget.resamples of them
    for the erank, whose resamples each cost a few deconvolution steps)."""
    d, blocks = sums.xx.shape[-1], len(sums.n)
    sq, block = sums.samples()
    gen = torch.Generator(device="cpu").manual_seed(seed + 7919)  # apart from the bootstrap's draws
    flat = sums.xx.reshape(blocks, -1).double()
    gram = (flat @ flat.T).cpu()
    traces = sums.xx.diagonal(dim1=1, dim2=2).sum(-1).double().cpu()

    def corrected(weights, observed, draws, start=None, iterations=budget.iterations):
        """On the sums' device: the eigendecompositions are most of the work."""
        device = sums.xx.device
        qs = [debias.simulated_sum(sq, block, weights, d, gen, device) for _ in range(draws)]
        return debias.deconvolve(observed.to(device), qs, start, iterations)

    ones = torch.ones(blocks, dtype=torch.float64, device="cpu")
    lam = corrected(ones, eig, budget.draws)
    first_half = (torch.arange(blocks, device="cpu") < blocks // 2).double()
    half = None  # the same from the first half of the blocks (half_eig: their plug-in)
    if half_eig is not None:
        half = debias.erank_of(corrected(first_half, half_eig, budget.draws, lam))
    point = debias.erank_of(lam)
    pr = debias.unbiased_pr(gram, traces, sums.n, ones)
    erank_boot = [
        debias.erank_of(corrected(w, e, 1, lam, budget.resample_iterations))
        for w, e in resampled[: budget.resamples]
    ]
    pr_boot = [debias.unbiased_pr(gram, traces, sums.n, w) for w, _ in resampled]
    return {
        "erank_corrected": point,
        "erank_corrected_95": _holding(point, erank_boot),
        "erank_corrected_half": half,
        "eigenvalues_corrected": lam.cpu().tolist(),
        "participation_ratio_unbiased": pr,
        "participation_ratio_unbiased_95": _holding(pr, pr_boot),
    }


def _holding(point: float, values: list[float]) -> list[float] | None:
    """The percentile interval of resampled values, widened where needed to hold the
    point estimate (so that the interval never excludes the number it qualifies)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return None
    lo, hi = interval_95(finite)
    return [min(lo, point), max(hi, point)]


def _intervals(name: str, point: float, values: list[float]) -> dict:
    """Resampling duplicates blocks, which spreads the eigenvalues and lowers erank: the
    percentile interval inherits that bias. The basic interval reflects the bootstrap
    distribution about the estimate, which corrects for it; both are reported."""
    lo, hi = interval_95(values)
    mean = float(torch.tensor(values, dtype=torch.float64, device="cpu").mean())
    return {
        f"{name}_95": [2 * point - hi, 2 * point - lo],
        f"{name}_95_percentile": [lo, hi],
        f"{name}_bootstrap_bias": mean - point,
    }


def measure(store: Store, cfg: AnalysisConfig | None = None, seed: int = 0, device="cpu") -> dict:
    """All readings the store holds: {reading: SigmaEstimate}; the sums and their
    eigendecompositions on device."""
    cfg = cfg or AnalysisConfig()
    sums = accumulate(store, cfg, device=device)
    probes = {
        "logits": store.manifest["key"].get("logit_probes", 0),
        "fisher": store.manifest["key"].get("fisher_probes", 0),
    }
    return {
        reading: estimate(reading, s, cfg, seed + i, probes.get(reading, 1))
        for i, (reading, s) in enumerate(sums.items())
    }
