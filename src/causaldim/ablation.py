"""AtP against real ablation, the check the paper did not make.

AtP is first order. For a stratified sample of features per width, each feature is
really zeroed (h <- h - f_i(h) d_i at every non-outlier position of layer L where it
fires; layers L+1 onward re-run) and the change in each sequence's summed next-token
loss is measured. Its first-order prediction from the store is sum_t f_i(t) (g_t . d_i)
over the sequence. Per feature, both are averaged over sequences as |change| per token,
so that they are on the scale of AtP (a mean over tokens).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager, nullcontext

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import spearmanr

from .devices import placed
from .models import LoadedModel
from .sae import SAE
from .score import Scores
from .store import Store
from .wedge import calibrate


def editable(hidden: torch.Tensor, threshold: float) -> torch.Tensor:
    """[B, T] where an ablation edits: every position past 0 with norm within threshold
    (the store's outliers are left alone, as AtP leaves them out)."""
    mask = hidden.norm(dim=-1) <= threshold
    mask[:, 0] = False
    return mask


@contextmanager
def edited_block(
    lm: LoadedModel, layer: int, edit: Callable[[torch.Tensor], torch.Tensor], threshold: float
):
    """While inside, block `layer`'s output h is replaced by edit(h) where editable."""

    def hook(module, args, output):
        hidden = (output[0] if isinstance(output, tuple) else output).clone()
        mask = editable(hidden, threshold)
        hidden[mask] = edit(hidden[mask].float()).to(hidden.dtype)
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    handle = lm.layers[layer].register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


@torch.no_grad()
def sequence_losses(
    lm: LoadedModel,
    layer: int,
    ids: torch.Tensor,
    edit: Callable[[torch.Tensor], torch.Tensor] | None,
    threshold: float,
) -> torch.Tensor:
    """[batch] summed next-token loss over every prediction (the loss the store's g is the
    gradient of), with block `layer`'s output replaced by edit(h) where editable."""
    ids = ids.to(lm.device)
    with edited_block(lm, layer, edit, threshold) if edit is not None else nullcontext():
        logits = lm.model(input_ids=ids, use_cache=False).logits
    # float64: a feature's effect is a small difference of two sums of ~seq_len losses
    losses = F.cross_entropy(logits[:, :-1].transpose(1, 2).double(), ids[:, 1:], reduction="none")
    return losses.sum(1).cpu()


def eval_sequences(store: Store, n: int) -> torch.Tensor:
    """The first n eval sequences' token ids, [n, seq_len], from the store itself."""
    seq_len, rows = store.manifest["seq_len"], []
    for batch in store.batches("eval", ("token",), n * seq_len, drop_outliers=False):
        rows.append(batch["token"])
        break
    return torch.cat(rows).long().view(-1, seq_len)[:n]


def zero_feature(sae: SAE, feature: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def edit(h: torch.Tensor) -> torch.Tensor:
        return h - sae.encode(h)[:, feature : feature + 1] * sae.W_dec[feature]

    return edit


@torch.no_grad()
def first_order(sae: SAE, store: Store, n_sequences: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per eval sequence (the first n_sequences) and feature: sum_t f_i(t) (g_t . d_i) over
    its non-outlier tokens, and whether the feature fires there at all. [seqs, width],
    computed on the SAE's device, returned on the CPU."""
    device = sae.b_dec.device
    linear = torch.zeros(n_sequences, sae.cfg.width, dtype=torch.float64, device=device)
    fires = torch.zeros(n_sequences, sae.cfg.width, dtype=torch.int32, device=device)
    for batch in store.batches("eval", ("h", "g", "seq"), 4096):
        keep = batch["seq"] < n_sequences
        if not keep.any():
            continue
        h, g = batch["h"][keep].to(device), batch["g"][keep].to(device)
        seq = batch["seq"][keep].long().to(device)
        f = sae.encode(h)
        linear.index_add_(0, seq, (f * (g @ sae.W_dec.T)).double())
        fires.index_add_(0, seq, (f > 0).int())
    return linear.cpu(), fires.cpu() > 0


def sample_features(atp: torch.Tensor, fired: torch.Tensor, n: int, gen: torch.Generator):
    """Half the sample from the top of the AtP ranking, the rest drawn evenly from the
    quartiles of log AtP among the other firing features."""
    order = atp.argsort(descending=True)
    order = order[fired[order] > 0]
    top, rest = order[: n // 2], order[n // 2 :]
    left = n - len(top)
    picks = [top]
    for j, quartile in enumerate(rest.tensor_split(4) if len(rest) else []):
        take = left // 4 + (j < left % 4)
        picks.append(quartile[torch.randperm(len(quartile), generator=gen, device="cpu")[:take]])
    return torch.cat(picks).sort().values


def atp_vs_ablation(
    lm: LoadedModel,
    store: Store,
    saes: dict[int, SAE],
    scores: dict[int, Scores],
    epsilon: float,
    percentile: float,
    n_features: int = 16,
    n_sequences: int = 16,
    batch_size: int = 4,
    seed: int = 0,
) -> dict:
    """Per width: real and first-order effects of the sampled features, their Spearman
    correlations with AtP, and which features are truly causal (real effect above the
    same percentile calibration on the first-order sequence effects of the reference
    width) but below epsilon by AtP (missed), or the reverse."""
    layer, threshold = store.manifest["layer"], store.manifest["outliers"]["threshold"]
    ids = eval_sequences(store, n_sequences)
    n_tokens = ids.shape[0] * (ids.shape[1] - 1)
    clean = torch.cat(
        [sequence_losses(lm, layer, b, None, threshold) for b in ids.split(batch_size)]
    )
    gen = torch.Generator().manual_seed(seed)
    rows, epsilon_seq = [], None
    for width, sae in sorted(saes.items()):
        with placed(sae, lm.device):  # one SAE at a time on the model's device
            linear, fires = first_order(sae, store, len(ids))
            linear_effect = linear.abs().sum(0) / n_tokens  # [width]
            if width == min(saes):
                epsilon_seq = calibrate(linear_effect, percentile)
            feats = sample_features(scores[width].atp, scores[width].fired, n_features, gen)
            real = [
                _real_effect(
                    lm, layer, ids, clean, fires[:, i], zero_feature(sae, i), threshold, batch_size
                )
                / n_tokens
                for i in feats.tolist()
            ]
        real_t = torch.tensor(real, dtype=torch.float64, device="cpu")
        atp = scores[width].atp[feats]
        truly = real_t > epsilon_seq
        by_atp = atp > epsilon
        rows.append(
            {
                "width": width,
                "features": feats.tolist(),
                "atp": atp.tolist(),
                "first_order": linear_effect[feats].tolist(),
                "real": real,
                "spearman_real_atp": _spearman(real_t, atp),
                "spearman_real_first_order": _spearman(real_t, linear_effect[feats]),
                "n_truly_causal": int(truly.sum()),
                "n_missed_by_atp": int((truly & ~by_atp).sum()),
                "n_false_alarms": int((~truly & by_atp).sum()),
            }
        )
    missed = sum(r["n_missed_by_atp"] for r in rows)
    truly_total = sum(r["n_truly_causal"] for r in rows)
    return {
        "n_sequences": len(ids),
        "n_tokens": n_tokens,
        "epsilon": epsilon,
        "epsilon_sequence_level": epsilon_seq,
        "rows": rows,
        "missed_fraction": missed / truly_total if truly_total else None,
        "spearman_real_atp_pooled": _spearman(
            torch.tensor([v for r in rows for v in r["real"]], device="cpu"),
            torch.tensor([v for r in rows for v in r["atp"]], device="cpu"),
        ),
    }


def _real_effect(lm, layer, ids, clean, fires, edit, threshold, batch_size) -> float:
    """Sum over the sequences where the feature fires of |loss(ablated) - loss(clean)|."""
    seqs, total = fires.nonzero()[:, 0], 0.0
    for b in seqs.split(batch_size) if len(seqs) else ():
        ablated = sequence_losses(lm, layer, ids[b], edit, threshold)
        total += float((ablated - clean[b]).abs().sum())
    return total


def _spearman(a: torch.Tensor, b: torch.Tensor) -> float | None:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    return float(spearmanr(a, b).statistic)
