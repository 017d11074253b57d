"""The embedded SmolLM2-135M, end to end (slow: loading takes tens of seconds)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from reference import reference_atp, reference_grad

from causaldim import cli
from causaldim.config import HarvestConfig
from causaldim.harvest import harvest
from causaldim.harvest.model_pass import grads_at
from causaldim.measures.score import atp_scores
from causaldim.model.load import fingerprint, load_model, resolve_model
from causaldim.sae import SAEConfig, build

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
    ours = grads_at(smollm, (15,), ids)[15]
    _, g = reference_grad(smollm, 15, ids)
    # float32 through 15 blocks: two threads sum in another order than one (7e-5 apart
    # with two, under 1e-5 with one, as the suite's workers run)
    assert (ours.g - g).norm() / g.norm() < 2e-4


def test_the_gguf_is_converted_once_and_reads_back_the_same(smollm):
    again = resolve_model("smollm2-135m")  # the module fixture's load converted it
    assert again.converted and fingerprint(again) == fingerprint(smollm.source)
    fast = load_model(again)
    text = "def f(x):\n    return x  # the end"
    assert fast.tokenizer(text).input_ids == smollm.tokenizer(text).input_ids
    assert fast.tokenizer.eos_token_id == smollm.tokenizer.eos_token_id
    ids = smollm.tokenizer(text, return_tensors="pt").input_ids
    assert torch.equal(fast.model(ids).logits, smollm.model(ids).logits)


def test_embedded_atp_matches_autograd_through_the_spliced_sae(smollm, tmp_path):
    cfg = HarvestConfig(
        tokens=1024, eval_fraction=0.25, logit_probes=0, fisher_probes=0, out=str(tmp_path)
    )
    store = harvest(cfg, progress=False).store
    sae = build(SAEConfig("topk", 576, 256, k=16))
    sae.reset(torch.Generator().manual_seed(0))
    sae.requires_grad_(False)
    scores = atp_scores(sae, store)
    expected = reference_atp(smollm, 15, sae, store)
    error = (scores.atp.double() - expected.double()).norm() / expected.double().norm()
    assert error < 1e-4 and scores.n_tokens > 200


def test_smoke_run_on_the_embedded_model(smoke_run, tmp_path, capsys):
    """The session's smoke run (conftest.smoke_run: `run --preset smoke`, fresh), then the
    same command again in a copy of its folder."""
    out, results = smoke_run
    (manifest_path,) = out.glob("stores/L??-????????????/manifest.json")  # not the extension's
    m = json.loads(manifest_path.read_text())
    assert m["layer"] == 15 and m["model"]["identity"]["name"] == "smollm2-135m"
    assert m["model"]["identity"]["files"]["SmolLM2-135M-Instruct.Q4_1.gguf"].startswith("sha256:")
    assert m["corpus"]["id"].startswith("builtin:stdlib-docstrings")
    assert m["splits"]["eval"]["n_tokens"] == 1024 and m["splits"]["train"]["n_tokens"] == 3072
    assert 0.5 < m["splits"]["eval"]["mean_loss"] < 8  # a trained model, not noise
    o = m["outliers"]
    assert o["n_outliers"] >= 64  # at least every position 0
    assert o["variance_share"] > 0.5  # the few outliers carry most of the variance

    for reading in ("loss", "logits", "fisher", "activations"):
        est = results["sigma"][reading]
        assert 1 < est["erank"] < 576 and est["n_samples"] > 900
        assert est["warning"]  # 1,024 eval tokens are far too few for d = 576, and it says so
    rows = results["sweep"]["topk"]["per_width"]
    assert [r["width"] for r in rows] == [64, 128, 256, 512, 1024]
    assert rows[-1]["n_repr"] > 5 * rows[0]["n_repr"]
    assert (out / "report.html").is_file() and (out / "figures" / "wedge_topk.png").is_file()
    again = tmp_path / "run"
    shutil.copytree(out, again)
    capsys.readouterr()
    assert cli.main(["--quiet", "run", "--preset", "smoke", "--out", str(again)]) == 0
    assert "reused store" in capsys.readouterr().out
