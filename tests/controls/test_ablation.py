"""Real ablations against a hand-written patching loop, and AtP against them."""

from __future__ import annotations

import pytest
import torch

from causaldim.controls.ablation import atp_vs_ablation, first_order, sample_features
from causaldim.measures.score import atp_scores
from causaldim.sae import SAEConfig, build


def patched_loss_by_hand(lm, layer, ids, sae, feature, threshold) -> float:
    """One sequence, token by token: subtract f_i d_i where it fires (not position 0, not
    outliers); the summed next-token loss from log-softmax."""

    def hook(module, args, output):
        hidden = (output[0] if isinstance(output, tuple) else output).clone()
        for t in range(1, hidden.shape[1]):
            h = hidden[0, t]
            if h.norm() <= threshold:
                f = sae.encode(h[None])[0, feature]
                hidden[0, t] = h - f * sae.W_dec[feature]
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    handle = lm.layers[layer].register_forward_hook(hook)
    try:
        with torch.no_grad():
            logits = lm.model(input_ids=ids[None], use_cache=False).logits[0]
    finally:
        handle.remove()
    logp = logits[:-1].double().log_softmax(-1)
    return float(-logp[torch.arange(len(ids) - 1), ids[1:]].sum())


@pytest.fixture(scope="module")
def tiny_sweep(tiny_lm_store):
    lm, store = tiny_lm_store(1024)
    saes = {}
    for width in (24, 48):
        sae = build(SAEConfig("topk", 32, width, k=4))
        sae.reset(torch.Generator().manual_seed(width))
        saes[width] = sae.requires_grad_(False)
    return lm, store, saes


def test_real_ablation_matches_a_hand_written_patching_loop(tiny_sweep):
    lm, store, saes = tiny_sweep
    scores = {m: atp_scores(sae, store, blocks=4) for m, sae in saes.items()}
    out = atp_vs_ablation(lm, store, saes, scores, 1e-3, 90.0, n_features=6, n_sequences=3)
    ids = store.token_ids("eval", 3)
    layer, threshold = store.manifest["layer"], store.manifest["outliers"]["threshold"]
    n_tokens = 3 * (ids.shape[1] - 1)
    for row in out["rows"]:
        sae = saes[row["width"]]
        assert len(row["features"]) == 6 and len(set(row["features"])) == 6
        for feature, real in zip(row["features"], row["real"], strict=True):
            total = 0.0
            for seq in ids:
                clean = patched_loss_by_hand(lm, layer, seq, sae, feature, -1.0)  # no edit
                total += abs(patched_loss_by_hand(lm, layer, seq, sae, feature, threshold) - clean)
            assert real == pytest.approx(total / n_tokens, rel=1e-4, abs=1e-9)
    assert any(r > 0 for row in out["rows"] for r in row["real"])
    assert out["n_tokens"] == n_tokens


def test_first_order_is_the_linear_part_of_the_real_effect(tiny_sweep):
    """Scaling a feature's decoder row down by s scales the real change by s to first
    order: real / s approaches the store's first-order sum as s -> 0."""
    lm, store, saes = tiny_sweep
    sae = saes[48]
    ids = store.token_ids("eval", 2)
    linear, fires = first_order(sae, store, 2)
    feature = int(linear.abs().sum(0).argmax())
    layer, threshold = store.manifest["layer"], store.manifest["outliers"]["threshold"]
    small = build(SAEConfig("topk", 32, 48, k=4))
    small.load_state_dict(sae.state_dict())
    with torch.no_grad():
        small.W_dec[feature] *= 1e-3
    for s, seq in enumerate(ids):
        clean = patched_loss_by_hand(lm, layer, seq, small, feature, -1.0)
        real = patched_loss_by_hand(lm, layer, seq, small, feature, threshold) - clean
        # removing f d changes the loss by -f (g . d) to first order
        assert real / 1e-3 == pytest.approx(-float(linear[s, feature]), rel=2e-2, abs=1e-6)


def test_the_sample_spans_the_atp_ranking():
    gen = torch.Generator().manual_seed(0)
    atp = torch.arange(100, dtype=torch.float64)
    fired = torch.ones(100)
    fired[::10] = 0  # never fired: never sampled
    picks = sample_features(atp, fired, 12, gen)
    assert len(picks) == 12 and len(set(picks.tolist())) == 12
    assert set(range(91, 100)) & set(picks.tolist())  # the top
    assert min(picks.tolist()) < 30  # and the bottom quartile
    assert not set(picks.tolist()) & set(range(0, 100, 10))
