"""Direct causal dimensionality: Sigma = E[u u^T] for each output reading, from the store.

Readings (each from fields of the store's eval split, one rank-1 sample per token and
probe). J is the full pull-back to h_t: the Jacobian of every later position's output
with respect to h_t, through attention, summed over those positions (the same gradient
attribution patching uses), so Sigma = E_t[sum_{t' >= t} J_{t'<-t}^T M J_{t'<-t}]:
  loss              u = g = dLoss/dh                       (no model work beyond the pass)
  logits            u = J^T c, c = v - mean(v), v ~ N(0, I_V)  E[u u^T] = E[J^T P J],
                    P = I - 1 1^T / V: the logits as the softmax output sees them (a shift
                    of all logits changes nothing); the direct kappa is its erank
  logits_uncentred  u = J^T v, the same probes whole       E[u u^T] = E[J^T J], the
                    paper's literal definition, which also counts the shift direction
  fisher            u = J^T (onehot(y) - p), y ~ p          E[u u^T] = E[J^T (diag p - p p^T) J]
  activations       the centred covariance of h itself: the directions the representation
                    uses, as opposed to those that move the output (a reference line)

Sums are kept per block of sequences, with each sample's weight, sequence and position
(debias.py corrects the finite-sample bias from them, and puts an interval on it).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ..config import AnalysisConfig
from ..harvest.store import Store, block_of, n_blocks
from ..threads import parallel_map
from . import debias
from .debias import n_eff
from .sampling import LagStats

# reading -> the store fields whose sum is its sample
READINGS = {
    "loss": ("g",),
    "logits": ("u_logits",),
    "logits_uncentred": ("u_logits", "u_shift"),
    "fisher": ("u_fisher",),
    "activations": ("h",),
}
DIRECT = ("loss", "logits", "logits_uncentred", "fisher")  # readings of the output
HEADLINE = "logits"  # the direct kappa: the gauge-invariant logits reading
DEFINITIONS = {
    "loss": "erank(E[g g^T]), g = dLoss/dh",
    "logits": "erank(E[J^T (I - 11^T/V) J])",
    "logits_uncentred": "erank(E[J^T J])",
    "fisher": "erank(E[J^T (diag p - p p^T) J])",
    "activations": "erank(Cov[h])",
}


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
    (on the CPU), and for an uncentred reading what the finite-sample correction needs:
    each sample's |x|^2, sequence, position and block, and the squared cosines along
    sequences (sampling.LagStats). The sums are kept in `dtype` (float32 halves the
    memory of many layers' sums; a block holds a few hundred tokens) and combined in
    float64."""

    def __init__(
        self,
        d: int,
        blocks: int,
        centred: bool = False,
        device: str | torch.device = "cpu",
        dtype=torch.float64,
        seq_len: int = 1,
        transform: torch.Tensor | None = None,
    ):
        # symmetric [d, d]: each sample x is summed as transform @ x (weighted.py's metric)
        self.transform = None if transform is None else transform.to(device, torch.float32)
        self.xx = torch.zeros(blocks, d, d, dtype=dtype, device=device)
        self.x = torch.zeros(blocks, d, dtype=dtype, device=device) if centred else None
        self.n = torch.zeros(blocks, dtype=torch.float64, device="cpu")
        self.seq_len = seq_len
        self.lags = None if centred else LagStats(seq_len)
        self._rows: list[tuple[torch.Tensor, ...]] = []  # (|x|^2 [n, K], seq, pos, block)
        self._own = 0  # ids given to rows added without a sequence (each its own)

    def add(
        self,
        block: int,
        x: torch.Tensor,
        seq: torch.Tensor | None = None,
        pos: torch.Tensor | None = None,
    ) -> None:
        """x [n, d], or [n, K, d] for K probes (each its own stream along the sequence);
        seq and pos [n] (default: each row a sequence of its own)."""
        x = x.to(self.xx.device, torch.float32)
        if self.transform is not None:
            x = x @ self.transform
        x3 = x if x.dim() == 3 else x[:, None]
        flat = x3.reshape(-1, x3.shape[-1])
        self.xx[block] += (flat.T @ flat).to(self.xx.dtype)
        if self.x is not None:
            self.x[block] += flat.sum(0).to(self.xx.dtype)
        self.n[block] += len(flat)
        n = len(x3)
        if seq is None:
            seq = (
                torch.arange(n, device="cpu") - 1 - self._own
            )  # negative: apart from the store's ids
            self._own += n
        else:
            seq = seq.long().cpu()
        pos = torch.zeros(n, dtype=torch.long, device="cpu") if pos is None else pos.long().cpu()
        if self.lags is not None:
            self.lags.add(x3, seq, pos)
        sq = x3.double().pow(2).sum(-1).cpu()
        self._rows.append((sq, seq, pos, torch.full((n,), block, dtype=torch.long, device="cpu")))

    def samples(self) -> debias.Samples:
        """The samples' weights laid out per stream (sequence x probe) and position."""
        sq, seq, pos, block = (torch.cat(c) for c in zip(*self._rows, strict=True))
        probes = sq.shape[1]
        ids, stream_seq = torch.unique(seq, return_inverse=True)
        streams = stream_seq[:, None] * probes + torch.arange(probes, device="cpu")[None, :]
        weights = torch.zeros(
            len(ids) * probes, max(self.seq_len, int(pos.max()) + 1), device="cpu"
        )
        weights = weights.double().index_put_(
            (streams.flatten(), pos.repeat_interleave(probes)), sq.flatten(), accumulate=True
        )
        stream_block = torch.zeros(len(ids) * probes, dtype=torch.long, device="cpu")
        stream_block[streams.flatten()] = block.repeat_interleave(probes)
        assert self.lags is not None  # uncentred: the only sums sampled
        return debias.Samples(weights, stream_block, self.lags, len(ids))

    def sample_norms(self) -> torch.Tensor:
        """Every sample's |x|^2, in the order added."""
        if not self._rows:
            return torch.zeros(0, dtype=torch.float64, device="cpu")
        return torch.cat([r[0].flatten() for r in self._rows])

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
    definition: str  # what its erank is of (DEFINITIONS)
    n_tokens: int
    n_samples: int  # rank-1 samples: tokens x probes
    samples_per_dim: float
    eigenvalues: list[float]  # descending, of the plug-in estimate
    erank: float  # plug-in: biased low at few independent samples per dimension
    erank_over_d: float
    participation_ratio: float  # plug-in
    directions_for: dict
    split_half: dict  # plug-in erank and PR of each half of the blocks
    convergence: list[dict]  # plug-in erank and PR over growing numbers of samples
    warning: str | None
    n_eff: float  # (sum |u|^2)^2 / sum |u|^4: equal samples, ignoring correlation
    # The finite-sample correction (debias.py; None for the centred activations reading):
    n_independent: float | None  # n_eff lowered by the correlation along sequences
    converged: bool | None  # n_independent >= debias.MIN_INDEPENDENT_PER_DIM x d
    eval_tokens_needed: int | None  # about, for convergence, where not converged
    correlation: list[float] | None  # rho_k of samples k apart in one sequence
    erank_corrected: float | None  # erank of the deconvolved spectrum: the estimate
    erank_corrected_95: list[float] | None  # jackknife + simulation + remaining drift
    erank_corrected_half: float | None  # the same from the first half of the blocks
    erank_corrected_se: dict | None  # {"sampling": jackknife, "simulation": Monte Carlo}
    eigenvalues_corrected: list[float] | None  # the deconvolved spectrum, unit trace
    participation_ratio_unbiased: float | None  # U-statistics over block pairs
    participation_ratio_unbiased_95: list[float] | None
    # logits_uncentred only: the share of its trace along the shift of all logits
    common_mode_share: float | None = None
    # the same reading in the activations' metric, erank(Cov_h^1/2 Sigma Cov_h^1/2)
    # (weighted.py): this estimate's fields, as a dict
    activation_weighted: dict | None = None
    # `warning`'s parts, each with a stable code: [[code, message], ...]
    cautions: list | None = None
    # columns, in the order of `eigenvalues`: the basis of the causal subspace (saved by
    # subspace.py, not in results.json)
    eigenvectors: torch.Tensor | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in self._asdict().items() if k != "eigenvectors"}


def accumulate(
    store: Store | list[Store],
    cfg: AnalysisConfig,
    readings: tuple[str, ...] | None = None,
    device: str | torch.device = "cpu",
    include_outliers: bool | None = None,
):
    """One pass over the eval split; returns {reading: BlockSums} (summed on device). A
    list of stores (the run's, its --headline-tokens extension and its --until-converged
    rounds) is read as one eval split of all their sequences, in order, cut into the same
    number of blocks; each reading reads the stores that hold its fields (the extension
    and the rounds hold the headline reading's and the activations', not the loss's, the
    literal's or the Fisher probe's)."""
    stores = store if isinstance(store, list) else [store]
    readings = readings or tuple(available(stores[0]))
    sums = {}
    for parts, group in by_parts(stores, readings).items():
        sums.update(accumulate_parts(parts, cfg, group, device, include_outliers))
    return {r: sums[r] for r in readings}


def by_parts(stores: list[Store], readings) -> dict[tuple[Store, ...], list[str]]:
    """The readings grouped by the stores that hold their fields (each group is read as
    one eval split, cut into its own blocks)."""
    groups: dict[tuple[Store, ...], list[str]] = {}
    for r in readings:
        groups.setdefault(tuple(s for s in stores if r in available(s)), []).append(r)
    return groups


def accumulate_parts(
    stores: tuple[Store, ...], cfg, readings, device, include_outliers=None, transform=None
) -> dict:
    """{reading: BlockSums} of these stores read as one eval split (transform: summed
    as transform @ x)."""
    first = stores[0]
    d, seq_len = first.d_model, first.manifest["seq_len"]
    sizes = [s.manifest["splits"]["eval"]["n_sequences"] for s in stores]
    n_sequences = sum(sizes)
    blocks = n_blocks(n_sequences, cfg.blocks)
    sums = {
        r: BlockSums(d, blocks, r == "activations", device, seq_len=seq_len, transform=transform)
        for r in readings
    }
    read = tuple(dict.fromkeys([f for r in readings for f in READINGS[r]] + ["seq", "pos"]))
    drop = not (cfg.include_outliers if include_outliers is None else include_outliers)
    offset = 0
    for part, size in zip(stores, sizes, strict=True):
        for batch in part.batches("eval", read, cfg.read_tokens, drop):
            batch["seq"] = batch["seq"].long() + offset  # one numbering over all the parts
            add_rows(sums, batch, block_of(batch["seq"], blocks, n_sequences), seq_len)
        offset += size
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
            fields = READINGS[r]
            x = rows[fields[0]]
            for other in fields[1:]:
                x = x + rows[other]
            keep = in_block & has_target if r == "loss" else in_block
            s.add(b, x[keep], rows["seq"][keep], rows["pos"][keep])


def _plug_in_curves(sums: BlockSums) -> tuple[dict, list[dict]]:
    """The plug-in's split halves and its convergence curve over growing blocks."""
    blocks = len(sums.n)
    index = torch.arange(blocks, device="cpu")
    halves = {
        name: w
        for name, w in (("first", index < blocks // 2), ("second", index >= blocks // 2))
        if w.any() and float(w.double() @ sums.n) > 0
    }
    steps = sorted({max(1, round(blocks * f)) for f in (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1)})
    growing = [w for k in steps if float((w := (index < k).double()) @ sums.n) > 0]
    found = parallel_map(
        lambda w: spectrum(torch.linalg.eigvalsh(sums.matrix(w))), [*halves.values(), *growing]
    )
    split = {
        name: {"erank": s.erank, "participation_ratio": s.participation_ratio}
        for name, s in zip(halves, found, strict=False)
    }
    curve = [
        {
            "n_samples": int(w @ sums.n),
            "erank": s.erank,
            "participation_ratio": s.participation_ratio,
        }
        for w, s in zip(growing, found[len(halves) :], strict=True)
    ]
    return split, curve


def estimate(
    reading: str,
    sums: BlockSums,
    cfg: AnalysisConfig,
    seed: int = 0,
    probes_per_token: int = 1,
    budget: debias.Budget = debias.FULL,
    floor: float = debias.REPORT_FLOOR,
    observed_of=None,
    definition: str | None = None,
) -> SigmaEstimate:
    """Eigenvalues and erank of the plug-in, and the finite-sample correction within
    `budget`: the corrected erank with its interval, whether it converged, the PR (none
    below `floor` independent equivalents per dimension, where the report gives none).
    observed_of and definition: those of a reading in another metric (weighted.py)."""
    d = sums.xx.shape[-1]
    n_samples = int(sums.n.sum())
    values, vectors = torch.linalg.eigh(sums.matrix())
    eig, vectors = values.flip(0).cpu(), vectors.flip(1).cpu().float()
    point = spectrum(eig)
    halves, curve = _plug_in_curves(sums)
    sq = sums.sample_norms()
    effective = n_eff(float(sq.sum()), float(sq.pow(2).sum()))
    tokens = n_samples // probes_per_token
    fix, needed = None, None
    if sums.x is None and n_samples:
        samples = sums.samples()
        fix = debias.correct(sums.xx, sums.n, samples, seed, budget, floor, observed_of)
        if not fix.converged:
            assert fix.sequences_needed is not None  # set where not converged
            needed = math.ceil(tokens * fix.sequences_needed / samples.n_sequences)
    warnings = []  # (code, message)
    if fix is not None and not fix.converged:
        warnings.append(
            (
                "not_converged",
                f"not converged: {fix.n_independent:,.0f} independent equivalents for d={d} "
                f"({fix.n_independent / d:.1f} per dimension, "
                f"{debias.MIN_INDEPENDENT_PER_DIM:g} needed; tokens of one sequence are "
                f"correlated and norms unequal): about {needed:,} eval tokens would do",
            )
        )
    if fix is not None and fix.half:
        assert fix.erank is not None  # a half estimate comes with the whole one
        change = fix.erank / fix.half - 1
        if abs(change) > cfg.converged_change:
            warnings.append(
                (
                    "half_drift",
                    f"the corrected erank moved by {100 * change:+.1f}% from half of the "
                    "sequences to all of them (a bias signal; the interval includes it)",
                )
            )
    elif fix is None and effective / d < cfg.min_samples_per_dim:
        warnings.append(
            (
                "few_samples",
                f"only {effective:,.0f} effective samples for d={d} ({effective / d:.1f} "
                "per dimension): finite samples bias this plug-in erank",
            )
        )
    return SigmaEstimate(
        reading,
        definition or DEFINITIONS[reading],
        tokens,
        n_samples,
        n_samples / d,
        eig.tolist(),
        point.erank,
        point.erank / d,
        point.participation_ratio,
        point.directions_for,
        halves,
        curve,
        "; ".join(message for _, message in warnings) or None,
        effective,
        # never above n_eff, which it equals where nothing correlates (float rounding aside)
        n_independent=None if fix is None else min(fix.n_independent, effective),
        converged=None if fix is None else fix.converged,
        eval_tokens_needed=needed,
        correlation=None if fix is None else fix.correlation,
        erank_corrected=None if fix is None else fix.erank,
        erank_corrected_95=None if fix is None else fix.interval,
        erank_corrected_half=None if fix is None else fix.half,
        erank_corrected_se=None
        if fix is None
        else {"sampling": fix.se_sampling, "simulation": fix.se_simulation},
        eigenvalues_corrected=None if fix is None or fix.erank is None else fix.eigenvalues,
        participation_ratio_unbiased=None if fix is None else fix.participation_ratio,
        participation_ratio_unbiased_95=None if fix is None else fix.participation_ratio_95,
        cautions=[list(w) for w in warnings],
        eigenvectors=vectors,
    )


def with_common_mode(estimates: dict[str, SigmaEstimate], sums: dict[str, BlockSums]) -> dict:
    """The uncentred reading's share of trace along the shift of all logits: its trace
    less the centred reading's (the two parts are independent, so traces add)."""
    if "logits_uncentred" not in estimates or "logits" not in sums:
        return estimates
    whole = float(sums["logits_uncentred"].xx.double().diagonal(dim1=1, dim2=2).sum())
    centred = float(sums["logits"].xx.double().diagonal(dim1=1, dim2=2).sum())
    share = 1 - centred / whole if whole > 0 else None
    return {
        **estimates,
        "logits_uncentred": estimates["logits_uncentred"]._replace(common_mode_share=share),
    }


def available(store: Store) -> list[str]:
    """The readings the store's eval fields give, in READINGS' order."""
    fields = store.manifest["splits"]["eval"]["fields"]
    return [r for r, f in READINGS.items() if all(name in fields for name in f)]


def probes_per_token(key: dict) -> dict[str, int]:
    logits = key.get("logit_probes", 0)
    return {"logits": logits, "logits_uncentred": logits, "fisher": key.get("fisher_probes", 0)}
