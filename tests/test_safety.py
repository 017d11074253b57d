"""Non-finite values stop a run where they appear; the same seed gives the same numbers;
nothing is unpickled."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import torch
from test_faults import args_for, numbers

import causaldim
from causaldim import cli
from causaldim.harvest.store import write_store
from causaldim.measures.sweep import run_sweep
from causaldim.sweep_config import SweepConfig


def test_the_same_config_gives_the_same_numbers(tmp_path, tiny_model, text_corpus):
    runs = []
    for name in ("a", "b"):
        out = tmp_path / name
        assert cli.main(args_for(tiny_model("llama"), text_corpus, out)) == 0
        runs.append(numbers(json.loads((out / "results.json").read_text())))
    assert runs[0] == runs[1]


def test_a_nan_in_the_model_stops_the_pass_naming_positions(
    tmp_path, tiny_model, text_corpus, capsys
):
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "broken"
    shutil.copytree(tiny_model("llama"), folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        model.model.layers[3].mlp.down_proj.weight[0, 0] = float("nan")
    model.save_pretrained(folder)
    args = args_for(str(folder), text_corpus, tmp_path / "run")
    capsys.readouterr()  # what building the broken model printed
    assert cli.main(args) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the weights' progress bar
    assert last.startswith("causaldim: error: non-finite values in the eval pass at layer 2 ")
    assert "(sequence, position) [(0, 0)" in last
    assert not (tmp_path / "run" / "results.json").exists()


def test_non_finite_activations_stop_sae_training_naming_the_step(tmp_path):
    h = torch.randn(512, 8)
    h[300] = float("inf")
    store = write_store(
        tmp_path / "store",
        {"train": {"h": h}, "eval": {"h": torch.randn(64, 8), "g": torch.randn(64, 8)}},
        16,
        {"toy": "an infinite activation"},
    )
    cfg = SweepConfig(widths=[16], k=2, epochs=1, batch_tokens=128, ce_sequences=0)
    try:
        run_sweep(store, tmp_path, cfg, progress=False)
    except FloatingPointError as exc:
        assert "non-finite SAE loss at step" in str(exc) and "width 16" in str(exc)
    else:
        raise AssertionError("training went on through an infinite activation")


def test_nothing_is_ever_unpickled():
    """No pickle import, no torch.load, no np.load without allow_pickle=False."""
    for path in Path(causaldim.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not any("pickle" in n for n in names), path
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                base = getattr(node.func.value, "id", "")
                assert (base, node.func.attr) != ("torch", "load"), path
                if (base, node.func.attr) == ("np", "load"):
                    kw = {k.arg: getattr(k.value, "value", None) for k in node.keywords}
                    assert kw.get("allow_pickle") is False, path


def test_a_run_writes_only_under_its_folder_and_the_cache(
    tmp_path, tiny_model, text_corpus, monkeypatch
):
    cache = tmp_path / "cache"
    monkeypatch.setenv("CAUSALDIM_CACHE", str(cache))
    model = tiny_model("llama")
    before = {p for p in Path(model).parent.rglob("*")} | {p for p in tmp_path.rglob("*")}
    assert cli.main(args_for(model, text_corpus, tmp_path / "run")) == 0
    after = {p for p in Path(model).parent.rglob("*")} | {p for p in tmp_path.rglob("*")}
    new = after - before
    assert new and all(
        p.is_relative_to(tmp_path / "run") or p.is_relative_to(cache) for p in new
    ), sorted(str(p) for p in new if not p.is_relative_to(tmp_path / "run"))
