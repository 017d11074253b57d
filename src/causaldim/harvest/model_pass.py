"""The model pass over one batch of sequences: residuals at the tapped blocks (train
split, the forward stopped at the highest), or residuals with the loss gradient and the
probe products (eval split, backward from the loss and the probes down to the lowest)."""

from __future__ import annotations

from contextlib import contextmanager
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
    Gaussian probe costs two, one for its centred part and one for its shift part.

    Where the logits are the output head's own output (no soft-capping or scaling after
    it), the loss, shift and Fisher backwards start below the head: their pull-backs
    through it are sums of its rows (p W, W[y], 1^T W) that need one p W product a batch
    instead of a [vocab x d] product a backward."""
    blocks = _blocks(lm, layers)
    ids = ids.to(lm.device)
    with torch.enable_grad(), tap_blocks(blocks, "leaf") as captured, _head_io(lm) as head:
        logits = lm.model(input_ids=ids, use_cache=False).logits
        loss = F.cross_entropy(
            logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="sum"
        )
        hs = [captured[i] for i in blocks]
        below_head = head.get("output") is logits and isinstance(head.get("module"), nn.Linear)

        def pull_back(outputs: torch.Tensor, grads: list[torch.Tensor]) -> list:
            """[B, T, K, d] per block: each grad pulled back from outputs; None if none."""
            per_probe = [torch.autograd.grad(outputs, hs, v, retain_graph=True) for v in grads]
            if not per_probe:
                return [None] * len(hs)
            return [torch.stack(us, dim=2) for us in zip(*per_probe, strict=True)]

        centred, means = gaussian_probes(logits, logit_probes, generator)
        draws = fisher_draws(logits, fisher_probes, generator)
        if below_head:
            x, w = head["input"], head["module"].weight.detach()
            pw = (logits.detach().float().softmax(-1) @ w.float()).to(x.dtype)  # [B, T, d]
            to_loss = pw - w[ids.roll(-1, dims=1)]
            to_loss[:, -1] = 0  # the last position predicts nothing
            ones_w = w.sum(0)
            gs = pull_back(x, [to_loss])
            u_shift = pull_back(x, [m * ones_w for m in means])
            u_fisher = pull_back(x, [w[y] - pw for y in draws])
        else:
            gs = pull_back(loss, [torch.ones_like(loss)])
            u_shift = pull_back(logits, [m.expand_as(logits) for m in means])
            p = logits.detach().float().softmax(-1)
            u_fisher = pull_back(logits, [_fisher_probe(p, y).to(logits.dtype) for y in draws])
        u_logits = pull_back(logits, centred)
    gs = [g[:, :, 0] for g in gs]
    n_pred = ids[:, 1:].numel()
    return {
        i: Gradients(h.detach(), g, ul, us, uf, loss.item(), n_pred)
        for i, h, g, ul, us, uf in zip(blocks, hs, gs, u_logits, u_shift, u_fisher, strict=True)
    }


@contextmanager
def _head_io(lm: LoadedModel):
    """The output head's module, input and output of the forward run inside."""
    head = lm.model.get_output_embeddings()
    seen: dict = {"module": head}
    if head is None:
        yield seen
        return

    def hook(module, args, output):
        seen["input"], seen["output"] = args[0], output

    handle = head.register_forward_hook(hook)
    try:
        yield seen
    finally:
        handle.remove()


def gaussian_probes(
    logits: torch.Tensor, k: int, generator=None
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """k probes v ~ N(0, I) over the vocabulary at every position, each split into its
    centred part c = v - mean(v) and its shift part s = mean(v) 1 (independent Gaussians),
    returned as c [B, T, vocab] and mean(v) [B, T, 1]: E[J^T c c^T J] = J^T (I - 1 1^T / V) J,
    the Jacobian the softmax output sees, and J^T (c + s) is the uncentred probe's J^T v.
    Drawn on the CPU (generator's device), so that every device gets the same probes."""
    centred, means = [], []
    for _ in range(k):
        v = torch.randn(logits.shape, generator=generator, dtype=torch.float32, device="cpu")
        mean = v.mean(-1, keepdim=True)
        centred.append((v - mean).to(logits.device, logits.dtype))
        means.append(mean.to(logits.device, logits.dtype))
    return centred, means


def fisher_draws(logits: torch.Tensor, k: int, generator=None) -> list[torch.Tensor]:
    """k draws y [B, T] from the model's own softmax at every position."""
    if k == 0:
        return []
    p = logits.detach().float().softmax(-1)
    flat = p.reshape(-1, p.shape[-1])
    # Inverse-CDF sampling: one cumsum shared by all probes (torch.multinomial is ~10x
    # slower than the whole cumsum at a 49k vocabulary).
    cdf = flat.cumsum(-1)
    draws = []
    for _ in range(k):
        u = torch.rand(len(flat), 1, generator=generator, dtype=cdf.dtype, device="cpu")
        r = u.to(cdf.device) * cdf[:, -1:]
        y = torch.searchsorted(cdf, r, right=True).clamp_max(flat.shape[-1] - 1)
        draws.append(y.view(p.shape[:-1]))
    return draws


def _fisher_probe(p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """v = onehot(y) - p, [B, T, vocab]."""
    v = -p.clone()
    v.scatter_add_(-1, y[..., None], torch.ones_like(y[..., None], dtype=v.dtype))
    return v


def fisher_probes_for(logits: torch.Tensor, k: int, generator=None) -> list[torch.Tensor]:
    """v = onehot(y) - p with y drawn from the model's own softmax p at every position:
    E[v v^T] = diag(p) - p p^T, so E[u u^T] is the output Fisher pulled back to L."""
    p = logits.detach().float().softmax(-1)
    return [_fisher_probe(p, y).to(logits.dtype) for y in fisher_draws(logits, k, generator)]
