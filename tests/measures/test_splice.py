"""Splicing a replacement into block L: clean, ablated and SAE losses."""

from __future__ import annotations

import pytest
import torch
from reference import reference_grad

from causaldim.harvest.model_pass import residuals_at
from causaldim.measures.splice import ce_loss_recovered, sequence_losses, spliced_loss
from causaldim.model.load import load_model, resolve_model


def test_identity_splice_is_the_clean_model_and_mean_is_the_floor(tiny_model):
    lm = load_model(resolve_model(tiny_model("llama")))
    ids = torch.randint(0, 320, (4, 24), generator=torch.Generator().manual_seed(0))
    h, _ = reference_grad(lm, 1, ids)
    threshold = float(h.norm(dim=-1).max()) + 1  # no outliers beyond position 0
    clean, n = spliced_loss(lm, 1, ids, None, threshold)
    same, _ = spliced_loss(lm, 1, ids, lambda x: x, threshold)
    assert n == 4 * 22  # position 0 is never replaced nor scored
    assert abs(same - clean) < 1e-4 * abs(clean)
    logits = lm.model(input_ids=ids).logits
    full = torch.nn.functional.cross_entropy(
        logits[:, 1:-1].flatten(0, 1), ids[:, 2:].flatten(), reduction="sum"
    )
    assert abs(float(full) - clean) < 1e-3

    mean = h[:, 1:].reshape(-1, h.shape[-1]).mean(0)
    out = ce_loss_recovered(lm, 1, ids, {"identity": torch.nn.Identity()}, mean, threshold)
    assert abs(out["saes"]["identity"]["ce_loss_recovered"] - 1) < 1e-3
    assert abs(out["clean_loss"] - clean / n) < 1e-6
    assert out["mean_ablated_loss"] != out["clean_loss"]  # the ablation did replace h


@pytest.mark.parametrize("family", ["llama", "gemma2", "gemma3", "gpt2", "gpt_neox", "qwen2"])
def test_starting_above_block_l_gives_the_full_forward_losses(tiny_model, family):
    """The ablation control runs only the blocks above L from L's cached clean output: its
    losses, clean and edited, are those of the whole forward, and the blocks are put back."""
    lm = load_model(resolve_model(tiny_model(family)))
    ids = torch.randint(0, 320, (3, 20), generator=torch.Generator().manual_seed(1))
    layer = 1
    hidden = residuals_at(lm, (layer,), ids)[layer]
    threshold = float(hidden.norm(dim=-1).max()) + 1

    def halve(h):
        return 0.5 * h

    for edit in (None, halve):
        full = sequence_losses(lm, layer, ids, edit, threshold)
        above = sequence_losses(lm, layer, ids, edit, threshold, hidden)
        assert torch.allclose(above, full, rtol=1e-5), (family, edit)
        spliced, n = spliced_loss(lm, layer, ids, edit, threshold)
        spliced_above, n_above = spliced_loss(lm, layer, ids, edit, threshold, hidden)
        assert n_above == n and abs(spliced_above - spliced) <= 1e-5 * abs(spliced)
    assert not torch.allclose(
        sequence_losses(lm, layer, ids, halve, threshold),
        sequence_losses(lm, layer, ids, None, threshold),
    )
    assert all("forward" not in vars(block) for block in lm.layers)
    again = sequence_losses(lm, layer, ids, None, threshold)
    assert torch.equal(again, sequence_losses(lm, layer, ids, None, threshold))
