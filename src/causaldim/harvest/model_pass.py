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
    # v ~ N(0, I_vocab) at every position, split into v = c + s: c = v - mean(v) (sum-zero,
    # the part softmax can see) and s = mean(v) 1 (a shift of all logits, which it ignores)
    u_logits: torch.Tensor | None  # [B, T, K, d], J^T c: the gauge-invariant reading
    u_shift: torch.Tensor | None  # [B, T, K, d], J^T s: u_logits + u_shift is J^T v
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
    from the logits (the forward is shared; the probes are shared by all blocks): a
    Gaussian probe costs two, one for its centred part and one for its shift part."""
    blocks = _blocks(lm, layers)
    ids = ids.to(lm.device)
    with torch.enable_grad(), tap_blocks(blocks, "leaf") as captured:
        logits = lm.model(input_ids=ids, use_cache=False).logits
        loss = F.cross_entropy(
            logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="sum"
        )
        hs = [captured[i] for i in blocks]
        backwards_left = 2 * logit_probes + fisher_probes
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

        centred, shifts = gaussian_probes(logits, logit_probes, generator)
        u_logits = pull_back(centred)
        u_shift = pull_back(shifts)
        u_fisher = pull_back(fisher_probes_for(logits, fisher_probes, generator))
    n_pred = ids[:, 1:].numel()
    return {
        i: Gradients(h.detach(), g, ul, us, uf, loss.item(), n_pred)
        for i, h, g, ul, us, uf in zip(blocks, hs, gs, u_logits, u_shift, u_fisher, strict=True)
    }


def gaussian_probes(
    logits: torch.Tensor, k: int, generator=None
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """k probes v ~ N(0, I) over the vocabulary at every position, each split into its
    centred part c = v - mean(v) and its shift part s = mean(v) 1 (independent Gaussians):
    E[J^T c c^T J] = J^T (I - 1 1^T / V) J, the Jacobian the softmax output sees, and
    J^T (c + s) is the uncentred probe's J^T v. Drawn on the CPU (generator's device), so
    that every device gets the same probes."""
    centred, shifts = [], []
    for _ in range(k):
        v = torch.randn(logits.shape, generator=generator, dtype=torch.float32, device="cpu")
        mean = v.mean(-1, keepdim=True)
        centred.append((v - mean).to(logits.device, logits.dtype))
        shifts.append(mean.expand_as(v).to(logits.device, logits.dtype))
    return centred, shifts


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
