"""Bad input: one line naming the fix, exit code 2, nothing written, before model work."""

from __future__ import annotations

import json

import pytest
from conftest import snapshot

from causaldim import cli


def cases(tmp_path, tiny_model, text_corpus):
    empty = tmp_path / "empty.txt"
    empty.write_text("   \n")
    bad_jsonl = tmp_path / "bad.jsonl"
    bad_jsonl.write_text('{"body": "no text field here"}\n')
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    llama = tiny_model("llama")
    base = ["--model", llama, "--corpus", str(text_corpus), "--tokens", "1024", "--seq-len", "32"]
    return {
        "unknown model": (["--model", "no-such-org/no-such-model"], "is not in the HF cache"),
        "missing model path": (["--model", "./nowhere/model"], "neither a model folder"),
        "missing gguf": (["--model", str(tmp_path / "x.gguf")], "does not exist"),
        "layer out of range": ([*base, "--layer", "4"], "out of range"),
        "negative layer": ([*base, "--layer", "-1"], "--layer must be >= 0"),
        "missing corpus": ([*base, "--corpus", str(tmp_path / "nope.txt")], "does not exist"),
        "empty corpus": ([*base, "--corpus", str(empty)], "is empty"),
        "jsonl without field": ([*base, "--corpus", str(bad_jsonl)], "--text-field"),
        "seq_len above context": (
            [*base, "--seq-len", "4096", "--tokens", "40960"],
            "exceeds the context",
        ),
        "corpus too small": (
            [*base, "--seq-len", "250", "--tokens", "2500"]
            + ["--corpus", str(bad_jsonl), "--text-field", "body"],
            "at least 2 are needed",
        ),
        "zero tokens": ([*base, "--tokens", "0"], "--tokens must be positive"),
        "tokens below two eval sequences": (
            [*base, "--tokens", "100"],
            "fewer than two eval sequences",
        ),
        "embedded model misspelt": (
            ["--model", "smollm2-13m", "--corpus", str(text_corpus)],
            "did you mean 'smollm2-135m'?",
        ),
        "built-in corpus misspelt": (
            [*base[:2], "--corpus", "builtin+speechs"],
            "did you mean 'speeches'?",
        ),
        "eval fraction": ([*base, "--eval-fraction", "1.5"], "--eval-fraction"),
        "outlier factor": ([*base, "--outlier-factor", "0.5"], "--outlier-factor"),
        "out is a file": ([*base, "--out", str(a_file)], "is a file"),
        "unknown family": (
            ["--model", tiny_model("phi"), "--corpus", str(text_corpus)],
            "--layers-path",
        ),
        "bad layers path": ([*base, "--layers-path", "model.blocks"], "has no attribute"),
        "negative probes": ([*base, "--logit-probes", "-1"], "--logit-probes must be >= 0"),
        "not a number": ([*base, "--tokens", "many"], "invalid int value"),
        "unknown flag": ([*base, "--tokenz", "5"], "unrecognized arguments"),
        "unknown preset": ([*base, "--preset", "huge"], "unknown preset"),
        "config file missing": ([*base, "--config", str(tmp_path / "no.json")], "does not exist"),
        "config file not json": ([*base, "--config", str(a_file)], "is not valid JSON"),
        "config file unknown key": (
            [*base, "--config", _json(tmp_path, {"harvest": {"tokenz": 5}})],
            "unknown setting 'tokenz'; did you mean 'tokens'?",
        ),
        "config file wrong type": (
            [*base, "--config", _json(tmp_path, {"tokens": "lots"})],
            "setting 'tokens' must be int",
        ),
        "config file bad section": (
            [*base, "--config", _json(tmp_path, {"sweep": [1, 2]})],
            "'sweep' must be an object of settings",
        ),
    }


def _json(tmp_path, obj) -> str:
    path = tmp_path / f"config-{abs(hash(json.dumps(obj, sort_keys=True)))}.json"
    path.write_text(json.dumps(obj))
    return str(path)


CASE_NAMES = [
    "unknown model",
    "missing model path",
    "missing gguf",
    "layer out of range",
    "negative layer",
    "missing corpus",
    "empty corpus",
    "jsonl without field",
    "seq_len above context",
    "corpus too small",
    "zero tokens",
    "tokens below two eval sequences",
    "embedded model misspelt",
    "built-in corpus misspelt",
    "eval fraction",
    "outlier factor",
    "out is a file",
    "unknown family",
    "bad layers path",
    "negative probes",
    "not a number",
    "unknown flag",
    "unknown preset",
    "config file missing",
    "config file not json",
    "config file unknown key",
    "config file wrong type",
    "config file bad section",
]


@pytest.mark.parametrize("command", ["harvest", "run"])
@pytest.mark.parametrize("case", CASE_NAMES)
def test_bad_input(tmp_path, tiny_model, text_corpus, capsys, no_model_work, case, command):
    args, message = cases(tmp_path, tiny_model, text_corpus)[case]
    out = tmp_path / "out"
    if "--out" not in args:
        args = [*args, "--out", str(out)]
    before = snapshot(tmp_path)
    capsys.readouterr()  # drop what building the fixtures printed
    assert cli.main(["--quiet", command, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err
    assert len(err.splitlines()) == 1 and err.startswith("causaldim: error: ")
    assert snapshot(tmp_path) == before  # nothing written or overwritten
    assert not out.exists()


def run_cases(tmp_path, tiny_model, text_corpus):
    """Bad settings that only `run` takes (the sweep, the analysis, the controls)."""
    foreign = tmp_path / "someone-elses"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("x")
    return {
        "widths not increasing": (["--widths", "64", "32"], "strictly increasing"),
        "k above the smallest width": (["--widths", "16", "32", "--k", "20"], "--k must lie"),
        "unknown architecture": (["--architectures", "gated"], "invalid choice"),
        "percentile": (["--percentile", "100"], "--percentile must lie in (0, 100)"),
        "reference width": (["--reference-width", "48"], "is not among --widths"),
        "negative bootstrap": (["--bootstrap", "-1"], "--bootstrap must be >= 0"),
        "one block": (["--blocks", "1"], "--blocks must be at least 2"),
        "zero epochs": (["--epochs", "0"], "--epochs must be positive"),
        "negative lr": (["--lr", "-0.1"], "--lr must be positive"),
        "negative checkpoint steps": (["--checkpoint-steps", "-5"], "--checkpoint-steps"),
        "unknown control": (["--controls", "everything"], "invalid choice"),
        "depth layer out of range": (
            ["--controls", "depth", "--depth-layers", "1", "9"],
            "layer 9 is out of range",
        ),
        "scale model missing": (
            ["--controls", "scale", "--scale-model", str(tmp_path / "nope")],
            "neither a model folder",
        ),
        "config value out of range": (
            ["--config", _json(tmp_path, {"analysis": {"percentile": 0.0}})],
            "--percentile must lie in (0, 100)",
        ),
        "out holds another run's files": (["--out", str(foreign)], "not a causaldim run"),
    }


RUN_CASE_NAMES = [
    "widths not increasing",
    "k above the smallest width",
    "unknown architecture",
    "percentile",
    "reference width",
    "negative bootstrap",
    "one block",
    "zero epochs",
    "negative lr",
    "negative checkpoint steps",
    "unknown control",
    "depth layer out of range",
    "scale model missing",
    "config value out of range",
    "out holds another run's files",
]


@pytest.mark.parametrize("case", RUN_CASE_NAMES)
def test_bad_run_input(tmp_path, tiny_model, text_corpus, capsys, no_model_work, case):
    args, message = run_cases(tmp_path, tiny_model, text_corpus)[case]
    base = ["--model", tiny_model("llama"), "--corpus", str(text_corpus), "--seq-len", "32"]
    base += ["--widths", "16", "32", "--k", "4"]
    if "--out" not in args:
        base += ["--out", str(tmp_path / "out")]
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert cli.main(["--quiet", "run", *base, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err
    assert len(err.splitlines()) == 1 and err.startswith("causaldim: error: ")
    assert snapshot(tmp_path) == before
    assert not (tmp_path / "out").exists()


def test_not_enough_disk_is_refused_before_any_work(
    tmp_path, tiny_model, text_corpus, capsys, no_model_work, monkeypatch
):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    out = tmp_path / "out"
    args = ["--model", tiny_model("llama"), "--corpus", str(text_corpus), "--out", str(out)]
    assert cli.main(["--quiet", "run", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "GB free" in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_a_config_file_sets_what_flags_do_not(tmp_path, tiny_model, text_corpus):
    """File over preset, flags over file; a results.json's config block is accepted."""
    from causaldim.cli import _config, _parser
    from causaldim.config import HarvestConfig
    from causaldim.presets import PRESETS, read_config_file
    from causaldim.sweep_config import SweepConfig

    config = _json(tmp_path, {"harvest": {"tokens": 4096, "seq_len": 64}, "sweep": {"k": 8}})
    values = {**PRESETS["smoke"], **read_config_file(config)}
    args = _parser(values).parse_args(["run", "--seq-len", "32"])
    harvest, sweep = _config(args, HarvestConfig), _config(args, SweepConfig)
    assert (harvest.tokens, harvest.seq_len, sweep.k) == (4096, 32, 8)
    assert sweep.widths == PRESETS["smoke"]["widths"]


def small_harvest_args(tmp_path, text_corpus) -> list[str]:
    """A quick harvest into tmp_path/out, model left to the caller."""
    return [
        "--corpus",
        str(text_corpus),
        "--tokens",
        "512",
        "--seq-len",
        "32",
        "--out",
        str(tmp_path / "out"),
    ]


def test_output_folder_of_another_model_is_refused(tmp_path, tiny_model, text_corpus, capsys):
    common = small_harvest_args(tmp_path, text_corpus)
    assert cli.main(["--quiet", "harvest", "--model", tiny_model("llama"), *common]) == 0
    gpt2 = tiny_model("gpt2")
    before = snapshot(tmp_path)
    assert cli.main(["--quiet", "harvest", "--model", gpt2, *common]) == 2
    assert "holds a store of another model" in capsys.readouterr().err
    assert snapshot(tmp_path) == before


def test_report_of_a_missing_file_is_refused(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path / "results.json")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit):
        cli.main(["harvest", "--help"])
    text = capsys.readouterr().out
    for flag in ("--model", "--layer", "--corpus", "--tokens", "--seq-len", "--out", "--dtype"):
        assert flag in text
    assert "Layer L whose output residual stream" in text


def test_train_runs_the_sweep_and_splices_each_sae(tmp_path, tiny_model, text_corpus, capsys):
    out = tmp_path / "out"
    args = [
        "--quiet",
        "train",
        "--model",
        tiny_model("llama"),
        "--corpus",
        str(text_corpus),
        "--tokens",
        "4096",
        "--seq-len",
        "32",
        "--logit-probes",
        "0",
        "--fisher-probes",
        "0",
        "--widths",
        "16",
        "64",
        "--architectures",
        "topk",
        "jumprelu",
        "--k",
        "4",
        "--epochs",
        "1",
        "--batch-tokens",
        "256",
        "--ce-sequences",
        "4",
        "--out",
        str(out),
    ]
    assert cli.main(args) == 0
    printed = capsys.readouterr().out
    assert "topk-w16" in printed and "jumprelu-w64" in printed and "CE rec." in printed
    spliced = json.loads((out / "saes" / "ce_loss_recovered.json").read_text())
    assert set(spliced["saes"]) == {"topk-w16", "topk-w64", "jumprelu-w16", "jumprelu-w64"}
    assert spliced["n_predictions"] == 4 * 30  # position 0 and the last are never scored
    assert cli.main(args) == 0
    assert printed.count("(reused)") == 0 and capsys.readouterr().out.count("(reused)") == 4


def test_same_weights_under_another_path_share_the_output_folder(tmp_path, tiny_model, text_corpus):
    common = small_harvest_args(tmp_path, text_corpus)
    llama = tiny_model("llama")
    assert cli.main(["--quiet", "harvest", "--model", llama, *common]) == 0
    assert cli.main(["--quiet", "harvest", "--model", llama + "/.", *common]) == 0


def test_output_folder_of_another_harvest_is_refused(tmp_path, tiny_model, text_corpus, capsys):
    from test_faults import args_for

    out = tmp_path / "run"
    args = args_for(tiny_model("llama"), text_corpus, out)
    assert cli.main(args) == 0
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert cli.main([*args, "--seq-len", "16"]) == 2
    err = capsys.readouterr().err.strip()
    assert "holds a run of another harvest" in err and "seq_len" in err
    assert snapshot(tmp_path) == before


def _float_fields():
    import dataclasses

    from causaldim.config import AnalysisConfig, HarvestConfig
    from causaldim.sweep_config import SweepConfig

    for cls in (HarvestConfig, AnalysisConfig, SweepConfig):
        for f in dataclasses.fields(cls):
            if isinstance(getattr(cls(), f.name), float):
                yield cls, f.name


@pytest.mark.parametrize("cls, name", list(_float_fields()))
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_every_float_setting_refuses_nan_and_infinity(cls, name, value):
    import dataclasses

    from causaldim.errors import UsageError

    flag = name.replace("_", "-")
    with pytest.raises(UsageError, match=f"^--{flag} must be a finite number, got"):
        dataclasses.replace(cls(), **{name: value}).check()


@pytest.mark.parametrize("flag", ["--lr", "--outlier-factor", "--converged-change"])
def test_a_nan_setting_stops_the_dry_run_too(tmp_path, tiny_model, text_corpus, capsys, flag):
    out = tmp_path / "out"
    args = ["--model", tiny_model("llama"), "--corpus", str(text_corpus), "--out", str(out)]
    assert cli.main(["--quiet", "run", "--dry-run", *args, flag, "nan"]) == 2
    assert f"{flag} must be a finite number, got nan" in capsys.readouterr().err
    assert not out.exists()


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_cmd_models", interrupted)
    assert cli.main(["models"]) == 130
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "interrupted; run the same command again" in err
