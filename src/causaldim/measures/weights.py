"""What the weights alone predict of kappa, with no forward pass.

The raw kappa is an erank in the residual's own coordinates, and the model's norms decide
how much each coordinate moves the output. At the last block Sigma equals
diag(g) W_U^T P W_U diag(g) (g the final norm's gains, P = I - 1 1^T / V), and earlier
each dimension's share follows the squared gains of the norms that read the residual
after it (METHOD.md, "The metric of the residual stream": on Gemma 3 the erank of that
sum follows kappa / d over depth, correlation 0.96; SmolLM2's gains are flat). Per layer:

  unembedding          erank(W_U^T P W_U): the head alone, no gains
  unembedding_gained   erank(diag(g) W_U^T P W_U diag(g)): the head with the final gains
  later_gains          erank(diag(s)), s_i = sum of g_i^2 over the final norm and every
                       norm that reads the residual in the blocks after the layer

A norm's gains are read by passing sqrt(d) e_i through it (an RMSNorm's output is then
sqrt(d) g_i e_i whatever its convention, 1 + w or w); a LayerNorm's are its weight. The
norms that read the residual: a block's input norm, and its pre-MLP norm
(pre_feedforward_layernorm where there is one, else post_attention_layernorm, which in
Llama-like blocks reads the residual; a Gemma 2/3 post-norm reads a sublayer's output).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..harvest.model_pass import centred_gram
from ..model.load import LoadedModel
from .debias import erank_of

# the post-norms of Gemma 2/3 blocks read a sublayer's output, not the residual
POST_NORMS = ("post_feedforward_layernorm", "post_attention_layernorm")


def gains(norm: nn.Module, d: int) -> torch.Tensor:
    """The per-dimension gains of a norm layer [d], float64."""
    if isinstance(norm, nn.LayerNorm):
        return norm.weight.detach().double().cpu()
    p = next(norm.parameters())
    probe = torch.eye(d, dtype=p.dtype, device=p.device) * math.sqrt(d)
    with torch.no_grad():
        out = norm(probe[None])[0]
    return (out.diagonal().double() / math.sqrt(d)).cpu()


def _is_norm(module: nn.Module) -> bool:
    return "norm" in type(module).__name__.lower() and any(True for _ in module.parameters())


def residual_norms(block: nn.Module) -> list[nn.Module]:
    """The norms of one block that read the residual stream (see the module's docstring)."""
    found = {name: m for name, m in block.named_children() if _is_norm(m)}
    if "pre_feedforward_layernorm" in found:
        found = {k: m for k, m in found.items() if k not in POST_NORMS}
    found.pop("post_feedforward_layernorm", None)
    return list(found.values())


def final_norm(lm: LoadedModel) -> nn.Module | None:
    """The norm between the last block and the head: the last norm module outside the
    blocks."""
    inside = {id(m) for m in lm.layers.modules()}
    norms = [m for m in lm.model.modules() if id(m) not in inside and _is_norm(m)]
    return norms[-1] if norms else None


def predictors(lm: LoadedModel) -> dict:
    """results.json's "weights": the head's eranks and each layer's later-gains erank."""
    head = lm.model.get_output_embeddings()
    assert head is not None  # a causal LM's output head
    d = head.weight.shape[1]
    gram, _ = centred_gram(head.weight.detach())
    norm = final_norm(lm)
    g = gains(norm, d).to(gram.device) if norm is not None else torch.ones(d, dtype=torch.float64)
    gained = g[:, None] * gram * g[None, :]
    per_block = [sum(gains(n, d).pow(2) for n in residual_norms(b)) for b in lm.layers]
    later = g.cpu().pow(2)
    layers = {}
    for i in reversed(range(len(lm.layers))):  # s for layer i: the blocks after it
        layers[str(i)] = {"later_gains": erank_of(later), "later_gains_over_d": erank_of(later) / d}
        if torch.is_tensor(per_block[i]):
            later = later + per_block[i]
    head_erank = erank_of(torch.linalg.eigvalsh(gram).clamp_min(0))
    gained_erank = erank_of(torch.linalg.eigvalsh(gained).clamp_min(0))
    return {
        "d_model": d,
        "unembedding": head_erank,
        "unembedding_gained": gained_erank,
        "final_gains_range": [float(g.min()), float(g.max())] if norm is not None else None,
        "layers": dict(sorted(layers.items(), key=lambda kv: int(kv[0]))),
        "what": {
            "unembedding": "erank(W_U^T P W_U), P centring over the vocabulary",
            "unembedding_gained": "erank(diag(g) W_U^T P W_U diag(g)), g the final norm's gains",
            "later_gains": "erank(diag(s)), s the summed squared gains of the final norm and "
            "of the norms reading the residual in the blocks after the layer",
        },
    }
