"""Attribution patching from the store alone: for an SAE spliced in at layer L with its
error term held constant, dLoss/df_i = g . d_i, so the first-order effect of feature i on
a token is f_i (g . d_i). No model is loaded.

AtP_i = E_tokens |f_i (g . d_i)| (silent tokens contribute 0), with firing counts; the
last position of each sequence (it predicts nothing, g = 0) and outliers are left out.
Sums are kept per block of eval sequences, so that the counts can be bootstrapped.

Two normalisations of the same sums (config.ATP_NORMALISATIONS): "all", the mean over every scored
token (the paper's formula as written: a feature that fires rarely scores low), and
"firing", the mean over the tokens where the feature fires (its effect when present), for
features that fire at least min_firings times (the rest are too rare to score).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple, cast

import safetensors.torch
import torch

from ..devices import resolve_device
from ..errors import UsageError
from ..faults import fault_point
from ..fileio import atomic_write_bytes
from ..harvest.store import Store
from ..memory import dense_batch_tokens
from ..sae import SAE
from ..sae.formats import load

VV_GROUPS = 16


class Scores(NamedTuple):
    atp_sums: torch.Tensor  # [blocks, width] float64: sum over tokens of |f_i (g . d_i)|
    fired_counts: torch.Tensor  # [blocks, width]: tokens on which feature i fired
    tokens: torch.Tensor  # [blocks] tokens scored
    active: torch.Tensor  # [blocks] sum over tokens of the number of active features
    # [groups, d, d] float64: sum over tokens of v v^T, v = sum_i f_i (g . d_i) d_i, the
    # loss gradient seen through the active features (attributed.py), in at most
    # VV_GROUPS groups of consecutive blocks (d x d each: the bootstrap needs a few, and
    # 64 of them at d = 2,304 would be 2.7 GB); empty if not scored
    vv_sums: torch.Tensor = torch.zeros(0)
    normalisation: str = "all"  # what `atp` divides the sums by (not saved: a reading)
    # under "firing": a feature with fewer eval firings has no AtP (0; too rare to score)
    min_firings: int = 1

    def normalised(self, normalisation: str, min_firings: int | None = None) -> Scores:
        floor = self.min_firings if min_firings is None else min_firings
        return self._replace(normalisation=normalisation, min_firings=floor)

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.sum())

    @property
    def atp(self) -> torch.Tensor:
        """[width] mean |f_i (g . d_i)| over the scored tokens, or over those where
        feature i fires (normalisation "firing"; 0 where it fires fewer than min_firings
        times: one or two firings would score a feature by its largest single effect)."""
        return self.resample()[0]

    @property
    def too_rare(self) -> torch.Tensor:
        """[width] bool: fires, but too rarely to be scored (normalisation "firing" only)."""
        fired = self.fired
        if self.normalisation != "firing":
            return torch.zeros(len(fired), dtype=torch.bool, device=fired.device)
        return (fired > 0) & (fired < self.min_firings)

    @property
    def fired(self) -> torch.Tensor:
        return self.fired_counts.sum(0)

    @property
    def mean_l0(self) -> float:
        return float(self.active.sum()) / max(self.n_tokens, 1)

    @property
    def n_repr(self) -> int:
        """Features that fire on at least one eval token."""
        return int((self.fired > 0).sum())

    def resample(self, weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(AtP, firing counts) with each block counted weights[b] times (default once)."""
        if weights is None:
            weights = torch.ones(len(self.tokens), dtype=torch.float64, device="cpu")
        w = weights.double()
        fired = w @ self.fired_counts.to(w.dtype)  # no copy: scoring stores float64
        if self.normalisation == "firing":
            atp = (w @ self.atp_sums) / fired.clamp_min(1.0)
            return atp.masked_fill(fired < self.min_firings, 0.0), fired
        return (w @ self.atp_sums) / max(float(w @ self.tokens.double()), 1.0), fired


def require_gradients(store: Store) -> None:
    if "g" not in store.manifest["splits"]["eval"]["fields"]:
        raise UsageError(
            f"the store {store.root} has no gradients (g) in its eval split, which AtP "
            "scoring needs; harvest a store with causaldim (harvest or run)"
        )


@torch.no_grad()
def atp_scores(sae: SAE, store: Store, blocks: int = 32, batch_tokens: int = 4096) -> Scores:
    """The Scores of sae, computed on its device (as many tokens at a time as fit, at most
    batch_tokens)."""
    require_gradients(store)
    width, device = sae.cfg.width, sae.b_dec.device
    blocks = store.blocks("eval", blocks)
    atp = torch.zeros(blocks, width, dtype=torch.float64, device=device)
    d, groups = sae.cfg.d_in, min(blocks, VV_GROUPS)
    vv = torch.zeros(groups, d, d, dtype=torch.float64, device=device)
    # exact counts, ready for resampling
    fired = torch.zeros(blocks, width, dtype=torch.float64, device=device)
    tokens = torch.zeros(blocks, dtype=torch.long, device="cpu")
    active_total = torch.zeros(blocks, dtype=torch.long, device="cpu")
    last = store.manifest["seq_len"] - 1
    batch_tokens = dense_batch_tokens(sae.cfg.d_in, width, batch_tokens, device)
    for batch in store.batches("eval", ("h", "g", "pos", "seq"), batch_tokens):
        keep = batch["pos"] < last
        h, g = batch["h"][keep].to(device), batch["g"][keep].to(device)
        block_of = store.block_of("eval", batch["seq"][keep], blocks).to(device)
        f = sae.encode(h)
        effect = f * (g @ sae.W_dec.T)  # [tokens, width]: f_i (g . d_i)
        v = effect @ sae.W_dec  # [tokens, d]: sum_i f_i (g . d_i) d_i
        effect.abs_()
        active = f > 0
        for b in block_of.unique().tolist():  # a batch spans one or two blocks
            rows = block_of == b
            atp[b] += effect[rows].sum(0, dtype=torch.float64)
            vv[b * groups // blocks] += (v[rows].T @ v[rows]).double()
            fired[b] += active[rows].sum(0)
            tokens[b] += int(rows.sum())
            active_total[b] += int(active[rows].sum())
    return Scores(atp.cpu(), fired.cpu(), tokens, active_total, vv.cpu())


def save_scores(scores: Scores, path: Path) -> None:
    tensors = {
        k: v for k, v in scores._asdict().items() if k not in ("normalisation", "min_firings")
    }
    atomic_write_bytes(path, safetensors.torch.save(tensors))


def load_scores(path: Path) -> Scores:
    # the tensor fields alone (normalisation and min_firings are not saved: their defaults)
    return Scores(**cast(dict[str, Any], safetensors.torch.load_file(path)))


class ScoreJob(NamedTuple):
    """Scoring one saved SAE, as plain data for an executor."""

    store: str
    sae_folder: str
    blocks: int
    batch_tokens: int
    out: str  # where the Scores go (at 1M features and 64 blocks, 1 GB: too big to return)


def score_job(job: ScoreJob, device: str = "cpu") -> str:
    """Score the SAE on device and write its Scores to job.out; returns that path."""
    fault_point("scores.sae")
    sae = load(job.sae_folder, resolve_device(device))
    save_scores(atp_scores(sae, Store(job.store), job.blocks, job.batch_tokens), Path(job.out))
    return job.out
