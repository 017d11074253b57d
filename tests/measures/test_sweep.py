"""The sweep from a store: training, evaluation, atomic saves, resume."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from causaldim.errors import UsageError
from causaldim.harvest import harvest
from causaldim.measures import sweep as sweep_mod
from causaldim.measures.sweep import evaluate, load_entry, run_sweep
from causaldim.sweep_config import SweepConfig


@pytest.fixture
def store(harvest_config):
    cfg = harvest_config(tokens=4096, eval_fraction=0.125, logit_probes=0, fisher_probes=0)
    return harvest(cfg, progress=False).store


SWEEP = SweepConfig(
    widths=[16, 32, 64], architectures=["topk", "relu"], k=4, epochs=2, batch_tokens=256, lr=3e-3
)


def test_sweep_trains_saves_evaluates_and_is_reused(tmp_path, store, monkeypatch):
    entries = run_sweep(store, tmp_path / "run", SWEEP, progress=False)
    assert [(e.architecture, e.width) for e in entries] == [
        (a, w) for a in ("topk", "relu") for w in (16, 32, 64)
    ]
    for e in entries:
        ev = e.meta["eval"]
        assert not e.reused and (e.folder / "sae.safetensors").is_file()
        assert 0 < ev["fraction_variance_explained"] <= 1
        assert ev["alive"] + ev["dead"] == e.width
        if e.architecture == "topk":
            assert ev["l0"] <= 4 + 1e-6
        # dead_tokens by default: a tenth of the tokens each SAE trains on, so AuxK can act
        stats, trained = e.meta["train_stats"], SWEEP.epochs * store.n_tokens("train", True)
        assert e.meta["request"]["train"]["dead_tokens"] == trained // 10
        # every firing over the training is counted: mean = tokens x L0 / width
        firings = stats["firings"]
        assert firings["p10"] <= firings["median"] <= firings["p90"]
        if e.architecture == "topk":
            assert firings["mean"] == pytest.approx(stats["tokens"] * 4 / e.width, rel=0.02)
    topk64 = load_entry(entries[2])
    # The stored evaluation is what a direct computation on the eval split gives.
    xs = torch.cat([b["h"] for b in store.batches("eval", ("h",), 10_000)])
    recon = topk64.decode(topk64.encode(xs))
    fve = 1 - float((recon - xs).pow(2).sum() / (xs - xs.mean(0)).pow(2).sum())
    assert abs(fve - entries[2].meta["eval"]["fraction_variance_explained"]) < 1e-4
    assert evaluate(topk64, store)["l0"] == pytest.approx(entries[2].meta["eval"]["l0"])

    def no_training(*a, **k):
        raise AssertionError("a finished SAE was trained again")

    monkeypatch.setattr(sweep_mod, "train_sae", no_training)
    again = run_sweep(store, tmp_path / "run", SWEEP, progress=False)
    assert all(e.reused for e in again)


def test_killed_sweep_resumes_without_retraining_finished_widths(tmp_path, store, monkeypatch):
    real = sweep_mod.train_sae
    calls = []

    def dies_on_third(sae, *a, **k):
        calls.append(sae.cfg.width)
        if len(calls) == 3:
            raise KeyboardInterrupt  # as if the process were killed mid-SAE
        return real(sae, *a, **k)

    monkeypatch.setattr(sweep_mod, "train_sae", dies_on_third)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(store, tmp_path / "run", SWEEP, progress=False)
    saes = tmp_path / "run" / "saes"
    assert sorted(p.name for p in saes.iterdir() if not p.name.startswith(".")) == [
        "topk-w16",
        "topk-w32",
    ]
    calls.clear()
    monkeypatch.setattr(
        sweep_mod,
        "train_sae",
        lambda sae, *a, **k: (calls.append(sae.cfg.width), real(sae, *a, **k))[1],
    )
    entries = run_sweep(store, tmp_path / "run", SWEEP, progress=False)
    assert calls == [64, 16, 32, 64]  # topk-16 and topk-32 were not trained again
    assert [e.reused for e in entries] == [True, True, False, False, False, False]


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"widths": [64, 32]}, "strictly increasing"),
        ({"architectures": ["gated"]}, "among"),
        ({"k": 100}, "--k must lie"),
        ({"epochs": 0}, "--epochs"),
    ],
)
def test_bad_sweep_settings(changes, message):
    with pytest.raises(UsageError, match=message):
        SweepConfig(**{**SWEEP.to_dict(), **changes}).check()


def test_sae_seeds_train_replicates_beside_the_sweep(tmp_path, store):
    cfg = SweepConfig(
        widths=[16, 32], architectures=["topk"], k=4, epochs=1, batch_tokens=256, sae_seeds=2
    )
    entries = run_sweep(store, tmp_path / "run", cfg, progress=False)
    assert [(e.name, e.replicate) for e in entries] == [
        ("topk-w16", 0),
        ("topk-w32", 0),
        ("topk-w16-s1", 1),
        ("topk-w32-s1", 1),
    ]
    seeds = [e.meta["request"]["train"]["seed"] for e in entries]
    assert seeds == [0, 0, 1, 1]
    assert not torch.equal(load_entry(entries[0]).W_dec, load_entry(entries[2]).W_dec)
    # replicate 0 is the sweep of one seed, found again as it is
    alone = run_sweep(
        store, tmp_path / "run", dataclasses.replace(cfg, sae_seeds=1), progress=False
    )
    assert [e.name for e in alone] == ["topk-w16", "topk-w32"] and all(e.reused for e in alone)


def test_bfloat16_saves_are_what_is_evaluated_and_are_not_mixed_with_float32(
    tmp_path, store, monkeypatch
):
    from safetensors import safe_open

    cfg = dataclasses.replace(SWEEP, widths=[16, 64], architectures=["jumprelu"])
    full = run_sweep(store, tmp_path / "full", cfg, progress=False)
    half_cfg = dataclasses.replace(cfg, save_dtype="bfloat16")
    half = run_sweep(store, tmp_path / "half", half_cfg, progress=False)
    for f, h in zip(full, half, strict=True):
        with safe_open(h.folder / "sae.safetensors", "pt") as w:
            kinds = {name: w.get_slice(name).get_dtype() for name in w.keys()}  # noqa: SIM118
        assert kinds["W_enc"] == kinds["W_dec"] == "BF16"
        assert kinds["b_enc"] == kinds["threshold"] == "F32"
        small, big = ((x.folder / "sae.safetensors").stat().st_size for x in (h, f))
        assert small < 0.6 * big
        # the same training: only the rounding differs, and the eval is the saved SAE's
        loaded = load_entry(h)
        assert torch.equal(loaded.W_dec, load_entry(f).W_dec.bfloat16().float())
        again = evaluate(loaded, store)
        for key in ("fraction_variance_explained", "l0", "dead", "alive"):
            assert again[key] == pytest.approx(h.meta["eval"][key], rel=1e-6)
        assert h.meta["request"]["save_dtype"] == "bfloat16"
        assert "save_dtype" not in f.meta["request"]
    # a float32 SAE is not taken for a bfloat16 one (nor the other way)
    calls = []
    real = sweep_mod.train_sae
    monkeypatch.setattr(sweep_mod, "train_sae", lambda *a, **k: calls.append(1) or real(*a, **k))
    run_sweep(store, tmp_path / "full", half_cfg, progress=False)
    assert len(calls) == len(cfg.widths)
