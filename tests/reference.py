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
