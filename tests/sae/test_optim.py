"""LeanAdam against torch's Adam: the same update from dense or row-sparse gradients
(float32 moments: to float32's rounding; bfloat16 first moments: to bfloat16's), block by
block, and a lean training resumed from its checkpoint equal to an uninterrupted one."""

from __future__ import annotations

import pytest
import torch

from causaldim import faults
from causaldim.sae import SAEConfig, build, optim
from causaldim.sae.checkpoint import Checkpoint
from causaldim.sae.train import Normalizer, TrainSettings, train_sae

ROWS, COLS = 40, 7


def params(seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn(ROWS, COLS, generator=gen).requires_grad_(),
        torch.randn(ROWS, generator=gen).requires_grad_(),
    ]


def row_grads(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A gradient on a few rows of the matrix (the rest 0), and a dense one for the bias."""
    gen = torch.Generator().manual_seed(100 + step)
    rows = torch.randperm(ROWS, generator=gen)[:6].sort().values
    values = torch.randn(len(rows), COLS, generator=gen)
    sparse = torch.sparse_coo_tensor(rows[None], values, (ROWS, COLS), check_invariants=True)
    return sparse, torch.randn(ROWS, generator=gen)


def run(opt_of, sparse: bool, steps: int = 12) -> list[torch.Tensor]:
    ps = params()
    opt = opt_of(ps)
    for step in range(steps):
        g_mat, g_bias = row_grads(step)
        ps[0].grad = g_mat if sparse else g_mat.to_dense()
        ps[1].grad = g_bias
        opt.step()
    return [p.detach() for p in ps]


def adam(ps):
    return torch.optim.Adam(ps, lr=0.01, fused=True)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense grads", "row grads"])
@pytest.mark.parametrize("block", [None, 3 * COLS], ids=["one block", "blocks of 3 rows"])
def test_float32_moments_give_torch_adams_update(sparse, block, monkeypatch):
    """Rows without gradient move as Adam moves them (their moments decay): this is
    Adam, not the lazy SparseAdam."""
    if block:
        monkeypatch.setattr(optim, "BLOCK_ELEMENTS", block)
    ref = run(adam, sparse=False)
    lean = run(lambda ps: optim.LeanAdam(ps, lr=0.01, moment_dtype=torch.float32), sparse)
    for r, got in zip(ref, lean, strict=True):
        torch.testing.assert_close(got, r, rtol=1e-6, atol=1e-6)
    lazy = run(lambda ps: torch.optim.SparseAdam(ps[:1], lr=0.01), sparse=True)
    assert (lazy[0] - ref[0]).abs().max() > 1e-3  # the comparison can tell them apart


def test_bfloat16_first_moments_stay_within_bfloat16_of_adam():
    ref = run(adam, sparse=False)
    lean = run(lambda ps: optim.LeanAdam(ps, lr=0.01), sparse=True)
    start = params()
    for r, got, p0 in zip(ref, lean, start, strict=True):
        moved = (r - p0.detach()).norm()
        assert (got - r).norm() / moved < 2**-7  # bfloat16 keeps 8 bits
        assert (got - r).norm() > 0 or r.dim() == 1  # the narrow type is really used
    state = optim.LeanAdam(params(), lr=0.01)
    assert state.param_groups[0]["lr"] == 0.01


def tiny_training(tmp_path, optimizer: str, steps: int = 30, every: int = 0):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(steps * 64, 16, generator=gen) @ torch.randn(16, 16, generator=gen)
    sae = build(SAEConfig("jumprelu", 16, 64))
    settings = TrainSettings(lr=3e-3, target_l0=4.0, dead_tokens=500, optimizer=optimizer)
    ckpt = Checkpoint(tmp_path / "ckpt", {"optimizer": optimizer}, every) if every else None

    def batches():
        yield from x.split(64)

    stats = train_sae(sae, batches, settings, steps, Normalizer.fit(x), None, ckpt)
    return sae, stats


def test_a_lean_training_stays_within_bfloat16_of_adams():
    adam_sae, adam_stats = tiny_training(None, "adam")
    lean_sae, lean_stats = tiny_training(None, "lean")
    for name, p in adam_sae.named_parameters():
        q = dict(lean_sae.named_parameters())[name]
        assert (q - p).norm() / p.norm() < 5e-3, name  # measured: at most 3.5e-3
    assert lean_stats.final_mse == pytest.approx(adam_stats.final_mse, rel=1e-3)


def test_a_resumed_lean_training_equals_an_uninterrupted_one(tmp_path, monkeypatch):
    whole, whole_stats = tiny_training(tmp_path / "a", "lean", every=5)
    monkeypatch.setenv(faults.ENV, "train.step:17")
    with pytest.raises(faults.InjectedFault):
        tiny_training(tmp_path / "b", "lean", every=5)
    monkeypatch.delenv(faults.ENV)
    saved = (tmp_path / "b" / "ckpt" / "state.json").read_text()
    assert '"step": 15' in saved  # it stopped mid-training, past a checkpoint
    resumed, resumed_stats = tiny_training(tmp_path / "b", "lean", every=5)
    for name, p in whole.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], p), name
    assert resumed_stats.history == whole_stats.history
