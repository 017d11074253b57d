"""The model pass over one batch of sequences: residuals at the tapped blocks (train
split, the forward stopped at the highest), or residuals with the loss gradient and the
probe products (eval split, backward from the loss and the probes down to the lowest)."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..model.hooks import StopForward, tap_blocks
from ..model.load import LoadedModel


def _blocks(lm: LoadedModel, layers) -> dict[int, nn.Module]:
    return {i: lm.layers[i] for i in sorted(set(layers))}


def residuals_at(lm: LoadedModel, layers, ids: torch.Tensor) -> dict[int, torch.Tensor]:
    """h at the output of each of the blocks `layers`, [B, T, d]; the forward stops at the
    highest."""
    with torch.inference_mode(), tap_blocks(_blocks(lm, layers), "stop") as captured:
        try:
            lm.model(input_ids=ids.to(lm.device), use_cache=False)
        except StopForward:
            pass
    return captured


class Gradients(NamedTuple):
    h: torch.Tensor  # [B, T, d]
    g: torch.Tensor  # [B, T, d], d(summed next-token loss)/dh
    u_logits: torch.Tensor | None  # [B, T, K, d], J^T v with v ~ N(0, I) at every position
    u_fisher: torch.Tensor | None  # [B, T, K, d], J^T (onehot(y) - p), y ~ softmax
    loss_sum: float
    n_predictions: int


def grads_at(
    lm: LoadedModel,
    layers,
    ids: torch.Tensor,
    logit_probes: int = 0,
    fisher_probes: int = 0,
    generator: torch.Generator | None = None,
) -> dict[int, Gradients]:
    """h and g = dLoss/dh at each of the blocks `layers`, Loss = next-token cross-entropy
    summed over all positions, from one forward: each backward runs down to the lowest
    block and yields every block's gradient on the way. Each probe adds one more backward
    from the logits (the forward is shared; the probes are shared by all blocks)."""
    blocks = _blocks(lm, layers)
    ids = ids.to(lm.device)
    with torch.enable_grad(), tap_blocks(blocks, "leaf") as captured:
        logits = lm.model(input_ids=ids, use_cache=False).logits
        loss = F.cross_entropy(
            logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="sum"
        )
        hs = [captured[i] for i in blocks]
        backwards_left = logit_probes + fisher_probes
        gs = torch.autograd.grad(loss, hs, retain_graph=backwards_left > 0)

        def pull_back(probes: list[torch.Tensor]) -> list[torch.Tensor | None]:
            nonlocal backwards_left
            per_probe = []
            for v in probes:
                backwards_left -= 1
                per_probe.append(
                    torch.autograd.grad(logits, hs, v, retain_graph=backwards_left > 0)
                )
            if not per_probe:
                return [None] * len(hs)
            return [torch.stack(us, dim=2) for us in zip(*per_probe, strict=True)]

        u_logits = pull_back(gaussian_probes(logits, logit_probes, generator))
        u_fisher = pull_back(fisher_probes_for(logits, fisher_probes, generator))
    n_pred = ids[:, 1:].numel()
    return {
        i: Gradients(h.detach(), g, ul, uf, loss.item(), n_pred)
        for i, h, g, ul, uf in zip(blocks, hs, gs, u_logits, u_fisher, strict=True)
    }


def gaussian_probes(logits: torch.Tensor, k: int, generator=None) -> list[torch.Tensor]:
    """v ~ N(0, I) over the vocabulary at every position: E[J^T v v^T J] = J^T J. Drawn
    on the CPU (generator's device), so that every device gets the same probes."""
    return [
        torch.randn(logits.shape, generator=generator, dtype=torch.float32, device="cpu").to(
            logits.device, logits.dtype
        )
        for _ in range(k)
    ]


def fisher_probes_for(logits: torch.Tensor, k: int, generator=None) -> list[torch.Tensor]:
    """v = onehot(y) - p with y drawn from the model's own softmax p at every position:
    E[v v^T] = diag(p) - p p^T, so E[u u^T] is the output Fisher pulled back to L."""
    if k == 0:
        return []
    p = logits.detach().float().softmax(-1)
    flat = p.reshape(-1, p.shape[-1])
    # Inverse-CDF sampling: one cumsum shared by all probes (torch.multinomial is ~10x
    # slower than the whole cumsum at a 49k vocabulary).
    cdf = flat.cumsum(-1)
    probes = []
    for _ in range(k):
        u = torch.rand(len(flat), 1, generator=generator, dtype=cdf.dtype, device="cpu")
        r = u.to(cdf.device) * cdf[:, -1:]
        y = torch.searchsorted(cdf, r, right=True).clamp_max(flat.shape[-1] - 1)
        v = -flat.clone()
        v.scatter_add_(1, y, torch.ones_like(y, dtype=v.dtype))
        probes.append(v.view_as(p).to(logits.dtype))
    return probes
