"""Each architecture recovers planted dictionary atoms from synthetic sparse data."""

from __future__ import annotations

import pytest
import torch

from causaldim.sae import SAEConfig, build
from causaldim.sae.train import Normalizer, TrainSettings, train_sae

D, ATOMS, ACTIVE = 32, 48, 3


def planted_data(n: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    atoms = torch.randn(ATOMS, D, generator=gen)
    atoms /= atoms.norm(dim=1, keepdim=True)
    idx = torch.rand(n, ATOMS, generator=gen).argsort(-1)[:, :ACTIVE]
    coef = torch.zeros(n, ATOMS).scatter_(1, idx, 0.5 + torch.rand(n, ACTIVE, generator=gen))
    return coef @ atoms + 0.3, atoms  # an offset, so that b_dec has work to do


@pytest.mark.parametrize("optimizer", ["adam", "lean"])
@pytest.mark.parametrize("arch", ["topk", "jumprelu", "relu"])
def test_architecture_recovers_planted_atoms(arch, optimizer):
    x, atoms = planted_data(40_000)
    cfg = SAEConfig(arch, D, width=96, k=ACTIVE if arch == "topk" else None)
    sae = build(cfg)
    settings = TrainSettings(
        lr=3e-3, epochs=6, target_l0=ACTIVE, dead_tokens=20_000, optimizer=optimizer
    )
    batch = 1000

    def batches():
        for i in range(0, len(x), batch):
            yield x[i : i + batch]

    held = x[-5000:]  # L0 is matched on these, and checked below on other tokens
    stats = train_sae(sae, batches, settings, 6 * len(x) // batch, Normalizer.fit(x[:5000]), held)
    dec = sae.W_dec.detach()
    cos = (atoms @ (dec / dec.norm(dim=1, keepdim=True)).T).max(1).values
    with torch.no_grad():
        f = sae.encode(x[:5000])
        l0 = float((f > 0).sum(-1).float().mean())
        held = x[:5000]
        fve = float(1 - (sae.decode(f) - held).pow(2).sum() / (held - held.mean(0)).pow(2).sum())
    assert float(cos.mean()) > 0.9, float(cos.mean())
    assert fve > 0.8  # ReLU shrinks activations under its L1 penalty
    assert stats.steps == 240 and stats.tokens == 240_000
    if arch == "topk":
        assert l0 <= ACTIVE
    else:  # the controller, then the final exact match on held-out train tokens
        assert abs(l0 / ACTIVE - 1) < 0.1, l0
