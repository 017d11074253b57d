"""AtP from the store equals the first-order effect of each feature on the real model."""

from __future__ import annotations

import torch

from causaldim.harvest import harvest
from causaldim.models import load_model, resolve_model
from causaldim.sae import SAEConfig, build
from causaldim.score import atp_scores


def test_atp_is_the_gradient_of_the_loss_through_a_spliced_sae(harvest_config):
    cfg = harvest_config(
        tokens=512, eval_fraction=0.25, logit_probes=0, fisher_probes=0, outlier_factor=1e6
    )  # only position 0 is an outlier
    store = harvest(cfg, progress=False).store
    sae = build(SAEConfig("topk", 32, 48, k=6))
    sae.reset(torch.Generator().manual_seed(0))
    sae.requires_grad_(False)
    scores = atp_scores(sae, store)

    # Reference: splice the SAE into the real model with its error term held constant and
    # a per-(token, feature) scale s = 1; |s-gradient of the summed loss| is the effect.
    lm = load_model(resolve_model(cfg.model))
    rows = next(store.shards("eval", ("token", "seq")))
    ids = rows["token"].long().view(-1, 32)
    scale = torch.ones(ids.shape[0], 32, 48, requires_grad=True)

    def splice(module, args, out):
        h = out[0] if isinstance(out, tuple) else out
        f = sae.encode(h)
        error = (h - sae.decode(f)).detach()
        new = sae.decode(f * scale) + error
        return (new, *out[1:]) if isinstance(out, tuple) else new

    handle = lm.layers[2].register_forward_hook(splice)
    try:
        with torch.enable_grad():
            logits = lm.model(input_ids=ids, use_cache=False).logits
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten(), reduction="sum"
            )
            (grad,) = torch.autograd.grad(loss, scale)
    finally:
        handle.remove()
    keep = torch.ones(ids.shape[0], 32, dtype=torch.bool)
    keep[:, 0] = False  # outliers
    keep[:, -1] = False  # predicts nothing
    expected = grad[keep].abs().mean(0)
    assert scores.n_tokens == int(keep.sum())
    assert torch.allclose(scores.atp, expected, rtol=1e-3, atol=1e-7)
    assert scores.mean_l0 <= 6 and scores.n_repr <= 48 and scores.atp.max() > 0
