"""Next-token loss with the residual at block L replaced: the SAE's reconstruction (how
much of the model's loss the SAE keeps: "CE loss recovered") or its mean (the floor).
Outlier positions (position 0 and huge norms, which SAEs are not trained on) keep their
true residual and are left out of the loss."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from .devices import placed
from .models import LoadedModel


@torch.no_grad()
def spliced_loss(
    lm: LoadedModel,
    layer: int,
    ids: torch.Tensor,
    replace: Callable[[torch.Tensor], torch.Tensor] | None,
    threshold: float,
) -> tuple[float, int]:
    """Summed next-token loss over predictions made from non-outlier positions, with
    block `layer`'s output replaced there by replace(h) (None: unchanged); and their count."""
    keep: list[torch.Tensor] = []

    def hook(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        mask = hidden.norm(dim=-1) <= threshold
        mask[:, 0] = False
        keep.append(mask)
        if replace is not None:
            flat = hidden[mask]
            hidden = hidden.clone()
            hidden[mask] = replace(flat.float()).to(hidden.dtype)
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    ids = ids.to(lm.device)
    handle = lm.layers[layer].register_forward_hook(hook)
    try:
        logits = lm.model(input_ids=ids, use_cache=False).logits
    finally:
        handle.remove()
    losses = F.cross_entropy(
        logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="none"
    )
    mask = keep[0][:, :-1].flatten()
    return float(losses[mask].sum()), int(mask.sum())


def ce_loss_recovered(
    lm: LoadedModel,
    layer: int,
    seqs: torch.Tensor,
    saes: dict[str, torch.nn.Module],
    mean: torch.Tensor,
    threshold: float,
    batch_size: int = 8,
) -> dict:
    """Clean, mean-ablated and per-SAE spliced mean losses, and for each SAE
    (L_ablated - L_sae) / (L_ablated - L_clean)."""
    mean = mean.to(lm.device)
    replacements = {"clean": None, "mean_ablated": lambda h: mean.expand_as(h)}
    replacements.update({name: sae for name, sae in saes.items()})
    totals = dict.fromkeys(replacements, 0.0)
    count = 0
    for name, fn in replacements.items():  # one SAE at a time on the model's device
        with placed(fn, lm.device) if isinstance(fn, torch.nn.Module) else nullcontext():
            for start in range(0, len(seqs), batch_size):
                loss, n = spliced_loss(lm, layer, seqs[start : start + batch_size], fn, threshold)
                totals[name] += loss
                count += n if name == "clean" else 0  # the same predictions for every one
    means = {k: v / count for k, v in totals.items()}
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
