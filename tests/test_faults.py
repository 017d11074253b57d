"""A run stopped anywhere resumes to the same numbers; damaged artifacts are named."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from causaldim import cli
from causaldim.faults import ENV, InjectedFault

# Timings, and what names the output folder or hashes a manifest that holds timings.
TIMINGS = {
    "seconds",
    "started",
    "reused",
    "tokens_per_second",
    "throughput_tokens_per_second",
    "out",
    "manifest_sha256",
    "sealed_sha256",
    "repair",  # how the run was asked to treat damage, not a measurement
}


def numbers(obj):
    """results.json without what may differ between a resumed and an uninterrupted run."""
    if isinstance(obj, dict):
        return {k: numbers(v) for k, v in obj.items() if k not in TIMINGS}
    if isinstance(obj, list):
        return [numbers(v) for v in obj]
    return obj


def args_for(model, corpus, out) -> list[str]:
    return [
        "--quiet",
        "run",
        "--model",
        model,
        "--corpus",
        str(corpus),
        "--tokens",
        "2048",
        "--seq-len",
        "32",
        "--shard-tokens",
        "256",
        "--widths",
        "16",
        "32",
        "--k",
        "4",
        "--epochs",
        "2",
        "--batch-tokens",
        "128",
        "--checkpoint-steps",
        "5",
        "--bootstrap",
        "20",
        "--blocks",
        "4",
        "--ce-sequences",
        "2",
        "--controls",
        "thresholds",
        "--out",
        str(out),
    ]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_model, text_corpus):
    out = tmp_path_factory.mktemp("uninterrupted")
    assert cli.main(args_for(tiny_model("llama"), text_corpus, out)) == 0
    return json.loads((out / "results.json").read_text())


FAULTS = [
    "harvest.batch:1",
    "harvest.batch:6",  # inside the train split, shards already written
    "stage.sigma",
    "stage.sweep",
    "train.step:3",  # before the first checkpoint
    "train.step:12",  # mid-SAE, after two checkpoints
    "train.step:40",  # in the second SAE
    "stage.ce_loss_recovered",
    "scores.sae:2",
    "stage.analysis",
    "control.thresholds",
    "stage.report",
]


def stopped_and_resumed(args: list[str], fault: str, out, monkeypatch) -> dict:
    """The run stopped at the fault, then run again: its results."""
    monkeypatch.setenv(ENV, fault)
    with pytest.raises(InjectedFault):
        cli.main(args)
    monkeypatch.delenv(ENV)
    assert cli.main(args) == 0
    return json.loads((out / "results.json").read_text())


@pytest.mark.parametrize("fault", FAULTS)
def test_a_run_stopped_anywhere_resumes_to_the_same_numbers(
    fault, reference, tmp_path, tiny_model, text_corpus, monkeypatch
):
    args = args_for(tiny_model("llama"), text_corpus, tmp_path / "run")
    resumed = stopped_and_resumed(args, fault, tmp_path / "run", monkeypatch)
    assert numbers(resumed) == numbers(reference)


@pytest.mark.parametrize("fault", ["stage.sweep:2", "scores.sae:2", "stage.report"])
def test_a_run_dropping_weights_resumes_to_the_numbers_of_one_that_keeps_them(
    fault, reference, tmp_path, tiny_model, text_corpus, monkeypatch
):
    """--drop-weights stopped in its second width (the first one's weights kept as the
    reference), or once every width is dropped: the re-run reuses what was kept."""
    args = [*args_for(tiny_model("llama"), text_corpus, tmp_path / "run"), "--drop-weights"]
    resumed = stopped_and_resumed(args, fault, tmp_path / "run", monkeypatch)
    for key in ("sweep", "subspace", "sigma", "ce", "controls"):
        assert numbers(resumed[key]) == numbers(reference[key]), key
    assert resumed["saes"]["topk-w32"]["weights_dropped"]


def test_mid_sae_kill_resumes_from_the_checkpoint(
    reference, tmp_path, tiny_model, text_corpus, monkeypatch
):
    args = args_for(tiny_model("llama"), text_corpus, tmp_path / "run")
    monkeypatch.setenv(ENV, "train.step:12")
    with pytest.raises(InjectedFault):
        cli.main(args)
    state = json.loads((tmp_path / "run" / "saes" / ".partial-topk-w16" / "state.json").read_text())
    assert state["step"] == 10  # the last multiple of --checkpoint-steps
    monkeypatch.delenv(ENV)
    # Resuming takes only the steps after the checkpoint: the step counter shows it.
    seen = []
    monkeypatch.setenv(ENV, "train.step:1000000")  # armed but never firing: counts steps
    import causaldim.faults as faults

    original = faults.fault_point

    def counting(name):
        seen.append(name)
        original(name)

    monkeypatch.setattr("causaldim.sae.train.fault_point", counting)
    assert cli.main(args) == 0
    total = reference["saes"]["topk-w16"]["steps"] + reference["saes"]["topk-w32"]["steps"]
    assert seen.count("train.step") == total - 10
    assert not (tmp_path / "run" / "saes" / ".partial-topk-w16").exists()
    resumed = json.loads((tmp_path / "run" / "results.json").read_text())
    assert numbers(resumed) == numbers(reference)


@pytest.mark.slow
def test_killed_by_a_signal_resumes_to_the_same_numbers(
    reference, tmp_path, tiny_model, text_corpus
):
    """SIGKILL (no cleanup runs) once the first store shard is on disk, then again once an
    SAE checkpoint is; the third start completes."""
    out = tmp_path / "run"
    args = args_for(tiny_model("llama"), text_corpus, out)
    for pattern in ("stores/*/train-00000.safetensors", "saes/.partial-*/state.json"):
        proc = subprocess.Popen([sys.executable, "-m", "causaldim", *args])
        deadline = time.monotonic() + 120
        while not list(out.glob(pattern)) and proc.poll() is None:
            assert time.monotonic() < deadline, f"{pattern} never appeared"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL, f"the run ended before {pattern} appeared"
    assert not (out / "results.json").exists()
    assert cli.main(args) == 0
    resumed = json.loads((out / "results.json").read_text())
    assert numbers(resumed) == numbers(reference)
