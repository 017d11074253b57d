"""AtP from the store equals the first-order effect of each feature on the real model."""

from __future__ import annotations

import torch
from reference import reference_atp

from causaldim.harvest import harvest
from causaldim.measures import attributed
from causaldim.measures.score import atp_scores
from causaldim.model.load import load_model, resolve_model
from causaldim.sae import SAEConfig, build


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_atp_is_the_gradient_of_the_loss_through_a_spliced_sae(harvest_config):
    cfg = harvest_config(
        tokens=512, eval_fraction=0.25, logit_probes=0, fisher_probes=0, outlier_factor=1e6
    )  # only position 0 is an outlier
    store = harvest(cfg, progress=False).store
    sae = build(SAEConfig("topk", 32, 48, k=6))
    sae.reset(torch.Generator().manual_seed(0))
    sae.requires_grad_(False)
    scores = atp_scores(sae, store, blocks=3)

    expected = reference_atp(load_model(resolve_model(cfg.model)), 2, sae, store)
    assert relative_error(scores.atp, expected) < 1e-4
    assert scores.n_tokens == 4 * 30  # 4 sequences, positions 1..30
    assert scores.mean_l0 <= 6 and scores.n_repr <= 48 and scores.atp.max() > 0


def test_block_sums_add_up_to_the_whole(harvest_config):
    store = harvest(harvest_config(logit_probes=0, fisher_probes=0), progress=False).store
    sae = build(SAEConfig("topk", 32, 64, k=4))
    sae.reset(torch.Generator().manual_seed(1))
    sae.requires_grad_(False)
    one, many = atp_scores(sae, store, blocks=1), atp_scores(sae, store, blocks=8)
    assert many.atp_sums.shape == (8, 64) and int(many.tokens.min()) > 0
    assert torch.allclose(one.atp, many.atp, rtol=1e-6)
    assert torch.equal(one.fired, many.fired) and one.mean_l0 == many.mean_l0
    # Each block counted twice is the same estimate; dropping half the blocks is not.
    assert torch.allclose(many.resample(torch.full((8,), 2.0))[0], many.atp, rtol=1e-6)
    half = torch.tensor([1.0] * 4 + [0.0] * 4)
    assert not torch.allclose(many.resample(half)[0], many.atp)


def test_the_seen_gradient_sums_are_those_of_the_scored_tokens(harvest_config):
    """vv_sums holds sum v v^T with v = sum_i f_i (g . d_i) d_i over exactly the tokens AtP
    scores, in groups of consecutive blocks."""
    store = harvest(harvest_config(logit_probes=0, fisher_probes=0), progress=False).store
    sae = build(SAEConfig("topk", 32, 64, k=4))
    sae.reset(torch.Generator().manual_seed(2))
    sae.requires_grad_(False)
    scores = atp_scores(sae, store, blocks=8)
    last = store.manifest["seq_len"] - 1
    batch = next(store.batches("eval", ("h", "g", "pos"), 10**6))
    keep = batch["pos"] < last
    v = attributed.seen_gradient(sae.encode(batch["h"][keep]), batch["g"][keep], sae.W_dec)
    assert scores.vv_sums.shape == (8, 32, 32)
    assert relative_error(scores.vv_sums.sum(0), v.T.double() @ v.double()) < 1e-5
