"""`causaldim train` runs run's checks, then the harvest, then the sweep where it was asked
to run (in this process or as Ray tasks) or imports the SAEs given; `causaldim harvest`
checks its output folder as a run does."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from conftest import snapshot

from causaldim import cli, memory
from causaldim.config import HarvestConfig
from causaldim.executors import RayExecutor
from causaldim.harvest import plan
from causaldim.measures import sweep as sweep_mod
from causaldim.presets import PRESETS

D = 32  # the tiny Llama's residual width


def folders(root):
    return sorted(os.path.relpath(d, root) for d, _, _ in os.walk(root))


@pytest.fixture
def no_training(monkeypatch):
    """Training an SAE in this process is a failure in itself."""

    def forbidden(*a, **k):
        raise AssertionError("an SAE was trained in this process")

    monkeypatch.setattr(sweep_mod, "train_sae", forbidden)
    monkeypatch.setattr(sweep_mod, "run_sweep", forbidden)


def harvest_args(model, corpus, out) -> list[str]:
    return [
        "--model",
        model,
        "--corpus",
        str(corpus),
        "--tokens",
        "1024",
        "--seq-len",
        "32",
        "--shard-tokens",
        "256",
        "--logit-probes",
        "0",
        "--fisher-probes",
        "0",
        "--out",
        str(out),
    ]


def train_args(model, corpus, out, *extra: str) -> list[str]:
    sweep = ["--widths", "16", "32", "--k", "4", "--epochs", "1", "--batch-tokens", "128"]
    return [
        "--quiet",
        "train",
        *harvest_args(model, corpus, out),
        *sweep,
        "--ce-sequences",
        "0",
        *extra,
    ]


def refused(capsys, argv, root, message: str) -> str:
    """argv exits with 2 and one line of error holding message, writing nothing under
    root; returns the line."""
    before, dirs = snapshot(root), folders(root)
    capsys.readouterr()  # drop what building the fixtures printed
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("causaldim: error: "), err
    assert message in err, err
    assert snapshot(root) == before and folders(root) == dirs  # nothing written
    return err


def gemma_scope_npz(path, d: int, width: int):
    """A Gemma Scope params.npz (JumpReLU) reading d-wide residuals."""
    gen = np.random.default_rng(0)
    np.savez(
        path,
        W_enc=gen.normal(0, d**-0.5, size=(d, width)).astype(np.float32),
        W_dec=gen.normal(0, width**-0.5, size=(width, d)).astype(np.float32),
        b_enc=np.zeros(width, dtype=np.float32),
        b_dec=np.zeros(d, dtype=np.float32),
        threshold=gen.uniform(0.01, 0.1, size=width).astype(np.float32),
    )
    return path


def table_rows(printed: str) -> dict[str, str]:
    """The train table's rows by SAE name."""
    lines = printed.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("SAE "))
    return {line.split()[0]: line for line in lines[start + 1 :] if line.strip()}


@pytest.fixture
def cluster():
    """A fresh local Ray instance with 2 CPUs, as in test_executors."""
    ray = pytest.importorskip("ray")

    def start():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)

    yield start
    ray.shutdown()


@pytest.mark.slow
def test_train_on_ray_runs_each_sae_as_a_ray_task(
    tmp_path, tiny_model, text_corpus, capsys, monkeypatch, cluster
):
    """The jobs go to RayExecutor.map, and none trains in this process (train_sae is
    forbidden here; Ray workers import their own): the SAEs were trained by Ray tasks."""
    cluster()
    calls = []
    original = RayExecutor.map

    def spy(self, fn, jobs, desc="jobs", progress=False):
        calls.append((fn.__name__, [job.folder for job in jobs], desc))
        return original(self, fn, jobs, desc, progress)

    monkeypatch.setattr(RayExecutor, "map", spy)

    def forbidden(*a, **k):
        raise AssertionError("an SAE was trained in the driver, not in a Ray task")

    monkeypatch.setattr(sweep_mod, "train_sae", forbidden)
    out = tmp_path / "out"
    capsys.readouterr()
    assert cli.main(train_args(tiny_model("llama"), text_corpus, out, "--executor", "ray")) == 0
    saes = out / "saes"
    assert calls == [("train_job", [str(saes / "topk-w16"), str(saes / "topk-w32")], "SAE sweep")]
    rows = table_rows(capsys.readouterr().out)
    assert set(rows) == {"topk-w16", "topk-w32"}
    for name in rows:
        meta = json.loads((saes / name / "cfg.json").read_text())
        assert meta["train_stats"]["steps"] > 0 and meta["eval"]["n_tokens"] > 0
        assert (saes / name / "sae.safetensors").is_file()


def test_train_imports_the_sae_paths_instead_of_training(
    tmp_path, tiny_model, text_corpus, capsys, no_training
):
    params = gemma_scope_npz(tmp_path / "params.npz", D, 48)
    out = tmp_path / "out"
    capsys.readouterr()
    argv = train_args(tiny_model("llama"), text_corpus, out, "--sae-paths", str(params))
    assert cli.main(argv) == 0
    rows = table_rows(capsys.readouterr().out)
    assert list(rows) == ["jumprelu-w48"]
    folder = out / "saes" / "jumprelu-w48"
    assert folder.is_dir() and (folder / "sae.safetensors").is_file()
    meta = json.loads((folder / "cfg.json").read_text())
    assert meta["request"]["imported"] == str(params.resolve())
    assert meta["train_stats"]["imported_from"] == str(params)
    assert sorted(p.name for p in (out / "saes").iterdir()) == ["jumprelu-w48"]  # no sweep


def test_train_refuses_to_drop_the_weights_it_trains(
    tmp_path, tiny_model, text_corpus, capsys, no_model_work
):
    argv = train_args(tiny_model("llama"), text_corpus, tmp_path / "out", "--drop-weights")
    refused(capsys, argv, tmp_path, "use 'causaldim run'")


def test_train_into_a_folder_of_foreign_files_is_refused(
    tmp_path, tiny_model, text_corpus, capsys, no_model_work
):
    out = tmp_path / "someone-elses"
    out.mkdir()
    (out / "thesis.tex").write_text("x")
    argv = train_args(tiny_model("llama"), text_corpus, out)
    err = refused(capsys, argv, tmp_path, "not a causaldim run")
    assert "thesis.tex" in err


def test_train_into_a_finished_run_of_another_harvest_is_refused(
    tmp_path, tiny_model, text_corpus, capsys, no_model_work
):
    out = tmp_path / "out"
    argv = train_args(tiny_model("llama"), text_corpus, out)
    parsed = cli._parser(dict(PRESETS["default"])).parse_args(argv[1:])
    key = plan(cli._config(parsed, HarvestConfig)).key  # the store key this train would have
    assert not out.exists()
    out.mkdir()
    earlier = {**key, "seq_len": 16}  # a run of the same model and corpus at another seq_len
    (out / "results.json").write_text(json.dumps({"inputs": {"store": {"key": earlier}}}))
    err = refused(capsys, argv, tmp_path, "holds a run of another harvest")
    assert "(seq_len differ)" in err


def test_train_with_an_sae_of_another_width_of_residual_is_refused(
    tmp_path, tiny_model, text_corpus, capsys, no_model_work
):
    params = gemma_scope_npz(tmp_path / "params.npz", D // 2, 48)
    argv = train_args(
        tiny_model("llama"), text_corpus, tmp_path / "out", "--sae-paths", str(params)
    )
    err = refused(capsys, argv, tmp_path, f"the SAE reads d = {D // 2}")
    assert f"has d = {D}" in err
    assert not (tmp_path / "out").exists()


def test_harvest_into_a_folder_of_foreign_files_is_refused(
    tmp_path, tiny_model, text_corpus, capsys, no_model_work
):
    out = tmp_path / "someone-elses"
    out.mkdir()
    (out / "notes.md").write_text("x")
    argv = ["--quiet", "harvest", *harvest_args(tiny_model("llama"), text_corpus, out)]
    err = refused(capsys, argv, tmp_path, "not a causaldim run")
    assert "notes.md" in err


def test_train_of_an_sae_too_wide_for_the_device_is_refused_before_any_work(
    tmp_path, tiny_model, text_corpus, capsys, no_model_work, monkeypatch
):
    wide = 1 << 20
    need = memory.sae_training_bytes(D, wide, 128, "float32")
    monkeypatch.setattr(memory, "memory", lambda device: (need, need // 2))
    argv = train_args(
        tiny_model("llama"), text_corpus, tmp_path / "out", "--widths", "16", str(wide)
    )
    err = refused(capsys, argv, tmp_path, "1,048,576-wide SAE needs about")
    assert "--sae-paths" in err
    assert not (tmp_path / "out").exists()
