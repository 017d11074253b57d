"""SAE files: our format, SAELens both ways, Gemma Scope and sparsify in."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import gemma_scope_npz
from safetensors.torch import save_file

from causaldim.errors import UsageError
from causaldim.sae import SAEConfig, build
from causaldim.sae.formats import (
    describe_source,
    export_saelens,
    load,
    load_any,
    peek_source,
    save,
)

D, M = 16, 40


def trained_like(arch: str):
    sae = build(SAEConfig(arch, D, M, k=4 if arch == "topk" else None))
    sae.reset(torch.Generator().manual_seed(0))
    with torch.no_grad():
        sae.b_enc.normal_(0, 0.1)
        sae.b_dec.normal_(0, 0.5)
        if arch == "jumprelu":
            sae.log_threshold.copy_(torch.rand(M).mul(0.3).add(0.05).log())
    return sae


@pytest.mark.parametrize("arch", ["topk", "jumprelu", "relu"])
def test_ours_to_saelens_to_ours_gives_identical_encodings(tmp_path, arch):
    sae = trained_like(arch)
    x = torch.randn(200, D)
    save(sae, tmp_path / "ours", {"note": "kept"})
    ours = load(tmp_path / "ours")
    export_saelens(ours, tmp_path / "saelens", hook_name="model.layers.1")
    cfg = json.loads((tmp_path / "saelens" / "cfg.json").read_text())
    assert cfg["d_sae"] == M and cfg["architecture"] in ("topk", "jumprelu", "standard")
    back = load_any(tmp_path / "saelens")
    for other in (ours, back, load_any(tmp_path / "saelens"), load_any(tmp_path / "ours")):
        assert torch.equal(other.encode(x), sae.encode(x))
        assert torch.equal(other.decode(other.encode(x)), sae.decode(sae.encode(x)))
    assert (sae.encode(x) > 0).any()


def test_gemma_scope_params_encode_as_jumprelu_defines(tmp_path):
    gen = np.random.default_rng(0)
    p = {
        "W_enc": gen.normal(size=(D, M)).astype(np.float32),
        "W_dec": gen.normal(size=(M, D)).astype(np.float32),
        "b_enc": gen.normal(size=M).astype(np.float32),
        "b_dec": gen.normal(size=D).astype(np.float32),
        "threshold": gen.uniform(0.1, 1.0, size=M).astype(np.float32),
    }
    np.savez(tmp_path / "params.npz", **p)
    sae = load_any(tmp_path / "params.npz")
    x = gen.normal(size=(100, D)).astype(np.float32)
    pre = x @ p["W_enc"] + p["b_enc"]  # Gemma Scope's own definition
    expected = (pre > p["threshold"]) * np.maximum(pre, 0)
    got = load_any(tmp_path / "params.npz").encode(torch.from_numpy(x)).numpy()
    assert np.allclose(sae.encode(torch.from_numpy(x)).numpy(), expected, atol=1e-4)
    assert np.allclose(got, expected, atol=1e-4)
    recon = expected @ p["W_dec"] + p["b_dec"]
    assert np.allclose(sae.decode(torch.from_numpy(expected)).numpy(), recon, atol=1e-4)


def test_sparsify_folder_loads_as_topk(tmp_path):
    gen = torch.Generator().manual_seed(0)
    enc, bias = torch.randn(M, D, generator=gen), torch.randn(M, generator=gen)
    w_dec, b_dec = torch.randn(M, D, generator=gen), torch.randn(D, generator=gen)
    folder = tmp_path / "layers.1"
    folder.mkdir()
    save_file(
        {"encoder.weight": enc, "encoder.bias": bias, "W_dec": w_dec, "b_dec": b_dec},
        folder / "sae.safetensors",
    )
    (folder / "cfg.json").write_text(json.dumps({"d_in": D, "num_latents": M, "k": 5}))
    sae = load_any(folder)
    x = torch.randn(50, D, generator=gen)
    pre = ((x - b_dec) @ enc.T + bias).relu()  # sparsify's encoder
    vals, idx = pre.topk(5, dim=-1)
    expected = torch.zeros_like(pre).scatter_(-1, idx, vals)
    assert torch.allclose(sae.encode(x), expected, atol=1e-5)


def test_unknown_folder_is_named(tmp_path):
    with pytest.raises(UsageError, match="no SAE this tool reads"):
        load_any(tmp_path)


def test_an_export_names_its_layer_and_reads_back_as_that_site(tmp_path):
    sae = trained_like("topk")
    export_saelens(sae, tmp_path / "saelens", layer=3)
    cfg = json.loads((tmp_path / "saelens" / "cfg.json").read_text())
    assert cfg["metadata"]["hook_name"] == "blocks.3.hook_resid_post"
    assert describe_source(tmp_path / "saelens") == {
        "format": "saelens",
        "site": "blocks.3.hook_resid_post",
        "block": 3,
    }
    export_saelens(sae, tmp_path / "unnamed")  # no layer, no hook: it names nothing
    assert describe_source(tmp_path / "unnamed")["site"] == "unknown"


def test_each_format_says_what_site_it_reads_from_metadata_alone(tmp_path):
    sae = trained_like("jumprelu")
    save(sae, tmp_path / "ours", {"hook_name": "blocks.2.hook_resid_post"})
    assert peek_source(tmp_path / "ours") == {
        "format": "causaldim",
        "site": "blocks.2.hook_resid_post",
    }
    npz = gemma_scope_npz(tmp_path / "layer_5" / "width_16k" / "average_l0_9" / "params.npz", D, M)
    assert describe_source(npz)["block"] == 5
    sparsify = tmp_path / "layers.4"
    sparsify.mkdir()
    save_file(
        {
            "encoder.weight": torch.zeros(M, D),
            "encoder.bias": torch.zeros(M),
            "W_dec": torch.zeros(M, D),
            "b_dec": torch.zeros(D),
        },
        sparsify / "sae.safetensors",
    )
    (sparsify / "cfg.json").write_text(json.dumps({"d_in": D, "num_latents": M, "k": 4}))
    assert describe_source(sparsify)["block"] == 4
    # A hub id counts as metadata where the files name nothing.
    plain = gemma_scope_npz(tmp_path / "plain.npz", D, M)
    assert describe_source(plain)["site"] == "unknown"
    assert describe_source(plain, "layer_7/width_16k/average_l0_9")["block"] == 7


@pytest.mark.parametrize("arch", ["relu", "topk"])
def test_a_pre_6_saelens_config_reads_as_saelens_reads_it(tmp_path, arch):
    sae = trained_like(arch)
    export_saelens(sae, tmp_path / "old")
    cfg = json.loads((tmp_path / "old" / "cfg.json").read_text())
    for key in ("architecture", "metadata", "normalize_activations", "k"):
        cfg.pop(key, None)
    cfg.update(hook_point="blocks.6.hook_resid_pre", normalize_activations=False)
    if arch == "topk":
        cfg.update(activation_fn_str="topk", activation_fn_kwargs={"k": 4})
    (tmp_path / "old" / "cfg.json").write_text(json.dumps(cfg))
    x = torch.randn(50, D)
    assert torch.equal(load_any(tmp_path / "old").encode(x), sae.encode(x))
    assert describe_source(tmp_path / "old")["block"] == 5


def test_a_saelens_folder_causaldim_cannot_read_is_refused_from_its_config(tmp_path):
    export_saelens(trained_like("relu"), tmp_path / "normed")
    cfg = json.loads((tmp_path / "normed" / "cfg.json").read_text())
    cfg["normalize_activations"] = "expected_average_only_in"
    (tmp_path / "normed" / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(UsageError, match="normalize_activations"):
        peek_source(tmp_path / "normed")  # as the pipeline's check reads it, before work


def test_the_export_names_the_hub_model_and_says_what_its_sae_lens_version_is(tmp_path):
    from causaldim.sae.export import hub_name

    assert hub_name({"name": "smollm2-135m"}) == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert hub_name({"name": "gemma", "hub_id": "google/gemma-2-2b"}) == "google/gemma-2-2b"
    assert hub_name({"name": "/models/mine"}) == "/models/mine"
    sae = build(SAEConfig("topk", 8, 16, k=2))
    export_saelens(sae, tmp_path / "out", layer=1, model_name="google/gemma-2-2b")
    cfg = json.loads((tmp_path / "out" / "cfg.json").read_text())
    note = json.loads((tmp_path / "out" / "causaldim_export.json").read_text())
    assert cfg["metadata"]["model_name"] == "google/gemma-2-2b"
    assert note["sae_lens_version"] == cfg["metadata"]["sae_lens_version"]
    assert note["written_by"].startswith("causaldim ")
    try:
        import sae_lens  # noqa: F401

        assert note["sae_lens_version_is"] == "the installed SAELens"
    except ImportError:
        assert "SAELens was not installed" in note["sae_lens_version_is"]


@pytest.mark.parametrize("save_dtype", ["bfloat16", "float16"])
def test_a_narrower_save_loads_as_the_rounded_weights_and_keeps_thresholds(tmp_path, save_dtype):
    from causaldim.sae.formats import SAVE_DTYPES, round_weights

    sae = trained_like("jumprelu")
    save(sae, tmp_path / "half", save_dtype=save_dtype)
    back = load(tmp_path / "half")
    for name in ("W_enc", "W_dec"):
        exact = getattr(sae, name)
        assert getattr(back, name).dtype == torch.float32
        assert torch.equal(getattr(back, name), exact.to(SAVE_DTYPES[save_dtype]).float())
        assert not torch.equal(getattr(back, name), exact)  # it did round
    assert torch.equal(back.threshold, sae.threshold) and torch.equal(back.b_enc, sae.b_enc)
    # rounding first (as the sweep does before it evaluates) makes the save exact
    rounded = round_weights(sae, save_dtype)
    save(rounded, tmp_path / "again", save_dtype=save_dtype)
    again = load(tmp_path / "again")
    assert all(
        torch.equal(a, b) for a, b in zip(again.parameters(), rounded.parameters(), strict=True)
    )
