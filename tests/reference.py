"""Reference computations the tests hold the library against."""

from __future__ import annotations

import torch


def reference_grad(lm, layer: int, ids: torch.Tensor):
    """Autograd on the unmodified model, weights trainable as in ordinary training: record
    block L's output, differentiate the summed next-token loss with respect to it."""
    lm.model.requires_grad_(True)
    seen = []
    handle = lm.layers[layer].register_forward_hook(
        lambda m, a, out: seen.append(out[0] if isinstance(out, tuple) else out)
    )
    try:
        with torch.enable_grad():
            logits = lm.model(input_ids=ids, use_cache=False).logits
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten(), reduction="sum"
            )
            (g,) = torch.autograd.grad(loss, seen[0])
    finally:
        handle.remove()
        lm.model.requires_grad_(False)
    return seen[0].detach(), g


def reference_atp(lm, layer: int, sae, store) -> torch.Tensor:
    """AtP by autograd through the SAE spliced into the real model at block `layer`, its
    error term held constant: a per-(token, feature) scale s = 1 multiplies the SAE's
    features, and |dLoss/ds| is the first-order effect. Averaged over the store's eval
    tokens that scoring keeps (not outliers, not the last position)."""
    rows = next(store.shards("eval", ("token", "outlier", "pos")))
    seq_len = store.manifest["seq_len"]
    ids = rows["token"].long().view(-1, seq_len)
    scale = torch.ones(*ids.shape, sae.cfg.width, requires_grad=True)

    def splice(module, args, out):
        h = out[0] if isinstance(out, tuple) else out
        f = sae.encode(h)
        error = (h - sae.decode(f)).detach()
        new = sae.decode(f * scale) + error
        return (new, *out[1:]) if isinstance(out, tuple) else new

    handle = lm.layers[layer].register_forward_hook(splice)
    try:
        with torch.enable_grad():
            logits = lm.model(input_ids=ids, use_cache=False).logits
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten(), reduction="sum"
            )
            (grad,) = torch.autograd.grad(loss, scale)
    finally:
        handle.remove()
    keep = ~rows["outlier"].view(ids.shape) & (rows["pos"].view(ids.shape) < seq_len - 1)
    return grad[keep].abs().mean(0)
