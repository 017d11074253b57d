"""The profile of every layer from one pass: Sigma of each reading at every block output.

The eval pass runs its backward from the loss and the probes down to the lowest tapped
block; tapping every block makes each backward yield g and the probe products at every
layer on its way down, for about the cost of running it on to block 0. The Accumulator
takes those rows as the pass makes them and adds them to per-layer block sums (the same
rows, blocks and order as sigma.accumulate reads from a store), so no per-token rows of
the extra layers are ever written. Each layer is then estimated as the run's layer is,
with coarser blocks and a lighter correction (debias.LIGHT: fewer draws and jackknife
groups): a layer costs seconds, not a minute.

Each output reading is also read in the activations' metric (kappa.py): a forward pass
over the eval sequences before the eval pass gives each layer's C = Cov[h] (outliers
flagged as the eval pass flags them), and the pass's rows are summed again as C^1/2 u.
The eval split's C sets the samples' metric; each resample re-estimates C from its own
blocks (of the eval split and the --headline-tokens extension), as the run's layer does.

Memory: layers x (readings, their twins and the eval split's activations) x blocks d x d
sums, in float32 (check_memory says so before the pass).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..config import AnalysisConfig
from ..errors import UsageError
from ..harvest.store import block_of, n_blocks
from ..progress import bar
from . import debias
from .kappa import root, weighted_estimate
from .sigma import READINGS, BlockSums, SigmaEstimate, add_rows, estimate, with_common_mode

SUM_DTYPE = torch.float32
EXTENDED = ("logits", "activations")  # the readings the headline pass's rows hold
# What results.json keeps of each layer's reading (the full estimate is the run layer's).
KEPT = (
    "n_samples",
    "n_eff",
    "erank",
    "participation_ratio",
    "erank_corrected",
    "erank_corrected_95",
    "erank_corrected_half",
    "n_independent",
    "converged",
    "eval_tokens_needed",
    "participation_ratio_unbiased",
    "participation_ratio_unbiased_95",
    "directions_for",
    "warning",
    "common_mode_share",
)
# the same fields of the reading in the activations' metric (kappa.py), where measured
KEPT_WITH_TWIN = (*KEPT, "activation_weighted")


def profile_readings(logit_probes: int, fisher_probes: int) -> tuple[str, ...]:
    """The readings the pass gives, in sigma.READINGS' order (the store's)."""
    given = {
        "loss": True,
        "logits": logit_probes > 0,
        "logits_uncentred": logit_probes > 0,
        "fisher": fisher_probes > 0,
    }
    return tuple(r for r in READINGS if given.get(r, True))


def sums_per_layer(
    logit_probes: int, fisher_probes: int, twins: tuple[str, ...] | None = None
) -> int:
    """d x d block sums a layer holds: each reading, the activation-weighted twin of each
    output reading in `twins` (None: all of them), and the eval split's activation sums
    where a twin reads it alone."""
    readings = profile_readings(logit_probes, fisher_probes)
    direct = [r for r in readings if r != "activations" and (twins is None or r in twins)]
    return len(readings) + len(direct) + any(r not in EXTENDED for r in direct)


def sums_bytes(n_layers: int, d: int, blocks: int, readings: int) -> int:
    return n_layers * readings * blocks * d * d * torch.finfo(SUM_DTYPE).bits // 8


def check_memory(
    n_layers: int, d: int, blocks: int, readings: int, free_bytes: int, where: str
) -> None:
    """Refuse a profile whose sums would not fit in the memory the run can give them."""
    need = sums_bytes(n_layers, d, blocks, readings)
    if need > free_bytes:
        fits = free_bytes // sums_bytes(n_layers, d, 1, readings)
        fix = (
            f"pass --profile-blocks {fits}"
            if fits >= 2
            else "drop --profile, or run it on a machine with more memory"
        )
        raise UsageError(
            f"--profile: the per-layer sums need {need / 2**30:.1f} GiB ({n_layers} layers x "
            f"{readings} readings x {blocks} blocks of {d} x {d}) and {where} has "
            f"{free_bytes / 2**30:.1f} GiB to give; {fix}"
        )


class Accumulator:
    """Block sums of every reading at every layer, filled from the eval pass's rows (an
    EvalObserver of harvest/write.py). The headline (logits) reading and the activations'
    also read the --headline-tokens extension (`extra` sequences after the eval split's, numbered
    on from it), as the run's layer does; the loss, literal and Fisher readings read the
    eval split alone."""

    def __init__(
        self,
        layers,
        d: int,
        n_sequences: int,
        seq_len: int,
        blocks: int,
        readings: tuple[str, ...],
        include_outliers: bool = False,
        device="cpu",
        extra: int = 0,
        twins: tuple[str, ...] | None = None,
    ):
        self.layers = tuple(sorted(layers))
        self.d, self.device = d, device
        self.seq_len = seq_len
        self.include_outliers = include_outliers
        # sequences each reading reads: the extension holds h and the centred probe alone
        self.n_sequences = {r: n_sequences + (extra if r in EXTENDED else 0) for r in readings}
        self.blocks = {r: n_blocks(n, blocks) for r, n in self.n_sequences.items()}
        self.sums = {
            i: {
                r: BlockSums(d, self.blocks[r], r == "activations", device, SUM_DTYPE, seq_len)
                for r in readings
            }
            for i in self.layers
        }
        # the activations' metric: C from a forward pass first (write.py's metric pass),
        # then each output reading's rows summed again as C^1/2 u
        self.direct = tuple(
            r for r in readings if r != "activations" and (twins is None or r in twins)
        )
        self.wants_forward = "activations" in readings and any(self.direct)
        # each layer's (sum h h^T, sum h, n) over the metric pass, None before its first rows
        self._forward: dict[int, tuple[torch.Tensor, torch.Tensor, int] | None] | None = (
            {i: None for i in self.layers} if self.wants_forward else None
        )
        self.weighted: dict[int, dict[str, BlockSums]] = {}
        self.metric_sums: dict[int, BlockSums] = {}  # the eval split's activations alone

    def _kept(self, rows: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.include_outliers:
            return rows
        keep = ~rows["outlier"]
        return {k: v[keep] for k, v in rows.items()}

    def add_forward(self, layer: int, rows: dict[str, torch.Tensor]) -> None:
        """The metric pass's residuals at `layer` (h, outlier): summed for C."""
        h = self._kept(rows)["h"].double()
        assert self._forward is not None  # asked for only where wants_forward
        xx, x, n = self._forward[layer] or (0.0, 0.0, 0)
        self._forward[layer] = (xx + h.T @ h, x + h.sum(0), n + len(h))

    def forward_done(self) -> None:
        """C at every layer is known: open the activation-weighted sums."""
        acts_n = self.n_sequences["activations"]
        assert self._forward is not None  # asked for only where wants_forward
        for i in self.layers:
            forward = self._forward[i]
            assert forward is not None  # the metric pass reached every layer
            xx, x, n = forward
            mu = x / n
            metric = root(xx / n - torch.outer(mu, mu))
            self.weighted[i] = {
                r: BlockSums(
                    self.d, self.blocks[r], False, self.device, SUM_DTYPE, self.seq_len, metric
                )
                for r in self.direct
            }
            alone = [r for r in self.direct if self.n_sequences[r] != acts_n]
            if alone:
                blocks = self.blocks[alone[0]]
                self.metric_sums[i] = BlockSums(
                    self.d, blocks, True, self.device, SUM_DTYPE, self.seq_len
                )
        self._forward, self.wants_forward = None, False

    def add(self, layer: int, rows: dict[str, torch.Tensor]) -> None:
        rows = self._kept(rows)
        sums = self.sums[layer]
        twins = self.weighted.get(layer, {})
        given = [r for r in sums if all(f in rows for f in READINGS[r])]
        for n in {self.n_sequences[r] for r in given}:
            group = {r: sums[r] for r in given if self.n_sequences[r] == n}
            blocks = block_of(rows["seq"], self.blocks[next(iter(group))], n)
            add_rows(group, rows, blocks, self.seq_len)
            add_rows({r: twins[r] for r in group if r in twins}, rows, blocks, self.seq_len)
            if layer in self.metric_sums and "activations" not in group:
                add_rows({"activations": self.metric_sums[layer]}, rows, blocks, self.seq_len)

    def metric_of(self, layer: int, reading: str, sums: dict[str, BlockSums]) -> BlockSums:
        """The activations' sums in the blocks `reading` is cut into."""
        if self.n_sequences[reading] == self.n_sequences["activations"]:
            return sums["activations"]
        return self.metric_sums[layer]


def estimates(
    acc: Accumulator,
    cfg: AnalysisConfig,
    seed: int,
    probes: dict[str, int],
    progress: bool = False,
) -> dict[int, dict[str, SigmaEstimate]]:
    """Each layer's estimates, as kappa.measure makes them (the seeds alike) with the
    profile's blocks and debias.LIGHT; each layer's sums freed once used."""
    out = {}
    for layer in bar(acc.layers, desc="profile", unit="layer", enabled=progress):
        sums = acc.sums.pop(layer)
        twins = acc.weighted.pop(layer, {})
        found = {}
        for k, (r, s) in enumerate(sums.items()):
            c = replace(cfg, blocks=acc.blocks[r])
            found[r] = estimate(r, s, c, seed + k, probes.get(r, 1), debias.LIGHT)
            if r in twins:
                acts = acc.metric_of(layer, r, sums)
                twin = weighted_estimate(
                    r, twins[r], s, acts, c, seed + k, probes.get(r, 1), debias.LIGHT
                )
                kept = {key: getattr(twin, key) for key in KEPT}
                found[r] = found[r]._replace(activation_weighted=kept)
        acc.metric_sums.pop(layer, None)
        out[layer] = with_common_mode(found, sums)
    return out


def profile_results(
    found: dict[int, dict[str, SigmaEstimate]], acc: Accumulator, layer: int
) -> dict:
    """results.json's "profile": per layer and reading, the kept numbers (the
    activations' reference line has no corrected erank: its plug-in stands alone)."""
    layers = {
        str(i): {r: {k: getattr(e, k) for k in KEPT_WITH_TWIN} for r, e in ests.items()}
        for i, ests in found.items()
    }
    return {
        "layers": layers,
        "run_layer": layer,
        "blocks": max(acc.blocks.values()),
        "correction": debias.LIGHT._asdict(),
    }
