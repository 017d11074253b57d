"""The embedded SmolLM2-135M, end to end (slow: loading takes tens of seconds)."""

from __future__ import annotations

import json

import pytest
from reference import reference_grad

from causaldim import cli
from causaldim.harvest import residuals_and_grads
from causaldim.models import load_model, resolve_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm():
    return load_model(resolve_model("smollm2-135m"))


def test_embedded_model_facts(smollm):
    s = smollm.source
    assert (s.family, s.n_layers, s.d_model, s.config.vocab_size) == ("llama", 30, 576, 49152)
    ids = smollm.tokenizer("def f(x):\n    return x", return_tensors="pt").input_ids
    assert ids.shape[1] > 3


def test_embedded_gradient_matches_autograd(smollm):
    ids = smollm.tokenizer(
        "The cat sat on the mat because it was tired.", return_tensors="pt"
    ).input_ids
    ours = residuals_and_grads(smollm, 15, ids)
    _, g = reference_grad(smollm, 15, ids)
    assert (ours.g - g).norm() / g.norm() < 1e-5


def test_run_on_the_embedded_model(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["--quiet", "run", "--tokens", "1536", "--eval-fraction", "0.25", "--out", str(out)]
    assert cli.main(args) == 0
    (manifest_path,) = out.glob("stores/*/manifest.json")
    m = json.loads(manifest_path.read_text())
    assert m["layer"] == 15 and m["model"]["identity"]["name"] == "smollm2-135m"
    assert m["model"]["identity"]["files"]["SmolLM2-135M-Instruct.Q4_1.gguf"].startswith("sha256:")
    assert m["corpus"]["id"].startswith("builtin:stdlib-docstrings")
    assert m["splits"]["eval"]["n_tokens"] == 384 and m["splits"]["train"]["n_tokens"] == 1152
    assert 0.5 < m["splits"]["eval"]["mean_loss"] < 8  # a trained model, not noise
    o = m["outliers"]
    assert o["n_outliers"] >= 12  # at least every position 0
    assert o["variance_share"] > 0.5  # the few outliers carry most of the variance

    results = json.loads((out / "results.json").read_text())
    for reading in ("loss", "logits", "fisher", "activations"):
        est = results["sigma"][reading]
        assert 1 < est["erank"] < 576 and est["n_samples"] > 300
        assert est["warning"]  # 384 eval tokens are far too few for d = 576, and it says so
    assert cli.main(args) == 0
    assert "reused store" in capsys.readouterr().out
