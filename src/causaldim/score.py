"""Attribution patching from the store alone: for an SAE spliced in at layer L with its
error term held constant, dLoss/df_i = g . d_i, so the first-order effect of feature i on
a token is f_i (g . d_i). No model is loaded.

AtP_i = E_tokens |f_i (g . d_i)| (silent tokens contribute 0), with firing counts; the
last position of each sequence (it predicts nothing, g = 0) and outliers are left out.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .sae import SAE
from .store import Store


class Scores(NamedTuple):
    atp: torch.Tensor  # [width] mean |f_i (g . d_i)| over tokens
    fired: torch.Tensor  # [width] tokens on which feature i fired
    n_tokens: int
    mean_l0: float

    @property
    def n_repr(self) -> int:
        """Features that fire on at least one eval token."""
        return int((self.fired > 0).sum())


@torch.no_grad()
def atp_scores(sae: SAE, store: Store, batch_tokens: int = 4096) -> Scores:
    width = sae.cfg.width
    atp = torch.zeros(width, dtype=torch.float64)
    fired = torch.zeros(width, dtype=torch.long)
    n, active_total = 0, 0
    last = store.manifest["seq_len"] - 1
    for batch in store.batches("eval", ("h", "g", "pos"), batch_tokens):
        keep = batch["pos"] < last
        h, g = batch["h"][keep], batch["g"][keep]
        f = sae.encode(h)
        effect = f * (g @ sae.W_dec.T)  # [tokens, width]: f_i (g . d_i)
        atp += effect.abs().sum(0).double()
        active = f > 0
        fired += active.sum(0)
        active_total += int(active.sum())
        n += len(h)
    return Scores((atp / max(n, 1)).float(), fired, n, active_total / max(n, 1))
