"""Null models by name: MODEL:permuted shuffles each parameter within itself, MODEL:init
draws a fresh initialisation; both are recorded with their seed."""

from __future__ import annotations

import json

import pytest
import torch

from causaldim.errors import UsageError
from causaldim.harvest import harvest
from causaldim.model.load import fingerprint, load_model, resolve_model
from causaldim.model.nulls import Null, split_null


def test_a_null_is_read_from_the_models_name():
    assert split_null("smollm2-135m:permuted") == ("smollm2-135m", Null("permuted", 0))
    assert split_null("HuggingFaceTB/SmolLM2-135M:init@7") == (
        "HuggingFaceTB/SmolLM2-135M",
        Null("init", 7),
    )
    assert split_null("smollm2-135m") == ("smollm2-135m", None)
    assert split_null("weights:v2") == ("weights:v2", None)  # not a null's name
    with pytest.raises(UsageError, match="whole number"):
        split_null("smollm2-135m:init@x")


def _weights(lm) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in lm.model.named_parameters()}


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_permuted_shuffles_every_parameter_within_itself(tiny_model, family):
    name = tiny_model(family)
    trained = _weights(load_model(resolve_model(name)))
    source = resolve_model(f"{name}:permuted@3")
    assert source.null == Null("permuted", 3)
    assert fingerprint(source)["null"]["seed"] == 3
    assert fingerprint(source)["files"] == fingerprint(resolve_model(name))["files"]
    shuffled = _weights(load_model(source))
    assert shuffled.keys() == trained.keys()
    for k, w in trained.items():
        # the same values (a permutation of them), not in the same places
        assert torch.equal(shuffled[k].flatten().sort().values, w.flatten().sort().values), k
        if w.unique().numel() > 1:  # a random-init norm's gains are all equal
            assert not torch.equal(shuffled[k], w), k
    again = _weights(load_model(resolve_model(f"{name}:permuted@3")))
    assert all(torch.equal(again[k], shuffled[k]) for k in shuffled)  # the seed decides it


def test_init_draws_fresh_weights_by_seed_as_transformers_does(tiny_model):
    name = tiny_model("llama")
    trained = _weights(load_model(resolve_model(name)))
    first = _weights(load_model(resolve_model(f"{name}:init")))
    same = _weights(load_model(resolve_model(f"{name}:init@0")))
    other = _weights(load_model(resolve_model(f"{name}:init@1")))
    big = [k for k, w in trained.items() if w.dim() == 2]
    assert all(torch.equal(first[k], same[k]) for k in first)
    assert not any(torch.equal(first[k], other[k]) for k in big)
    # the tiny model was itself made by from_config under manual_seed(0): init@0 is it
    assert all(torch.equal(first[k], trained[k]) for k in trained)


def test_a_null_harvests_a_store_of_its_own_that_names_it(harvest_config, tiny_model, tmp_path):
    trained = harvest(harvest_config(tmp_path / "a"), progress=False).store
    null = harvest(
        harvest_config(tmp_path / "b", model=f"{tiny_model('llama')}:permuted@2"), progress=False
    ).store
    identity = null.manifest["model"]["identity"]
    assert identity["null"] == {"kind": "permuted", "seed": 2, "what": identity["null"]["what"]}
    assert null.manifest["key"] != trained.manifest["key"]
    h_null = next(iter(null.batches("eval", ("h",), 10_000)))["h"]
    h_trained = next(iter(trained.batches("eval", ("h",), 10_000)))["h"]
    assert not torch.allclose(h_null, h_trained)
    assert json.dumps(identity)  # JSON-clean, as results.json holds it
