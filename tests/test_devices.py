"""The GPU path, as far as a CPU machine can check it: --device and 'auto' resolved
against the machine, refusals before any work, batch sizes from the memory estimate, and
every tensor a stage makes on the device it names. The run on a real GPU is the last
test, skipped where there is none."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from test_faults import args_for, numbers

from causaldim import cli, devices, memory
from causaldim.checks import check
from causaldim.config import AnalysisConfig
from causaldim.controls.ablation import atp_vs_ablation
from causaldim.controls.task import task_recovery
from causaldim.devices import resolve_device, resolve_dtype
from causaldim.errors import UsageError
from causaldim.executors import LocalExecutor
from causaldim.harvest import plan
from causaldim.harvest.model_pass import grads_at, residuals_at
from causaldim.measures.kappa import measure
from causaldim.measures.score import ScoreJob, load_scores, score_job
from causaldim.measures.splice import ce_loss_recovered
from causaldim.measures.sweep import load_entries, run_sweep
from causaldim.memory import ModelPassMemory, model_batch_size
from causaldim.sweep_config import SweepConfig

CUDA = torch.cuda.is_available()
GiB = 2**30


@pytest.mark.skipif(CUDA, reason="checks the answers of a machine without a GPU")
def test_auto_is_the_cpu_here_and_cuda_is_refused():
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_dtype("auto", torch.device("cpu")) == "float32"
    for name in ("cuda", "cuda:0"):
        with pytest.raises(UsageError, match="no CUDA GPU.*--device cpu"):
            resolve_device(name)


def test_a_device_that_is_not_one_is_refused():
    for name in ("gpu", "tpu:0", "mps"):
        with pytest.raises(UsageError, match="--device"):
            resolve_device(name)


def test_cuda_indices_and_bf16_follow_the_gpus_there_are(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(UsageError, match=r"2 CUDA GPU\(s\) \(cuda:0..cuda:1\)"):
        resolve_device("cuda:2")
    for capability, dtype in (((8, 0), "bfloat16"), ((9, 0), "bfloat16"), ((7, 5), "float32")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d, c=capability: c)
        assert resolve_dtype("auto", torch.device("cuda", 0)) == dtype
        assert resolve_dtype("float32", torch.device("cuda", 0)) == "float32"


@pytest.mark.skipif(CUDA, reason="checks the answers of a machine without a GPU")
def test_the_cli_refuses_a_missing_gpu_before_any_work(tiny_model, text_corpus, tmp_path, capsys):
    out, args = tmp_path / "run", args_for(tiny_model("llama"), text_corpus, tmp_path / "run")
    capsys.readouterr()
    assert cli.main([*args, "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--device cpu" in err
    assert not out.exists()


def test_the_batch_fills_the_memory_left_after_the_weights():
    need = ModelPassMemory(weights=10 * GiB, per_sequence=GiB, budget=50 * GiB)
    assert need.batch_that_fits() == 40
    assert model_batch_size(need, torch.device("cuda", 0), n_sequences=1000) == 40
    assert model_batch_size(need, torch.device("cuda", 0), n_sequences=12) == 12
    assert model_batch_size(need, torch.device("cpu"), n_sequences=1000) == memory.CPU_BATCH
    big = ModelPassMemory(weights=10 * GiB, per_sequence=GiB, budget=1000 * GiB)
    assert model_batch_size(big, torch.device("cuda", 0), 10_000) == memory.MAX_BATCH
    short = ModelPassMemory(weights=45 * GiB, per_sequence=6 * GiB, budget=50 * GiB)
    with pytest.raises(UsageError, match="per sequence.*lower --seq-len"):
        model_batch_size(short, torch.device("cuda", 0), 1000)


def test_the_estimate_grows_with_what_the_pass_holds(tiny_model):
    from causaldim.model.load import resolve_model

    config, cpu = resolve_model(tiny_model("llama")).config, torch.device("cpu")

    def per_sequence(**kw):
        args = dict(lowest_layer=1, seq_len=32, dtype="float32", logit_probes=1, fisher_probes=1)
        return memory.model_pass_memory(config, 1000, device=cpu, **{**args, **kw}).per_sequence

    base = per_sequence()
    assert per_sequence(seq_len=64) > 2 * base  # attention rows grow with the square
    assert per_sequence(lowest_layer=0) > base  # one more block kept for backward
    assert per_sequence(logit_probes=0, fisher_probes=0) < base
    assert per_sequence(dtype="bfloat16") < base


def test_an_unset_batch_size_comes_from_free_memory(harvest_config, monkeypatch):
    p = plan(harvest_config(batch_size=None))
    assert p.config.batch_size == memory.CPU_BATCH and p.config.device == "cpu"
    assert p.config.dtype == "float32" and p.key["dtype"] == "float32"
    room = p.pass_memory.weights + 3 * p.pass_memory.per_sequence
    monkeypatch.setattr(memory, "memory", lambda device: (room * 2, room / memory.HEADROOM))
    assert plan(harvest_config(batch_size=None)).config.batch_size == 3
    assert plan(harvest_config(batch_size=5)).config.batch_size == 5  # as given


def test_an_sae_too_wide_for_the_device_is_refused_before_any_work(
    harvest_config, monkeypatch, tmp_path
):
    cfg = harvest_config(out=str(tmp_path / "run"))
    need = memory.sae_training_bytes(32, 1 << 20, 128, "float32")
    monkeypatch.setattr(memory, "memory", lambda device: (need, need // 2))
    sweep = SweepConfig(widths=[64, 1 << 20], k=4, batch_tokens=128)
    with pytest.raises(UsageError, match="1,048,576-wide SAE needs about .* --sae-paths"):
        check(cfg, sweep, AnalysisConfig())
    assert not (tmp_path / "run").exists()


def test_scoring_takes_fewer_tokens_at_a_time_where_memory_is_short(monkeypatch):
    d, width = 64, 1 << 16
    per_token = memory.SCORE_ROW_BYTES * width + 16 * d
    weights = 8 * d * width
    monkeypatch.setattr(
        memory, "memory", lambda device: (0, (weights + 100 * per_token) / memory.HEADROOM)
    )
    assert memory.dense_batch_tokens(d, width, 4096, torch.device("cpu")) == 100
    assert memory.dense_batch_tokens(d, width, 64, torch.device("cpu")) == 64


def test_every_tensor_a_stage_makes_names_its_device(tiny_lm_store, tmp_path):
    """On a GPU a tensor made without a device lands on the CPU beside CUDA ones and the
    stage fails. Here the default device is 'meta' while every stage runs on the CPU:
    such a tensor is a meta tensor beside CPU ones, and fails the same way."""
    lm, store = tiny_lm_store(1024)
    sweep = SweepConfig(  # every architecture; features dead after 64 tokens, so AuxK runs
        widths=[64],
        architectures=["topk", "jumprelu", "relu"],
        k=4,
        epochs=1,
        batch_tokens=128,
        dead_tokens=64,
        ce_sequences=0,
    )
    ids, gen = store.token_ids("eval", 4), torch.Generator().manual_seed(0)
    with torch.device("meta"):
        entries = run_sweep(store, tmp_path, sweep, progress=False, executor=LocalExecutor("cpu"))
        job = ScoreJob(str(store.root), str(entries[0].folder), 4, 512, str(tmp_path / "s"))
        scores = load_scores(score_job(job, "cpu"))
        saes = load_entries(entries)
        sigma = measure(store, AnalysisConfig(blocks=4, bootstrap=5), 0, "cpu")
        residuals_at(lm, (1, 2), ids)
        grads_at(lm, (1, 2), ids, 1, 1, gen)
        mean = torch.zeros(store.d_model, device="cpu")
        ce = ce_loss_recovered(lm, 1, ids, saes, mean, 1e9)
        sae = saes["topk-w64"]
        ablation = atp_vs_ablation(lm, store, {64: sae}, {64: scores}, 0.0, 98.0, 4, 4)
        task = task_recovery(lm, store, sae, scores, 8)
    assert scores.atp.device.type == "cpu" and scores.atp.isfinite().all()
    assert all(p.device.type == "cpu" for p in sae.parameters())  # moved back after use
    assert sigma["loss"].erank > 0 and sigma["loss"].erank_corrected > 0
    assert ce["clean_loss"] > 0 and ablation["rows"] and task["n_prompts"] > 0


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_a_gpu_run_gives_the_cpu_numbers(tiny_model, text_corpus, tmp_path):
    """float32 on both; the GPU's sums in another order move the last digits only. On the
    GPU, --drop-weights over the same SAEs (its digests' products there) gives the same
    counts and splits."""
    runs = {}
    for name, device, extra in (
        ("cpu", "cpu", []),
        ("cuda", "cuda", []),
        ("drop", "cuda", ["--drop-weights"]),
    ):
        out = tmp_path / name
        if name == "drop":  # the GPU run's store and SAEs, scored and dropped
            shutil.copytree(tmp_path / "cuda", out)
        args = [*args_for(tiny_model("llama"), text_corpus, out), "--device", device, *extra]
        assert cli.main([*args, "--dtype", "float32", "--sae-dtype", "float32"]) == 0
        runs[name] = json.loads((out / "results.json").read_text())
    for arch, result in runs["cuda"]["sweep"].items():
        dropped = runs["drop"]["sweep"][arch]
        assert [r["n_causal"] for r in result["per_width"]] == [
            r["n_causal"] for r in dropped["per_width"]
        ]
        assert [s["children"] for s in result["splits"]] == [
            s["children"] for s in dropped["splits"]
        ]
    cpu, gpu = (numbers(runs[k]) for k in ("cpu", "cuda"))
    assert gpu["config"]["harvest"]["device"].startswith("cuda")
    for arch, result in cpu["sweep"].items():
        counts = [[r["n_repr"], r["n_causal"]] for r in result["per_width"]]
        assert counts == [[r["n_repr"], r["n_causal"]] for r in gpu["sweep"][arch]["per_width"]]
    for reading, est in cpu["sigma"].items():
        assert est["erank"] == pytest.approx(gpu["sigma"][reading]["erank"], rel=1e-3)


def test_memory_reports_this_machine():
    total, free = devices.memory(torch.device("cpu"))
    assert 0 < free <= total


def test_a_dry_run_plans_for_a_gpu_this_machine_does_not_have(
    tmp_path, tiny_model, text_corpus, capsys
):
    from test_pipeline import run_args

    out = tmp_path / "run"
    args = run_args(tiny_model("llama"), text_corpus, out)
    if not torch.cuda.is_available():  # without --plan-for, a missing GPU is refused
        assert cli.main([*args, "--device", "cuda", "--dry-run"]) == 2
        assert "--dry-run --plan-for h100" in capsys.readouterr().err
    assert cli.main([*args, "--device", "cuda", "--dry-run", "--plan-for", "h100"]) == 0
    printed = capsys.readouterr().out
    assert "planned for NVIDIA H100 80GB SXM (planned), not this machine" in printed
    assert "device: cuda:0 (NVIDIA H100 80GB SXM (planned), 80 GiB, 80 GiB free)" in printed
    assert "speed stated for NVIDIA H100 80GB SXM (planned)" in printed
    assert "on the planned GPU, not timed: between" in printed and "book the slow end" in printed
    assert not out.exists()
    assert cli.main([*args, "--plan-for", "h100"]) == 2  # a plan, not a run
    assert "add --dry-run" in capsys.readouterr().err
    assert cli.main([*args, "--device", "cpu", "--dry-run", "--plan-for", "h100"]) == 2
    assert not out.exists()
    assert devices.planned() is None  # the plan's GPU is gone once the dry run ends


def test_the_paper_preset_plans_its_widest_sae_and_its_own_data_on_an_h100(
    tmp_path, capsys, monkeypatch
):
    """Gemma-2-2B's 1,048,576-wide SAE fits an 80 GB card with the lean optimiser, and the
    plan states the paper's 8.4M tokens beside the built-in corpus's."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # planned from the model's known shape
    args = ["run", "--preset", "paper", "--out", str(tmp_path / "run")]
    assert cli.main([*args, "--device", "cuda", "--dry-run", "--plan-for", "h100"]) == 0
    printed = capsys.readouterr().out
    assert "would stop: training" not in printed
    assert "(lean optimiser)" in printed
    assert "with all 8,388,608 tokens --tokens asks" in printed
    assert not (tmp_path / "run").exists()


def test_an_sae_adam_cannot_train_names_the_lean_optimiser_where_it_fits(monkeypatch):
    d, width, tokens = 2304, 1 << 20, 4096
    adam = memory.sae_training_bytes(d, width, tokens, "bfloat16", "adam", 128)
    lean = memory.sae_training_bytes(d, width, tokens, "bfloat16", "lean", 128)
    assert lean < 0.8 * adam
    free = (lean + adam) / 2 / memory.HEADROOM
    monkeypatch.setattr(memory, "memory", lambda device: (free, free))
    widths = [1 << 14, 1 << 17, width]
    with pytest.raises(UsageError, match="the widest that fits is 131,072; use --optimizer lean"):
        memory.check_sae_training(d, widths, tokens, "bfloat16", "cuda", 0, "adam", 128)
    memory.check_sae_training(d, widths, tokens, "bfloat16", "cuda", 0, "lean", 128)
