"""The model pass and the store it writes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import reference_grad
from safetensors import safe_open

from causaldim.harvest import harvest, plan
from causaldim.harvest.model_pass import grads_at, residuals_at
from causaldim.harvest.store import Store, StoreError
from causaldim.model.load import load_model, resolve_model

FAMILIES = ["llama", "gemma2", "gemma3", "gpt2", "gpt_neox", "qwen2"]


@pytest.mark.parametrize("family", FAMILIES)
def test_gradient_equals_autograd_on_the_unmodified_model(tiny_model, family):
    lm = load_model(resolve_model(tiny_model(family)))
    ids = torch.randint(0, 320, (3, 24))
    for layer in (0, 2):
        ours = grads_at(lm, (layer,), ids)[layer]
        h_ref, g_ref = reference_grad(lm, layer, ids)
        assert torch.equal(ours.h, h_ref)
        rel = (ours.g - g_ref).norm() / g_ref.norm()
        assert rel < 1e-5, f"{family} layer {layer}: relative error {rel:.2e}"
        assert g_ref.norm() > 0
        # The last position predicts nothing, so nothing depends on it through the loss.
        assert ours.g[:, -1].abs().max() == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_stopped_forward_gives_the_full_forward_residual(tiny_model, family):
    lm = load_model(resolve_model(tiny_model(family)))
    ids = torch.randint(0, 320, (2, 16))
    h = residuals_at(lm, (1,), ids)[1]
    h_ref, _ = reference_grad(lm, 1, ids)
    assert torch.equal(h, h_ref)


def test_store_holds_what_the_pass_computed(harvest_config):
    cfg = harvest_config()
    result = harvest(cfg, progress=False)
    store, m = result.store, result.store.manifest
    assert not result.reused
    assert m["layer"] == 2  # the middle of 4 layers
    assert m["model"]["d_model"] == 32 and m["model"]["n_layers"] == 4
    assert m["corpus"]["sha256"] and m["model"]["identity"]["files"]
    ev, tr = m["splits"]["eval"], m["splits"]["train"]
    assert ev["n_tokens"] + tr["n_tokens"] == 2048
    assert ev["n_sequences"] == 16 and tr["n_sequences"] == 48
    assert len(tr["shards"]) == 6  # 1536 tokens in shards of 256
    store.verify()

    # Recompute the eval split's first sequences directly and compare with the store.
    p = plan(cfg)
    lm = load_model(p.source)
    direct = grads_at(lm, (p.layer,), p.splits.eval[:4])[p.layer]
    first = next(store.batches("eval", ("h", "g", "token", "pos", "seq"), 128, False))
    assert torch.allclose(first["h"], direct.h.flatten(0, 1))
    assert torch.allclose(first["g"], direct.g.flatten(0, 1))
    assert torch.equal(first["token"].long(), p.splits.eval[:4].flatten())
    assert first["pos"][:33].tolist() == list(range(32)) + [0]
    assert first["seq"].tolist() == [i for i in range(4) for _ in range(32)]


def test_splits_never_share_a_sequence(harvest_config):
    store = harvest(harvest_config(), progress=False).store

    def sequences(split):
        rows = torch.cat([b["token"] for b in store.batches(split, ("token",), 4096, False)])
        return {tuple(r.tolist()) for r in rows.view(-1, 32)}

    assert not sequences("train") & sequences("eval")


def test_outliers_are_flagged_and_dropped(harvest_config):
    store = harvest(harvest_config(), progress=False).store
    o = store.manifest["outliers"]
    rows = next(store.shards("eval", ("h", "pos", "outlier")))
    norms = rows["h"].norm(dim=-1)
    expected = (rows["pos"] == 0) | (norms > o["threshold"])
    assert torch.equal(rows["outlier"], expected)
    kept = torch.cat([b["pos"] for b in store.batches("eval", ("pos",), 100)])
    assert len(kept) == store.n_tokens("eval", drop_outliers=True)
    assert (kept != 0).all()
    assert 0 <= o["variance_share"] <= 1


@pytest.fixture(scope="module")
def sharded_store(tmp_path_factory, tiny_harvest):
    """The eval split in shards of 64 tokens, with outliers (every position 0) in each."""
    cfg = tiny_harvest(tmp_path_factory.mktemp("sharded"), shard_tokens=64)
    return harvest(cfg, progress=False).store


@settings(max_examples=40, deadline=None)
@given(batch_tokens=st.integers(1, 700), drop=st.booleans())
def test_batches_stream_every_kept_token_once_in_order(sharded_store, batch_tokens, drop):
    shards = list(sharded_store.shards("eval", ("h", "seq", "outlier")))
    assert len(shards) >= 3  # batches span shard boundaries
    rows = {
        k: torch.cat([s[k][~s["outlier"]] if drop else s[k] for s in shards]) for k in ("h", "seq")
    }
    batches = list(sharded_store.batches("eval", ("h", "seq"), batch_tokens, drop))
    assert [len(b["h"]) for b in batches[:-1]] == [batch_tokens] * (len(batches) - 1)
    assert 0 < len(batches[-1]["h"]) <= batch_tokens
    for k in ("h", "seq"):
        assert torch.equal(torch.cat([b[k] for b in batches]), rows[k])


def test_rerun_reuses_and_another_layer_does_not(harvest_config):
    first = harvest(harvest_config(), progress=False)
    again = harvest(harvest_config(), progress=False)
    assert again.reused and again.store.root == first.store.root
    other = harvest(harvest_config(layer=1), progress=False)
    assert not other.reused and other.store.root != first.store.root
    assert other.store.manifest["layer"] == 1


def test_damaged_store_is_named_not_reused(harvest_config):
    store = harvest(harvest_config(), progress=False).store
    shard = store.root / store.manifest["splits"]["train"]["shards"][0]["file"]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="does not match its hash"):
        harvest(harvest_config(), progress=False)


@pytest.mark.parametrize("store_dtype", ["bfloat16", "float16"])
def test_low_precision_store_round_trips(tmp_path, harvest_config, store_dtype):
    full = harvest(harvest_config(out=str(tmp_path / "a")), progress=False).store
    low = harvest(
        harvest_config(out=str(tmp_path / "b"), store_dtype=store_dtype), progress=False
    ).store
    a = next(full.batches("eval", ("h", "g"), 512))
    b = next(low.batches("eval", ("h", "g"), 512))
    for name in ("h", "g"):
        rel = (a[name] - b[name]).norm() / a[name].norm()
        assert rel < (1e-2 if store_dtype == "bfloat16" else 2e-3), (name, rel)
    if store_dtype == "float16":  # gradients are tiny; a recorded scale keeps them in range
        shard = low.root / low.manifest["splits"]["eval"]["shards"][0]["file"]
        with safe_open(shard, framework="pt") as f:
            assert float(f.metadata()["scale.g"]) > 1.0


def test_batches_stream_in_order_with_fixed_size(harvest_config):
    store = harvest(harvest_config(), progress=False).store
    sizes = [len(b["h"]) for b in store.batches("train", ("h",), 300)]
    total = store.n_tokens("train", drop_outliers=True)
    assert sum(sizes) == total and all(s == 300 for s in sizes[:-1])


def test_missing_manifest_is_not_a_store(tmp_path):
    with pytest.raises(StoreError, match="no finished store"):
        Store(tmp_path)


def test_one_pass_over_several_layers_writes_the_single_layer_stores(harvest_config, tmp_path):
    multi = harvest_config(out=str(tmp_path / "multi"), logit_probes=1)
    p = plan(multi, extra_layers=(0, 3))
    assert sorted(p.store_dirs) == [0, 2, 3]
    result = harvest(multi, progress=False, the_plan=p)
    assert sorted(result.stores) == [0, 2, 3] and not result.reused
    for layer in (0, 3):
        single = harvest(
            harvest_config(out=str(tmp_path / f"single{layer}"), layer=layer, logit_probes=1),
            progress=False,
        ).store
        ours = result.stores[layer]
        # The same key, hence the same folder name, as a harvest of that layer alone.
        assert ours.root.name == single.root.name
        assert ours.manifest["outliers"]["threshold"] == single.manifest["outliers"]["threshold"]
        for split, fields in (("train", ("h",)), ("eval", ("h", "g", "u_logits"))):
            a = next(ours.batches(split, fields, 512, False))
            b = next(single.batches(split, fields, 512, False))
            for f in fields:
                assert torch.allclose(a[f], b[f], rtol=1e-4, atol=1e-6), (layer, split, f)
    # A second call reuses every store; a plan with one more layer harvests only that one.
    again = harvest(multi, progress=False, the_plan=p)
    assert again.reused and again.lm is None
    more = harvest(multi, progress=False, the_plan=plan(multi, extra_layers=(0, 1, 3)))
    assert more.reused and more.lm is not None
    assert more.stores[0].manifest["created"] == result.stores[0].manifest["created"]
    assert more.stores[1].manifest["pass_layers"] == [1]
