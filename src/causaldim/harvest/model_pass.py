"""The model pass over one batch of sequences: residuals at the tapped blocks (train
split, the forward stopped at the highest), residuals with the loss gradient and the
probe products (eval split, backward from the loss and the probes down to the lowest), or
residuals with the logit probes' products alone (the headline pass: the forward stops at
the output head's input and the backward starts there)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import NamedTuple, cast

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


class HeadProbes(NamedTuple):
    """The logit probes drawn in the model's width. For v ~ N(0, I_V) over the vocabulary
    and a linear head W [V, d], the centred part c = v - mean(v) reaches the head's input
    as W^T c ~ N(0, W^T C W), C = I - 1 1^T / V, and the shift part mean(v) 1 as m W^T 1,
    m ~ N(0, 1/V), independent of it: drawing those two from a d x d factor gives u = J^T c
    and J^T (mean(v) 1) exactly in distribution, at d^2 a position instead of d V."""

    factor: torch.Tensor  # [d, d], F F^T = W^T C W (float32, on the head's device)
    ones: torch.Tensor  # [d], W^T 1
    vocab: int

    def draw(self, shape: torch.Size, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
        """One probe at every position of shape [B, T]: (W^T c, W^T mean(v) 1), each
        [B, T, d], drawn on the CPU (generator's device), so every device gets the same."""
        cpu = generator.device if generator is not None else torch.device("cpu")
        z = torch.randn(*shape, len(self.ones), generator=generator, device=cpu)
        m = torch.randn(*shape, 1, generator=generator, device=cpu)
        z, m = z.to(self.factor.device), m.to(self.factor.device) / self.vocab**0.5
        return z @ self.factor.T, m * self.ones


def head_probes(lm: LoadedModel, chunk: int = 16_384) -> HeadProbes | None:
    """The probes drawn in the model's width, or None where the logits are not the linear
    head's own output (Gemma 2's soft-capping, a scaled head: a map of the logits that
    depends on the token), which keeps the probes over the vocabulary."""
    if not _linear_head(lm):
        return None
    head = lm.model.get_output_embeddings()
    assert head is not None  # linear, as _linear_head found
    return _factor(head.weight.detach(), chunk)


def centred_gram(w: torch.Tensor, chunk: int = 16_384) -> tuple[torch.Tensor, torch.Tensor]:
    """W^T P W (P centring over the rows) in float64, and the rows' sum, of a head's
    weight [V, d]; chunked, so that no float64 copy of the whole head is made."""
    d = w.shape[1]
    gram = torch.zeros(d, d, dtype=torch.float64, device=w.device)
    ones = torch.zeros(d, dtype=torch.float64, device=w.device)
    for rows in w.split(chunk):
        rows = rows.double()
        gram += rows.T @ rows
        ones += rows.sum(0)
    return gram - torch.outer(ones, ones) / len(w), ones


def _factor(w: torch.Tensor, chunk: int = 16_384) -> HeadProbes:
    """HeadProbes of a linear head's weight [V, d]."""
    centred, ones = centred_gram(w, chunk)
    values, vectors = torch.linalg.eigh(centred)
    factor = vectors * values.clamp_min(0).sqrt()
    return HeadProbes(factor.float(), ones.float(), len(w))


def _linear_head(lm: LoadedModel) -> bool:
    """Whether the model's logits are its output head's own output, the head linear:
    one token through the model."""
    ids = torch.zeros(1, 1, dtype=torch.long, device=lm.device)
    with torch.no_grad(), _head_io(lm) as head:
        logits = lm.model(input_ids=ids, use_cache=False).logits
    return head.get("output") is logits and isinstance(head.get("module"), nn.Linear)


class Gradients(NamedTuple):
    h: torch.Tensor  # [B, T, d]
    g: torch.Tensor | None  # [B, T, d], d(summed next-token loss)/dh; None: headline pass
    # v ~ N(0, I_vocab) at every position, split into v = c + s: c = v - mean(v) (sum-zero,
    # the part softmax can see) and s = mean(v) 1 (a shift of all logits, which it ignores)
    u_logits: torch.Tensor | None  # [B, T, K, d], J^T c: the gauge-invariant reading
    u_shift: torch.Tensor | None  # [B, T, K, d], J^T s: u_logits + u_shift is J^T v
    u_fisher: torch.Tensor | None  # [B, T, K, d], J^T (onehot(y) - p), y ~ softmax
    loss_sum: float
    n_predictions: int


def _pull_back(outputs: torch.Tensor, hs: list[torch.Tensor], grads: list[torch.Tensor]):
    """[B, T, K, d] per block: each grad pulled back from outputs; None if none."""
    per_probe = [torch.autograd.grad(outputs, hs, v, retain_graph=True) for v in grads]
    if not per_probe:
        return [None] * len(hs)
    return [torch.stack(us, dim=2) for us in zip(*per_probe, strict=True)]


def _probes_at_head(x: torch.Tensor, hs, probes: HeadProbes | None, k: int, generator):
    """The logit probes' products pulled back from the head's input x: (centred, shift);
    probes None only where there are none to draw (k = 0)."""
    drawn = [probes.draw(x.shape[:-1], generator) for _ in range(k)] if probes is not None else []
    centred = _pull_back(x, hs, [c.to(x.dtype) for c, _ in drawn])
    shift = _pull_back(x, hs, [s.to(x.dtype) for _, s in drawn])
    return centred, shift


def grads_at(
    lm: LoadedModel,
    layers,
    ids: torch.Tensor,
    logit_probes: int = 0,
    fisher_probes: int = 0,
    generator: torch.Generator | None = None,
    probes: HeadProbes | None = None,
) -> dict[int, Gradients]:
    """h and g = dLoss/dh at each of the blocks `layers`, Loss = next-token cross-entropy
    summed over all positions, from one forward: each backward runs down to the lowest
    block and yields every block's gradient on the way. Each probe adds one more backward
    (the forward is shared; the probes are shared by all blocks): a Gaussian probe costs
    two, one for its centred part and one for its shift part.

    Where the logits are the output head's own output (no soft-capping or scaling after
    it), every backward starts below the head: the loss's and the Fisher probe's
    pull-backs through it are sums of its rows (p W, W[y]) that need one p W product a
    batch, and the Gaussian probes are drawn in the model's width (HeadProbes: `probes`,
    computed from the head's weight if not given)."""
    blocks = _blocks(lm, layers)
    ids = ids.to(lm.device)
    with torch.enable_grad(), tap_blocks(blocks, "leaf") as captured, _head_io(lm) as head:
        logits = lm.model(input_ids=ids, use_cache=False).logits
        loss = F.cross_entropy(
            logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="sum"
        )
        hs = [captured[i] for i in blocks]
        below_head = head.get("output") is logits and isinstance(head.get("module"), nn.Linear)
        if below_head:
            draws = fisher_draws(logits, fisher_probes, generator)
            x, w = head["input"], head["module"].weight.detach()
            pw = (logits.detach().float().softmax(-1) @ w.float()).to(x.dtype)  # [B, T, d]
            to_loss = pw - w[ids.roll(-1, dims=1)]
            to_loss[:, -1] = 0  # the last position predicts nothing
            gs = _pull_back(x, hs, [to_loss])
            u_fisher = _pull_back(x, hs, [w[y] - pw for y in draws])
            if probes is None and logit_probes:
                probes = _factor(w)
            u_logits, u_shift = _probes_at_head(x, hs, probes, logit_probes, generator)
        else:
            centred, means = gaussian_probes(logits, logit_probes, generator)
            draws = fisher_draws(logits, fisher_probes, generator)
            gs = _pull_back(loss, hs, [torch.ones_like(loss)])
            u_shift = _pull_back(logits, hs, [m.expand_as(logits) for m in means])
            p = logits.detach().float().softmax(-1)
            fisher = [_fisher_probe(p, y).to(logits.dtype) for y in draws]
            u_fisher = _pull_back(logits, hs, fisher)
            u_logits = _pull_back(logits, hs, centred)
    gs = [g[:, :, 0] for g in cast("list[torch.Tensor]", gs)]  # the loss's: never None
    n_pred = ids[:, 1:].numel()
    return {
        i: Gradients(h.detach(), g, ul, us, uf, loss.item(), n_pred)
        for i, h, g, ul, us, uf in zip(blocks, hs, gs, u_logits, u_shift, u_fisher, strict=True)
    }


def headline_at(
    lm: LoadedModel,
    layers,
    ids: torch.Tensor,
    logit_probes: int,
    probes: HeadProbes,
    generator: torch.Generator | None = None,
) -> dict[int, Gradients]:
    """h and the logit probes' centred products at each of the blocks `layers`, with no
    head: the forward stops at the head's input, the probes are drawn there (HeadProbes)
    and the backward starts there. Only what the headline reads: no shift part (the
    literal reading's), no loss, gradient or Fisher product (they need the logits), so
    u_shift, g and u_fisher are None, the loss 0; one backward a probe, as the body's
    floor has."""
    blocks = _blocks(lm, layers)
    ids = ids.to(lm.device)
    head = lm.model.get_output_embeddings()
    assert head is not None  # linear: the probes were drawn from it
    seen: dict = {}

    def stop(module, args):
        seen["input"] = args[0]
        raise StopForward

    handle = head.register_forward_pre_hook(stop)
    try:
        with torch.enable_grad(), tap_blocks(blocks, "leaf") as captured:
            try:
                lm.model(input_ids=ids, use_cache=False)
            except StopForward:
                pass
            hs = [captured[i] for i in blocks]
            x = seen["input"]
            # drawn as the full pass draws them (centred, shift), the shift part unused
            drawn = [probes.draw(x.shape[:-1], generator)[0] for _ in range(logit_probes)]
            u_logits = _pull_back(x, hs, [c.to(x.dtype) for c in drawn])
    finally:
        handle.remove()
    return {
        i: Gradients(h.detach(), None, ul, None, None, 0.0, 0)
        for i, h, ul in zip(blocks, hs, u_logits, strict=True)
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
