"""The model's next-token loss with block L's output edited where an edit applies
(position 0 and outlier norms keep their true residual): replaced by an SAE's
reconstruction ("CE loss recovered") or by its mean (the floor), or with one SAE
feature zeroed (a real ablation)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from ..devices import placed
from ..harvest.model_pass import residuals_at
from ..model.hooks import edited_block, starting_above
from ..model.load import LoadedModel
from ..sae import SAE


@torch.no_grad()
def spliced_loss(
    lm: LoadedModel,
    layer: int,
    ids: torch.Tensor,
    replace: Callable[[torch.Tensor], torch.Tensor] | None,
    threshold: float,
    hidden: torch.Tensor | None = None,
) -> tuple[float, int]:
    """Summed next-token loss over predictions made from non-outlier positions, with
    block `layer`'s output replaced there by replace(h) (None: unchanged); and their count.
    Given `hidden`, block `layer`'s clean output for these ids, only the blocks above run."""
    masks: list[torch.Tensor] = []
    ids = ids.to(lm.device)
    above = starting_above(lm, layer, hidden.to(lm.device)) if hidden is not None else nullcontext()
    with above, edited_block(lm, layer, replace, threshold, masks):
        logits = lm.model(input_ids=ids, use_cache=False).logits
    losses = F.cross_entropy(
        logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="none"
    )
    mask = masks[0][:, :-1].flatten()
    return float(losses[mask].sum()), int(mask.sum())


@torch.no_grad()
def sequence_losses(
    lm: LoadedModel,
    layer: int,
    ids: torch.Tensor,
    edit: Callable[[torch.Tensor], torch.Tensor] | None,
    threshold: float,
    hidden: torch.Tensor | None = None,
) -> torch.Tensor:
    """[batch] summed next-token loss over every prediction (the loss the store's g is the
    gradient of), with block `layer`'s output replaced by edit(h) where editable. Given
    `hidden`, block `layer`'s clean output for these ids, only the blocks above it run."""
    ids = ids.to(lm.device)
    above = starting_above(lm, layer, hidden.to(lm.device)) if hidden is not None else nullcontext()
    with above, edited_block(lm, layer, edit, threshold):
        logits = lm.model(input_ids=ids, use_cache=False).logits
    # float64: a feature's effect is a small difference of two sums of ~seq_len losses
    losses = F.cross_entropy(logits[:, :-1].transpose(1, 2).double(), ids[:, 1:], reduction="none")
    return losses.sum(1).cpu()


def zero_feature(sae: SAE, feature: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The edit h <- h - f_i(h) d_i: feature i really ablated, the rest of h kept."""

    def edit(h: torch.Tensor) -> torch.Tensor:
        return h - sae.encode(h)[:, feature : feature + 1] * sae.W_dec[feature]

    return edit


@torch.no_grad()
def block_outputs(
    lm: LoadedModel, layer: int, seqs: torch.Tensor, batch_size: int = 8
) -> list[torch.Tensor]:
    """Block `layer`'s clean output for each batch of seqs, once: every splice then runs
    only the blocks above it."""
    return [residuals_at(lm, (layer,), b)[layer] for b in seqs.split(batch_size)]


def ce_loss_recovered(
    lm: LoadedModel,
    layer: int,
    seqs: torch.Tensor,
    saes: Mapping[str, torch.nn.Module],
    mean: torch.Tensor | None,
    threshold: float,
    batch_size: int = 8,
    baseline: dict | None = None,
    hidden: list[torch.Tensor] | None = None,
) -> dict:
    """Clean, mean-ablated (by `mean`) and per-SAE spliced mean losses, and for each SAE
    (L_ablated - L_sae) / (L_ablated - L_clean). baseline: an earlier result on the same
    sequences, whose clean and mean-ablated losses are then not computed again; hidden:
    block_outputs of these sequences, computed once for every call."""
    replacements = {}
    if baseline is None:
        assert mean is not None  # the mean-ablated loss is computed here
        mean = mean.to(lm.device)
        replacements = {"clean": None, "mean_ablated": lambda h: mean.expand_as(h)}
    replacements.update({name: sae for name, sae in saes.items()})
    totals = dict.fromkeys(replacements, 0.0)
    count = 0
    batches = list(seqs.split(batch_size))
    hidden = hidden or block_outputs(lm, layer, seqs, batch_size)
    for name, fn in replacements.items():  # one SAE at a time on the model's device
        with placed(fn, lm.device) if isinstance(fn, torch.nn.Module) else nullcontext():
            for b, h in zip(batches, hidden, strict=True):
                loss, n = spliced_loss(lm, layer, b, fn, threshold, h)
                totals[name] += loss
                count += n if name == "clean" else 0  # the same predictions for every one
    if baseline:
        count = baseline["n_predictions"]
    means = {k: v / count for k, v in totals.items()}
    if baseline:
        means.update(clean=baseline["clean_loss"], mean_ablated=baseline["mean_ablated_loss"])
    gap = means["mean_ablated"] - means["clean"]
    return {
        "clean_loss": means["clean"],
        "mean_ablated_loss": means["mean_ablated"],
        "n_predictions": count,
        "saes": {
            name: {
                "loss": means[name],
                "ce_loss_recovered": (means["mean_ablated"] - means[name]) / gap,
            }
            for name in saes
        },
    }
