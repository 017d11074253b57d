"""Presets and settings: every setting a run is given is read, or the run says it is not."""

from __future__ import annotations

import dataclasses

import pytest
from test_pipeline import run_args

from causaldim import cli, controls
from causaldim.presets import (
    CONFIG_CLASSES,
    PRESETS,
    READ_ONLY_WHEN,
    command_for,
    preset_configs,
    unused_settings,
)

OWN = {n for n in controls.NAMES if controls.get(n).uses_control_sweep}

# Read by every run that is given them (the rest are in presets.READ_ONLY_WHEN): a new
# setting must be put in one or the other.
READ_BY_EVERY_RUN = {
    # what is measured, on what, and where it is written
    *("model", "layer", "layers_path", "corpus", "tokens", "eval_fraction", "seq_len"),
    *("corpus_config", "corpus_split", "corpus_revision"),  # refused unless a hub corpus
    *("batch_size", "logit_probes", "fisher_probes", "device", "dtype", "store_dtype"),
    *("outlier_factor", "shard_tokens", "seed", "out", "repair", "trust_remote_code"),
    *("until_converged", "target_width"),  # --target-width alone is refused
    # the analysis of every run
    *("blocks", "bootstrap", "percentile", "reference_width", "atp_normalisation"),
    *("min_firings", "include_outliers", "min_samples_per_dim", "converged_change"),
    *("read_tokens", "profile", "controls"),
    # the sweep, trained or imported
    *("sae_seeds", "sae_paths", "sae_release", "sae_ids", "executor", "ce_sequences"),
    "drop_weights",  # refused with imported SAEs
}

# (setting, value, settings under which it is not read, settings under which it is)
CASES = [
    ("text_field", "body", {}, {"corpus": "docs.jsonl"}),
    ("profile_blocks", 4, {}, {"profile": True}),
    ("control_epochs", 1, {"controls": ["ablation"]}, {"controls": ["depth"]}),
    ("control_widths", [16, 32], {}, {"controls": ["architectures"]}),
    ("ablation_features", 2, {"controls": ["task"]}, {"controls": ["ablation"]}),
    ("ablation_sequences", 2, {}, {"controls": ["all"]}),
    ("task_prompts", 8, {}, {"controls": ["task"]}),
    ("depth_layers", [1], {}, {"controls": ["depth"]}),
    ("scale_model", "other-model", {}, {"controls": ["scale"]}),
    ("ray_address", "auto", {}, {"executor": "ray"}),
    ("max_eval_tokens", 65_536, {}, {"until_converged": True}),
    ("headline_tokens", 4096, {"logit_probes": 0}, {}),
    ("ladder_sequences", 6, {"logit_probes": 0}, {}),
    *(
        (name, value, {"sae_paths": ["sae.npz"]}, {})
        for name, value in [
            ("widths", [64, 128]),
            ("architectures", ["relu"]),
            ("k", 4),
            ("sae_dtype", "bfloat16"),
            ("optimizer", "lean"),
            ("save_dtype", "float16"),
            ("epochs", 1),
            ("lr", 0.01),
            ("batch_tokens", 128),
            ("dead_tokens", 100),
            ("checkpoint_steps", 7),
        ]
    ),
]


def test_every_setting_is_read_by_every_run_or_its_exceptions_are_listed():
    every = {f.name for c in CONFIG_CLASSES.values() for f in dataclasses.fields(c)}
    assert set(READ_ONLY_WHEN) | READ_BY_EVERY_RUN == every
    assert not set(READ_ONLY_WHEN) & READ_BY_EVERY_RUN
    assert {case[0] for case in CASES} == set(READ_ONLY_WHEN)


@pytest.mark.parametrize(("name", "value", "unread", "read"), CASES, ids=[c[0] for c in CASES])
def test_a_setting_a_run_does_not_read_is_said(name, value, unread, read):
    notes = unused_settings("default", *preset_configs("default", **{**unread, name: value}), OWN)
    ((code, message),) = notes
    flag = "--" + name.replace("_", "-")
    assert code == f"unused.{name}" and message.startswith(f"{flag} ") and "is not used" in message
    assert (
        unused_settings("default", *preset_configs("default", **{**read, name: value}), OWN) == []
    )
    # not given (the preset's value): nothing to say, whatever the run reads
    assert unused_settings("default", *preset_configs("default", **unread), OWN) == []


@pytest.mark.parametrize("preset", list(PRESETS))
def test_every_preset_sets_only_what_its_runs_read(preset):
    assert unused_settings("default", *preset_configs(preset), OWN) == []
    assert unused_settings(preset, *preset_configs(preset), OWN) == []


def test_the_dry_run_and_the_run_say_which_flags_they_do_not_read(
    tmp_path, tiny_model, text_corpus, capsys
):
    out = tmp_path / "run"
    args = run_args(tiny_model("llama"), text_corpus, out) + ["--task-prompts", "8"]
    assert cli.main([*args, "--profile-blocks", "4", "--dry-run"]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert any(n.startswith("note: --task-prompts 8 is not used") for n in notes)
    assert any("--profile-blocks 4 is not used" in n and "add --profile" in n for n in notes)
    assert not out.exists()


@pytest.mark.parametrize(
    ("preset", "settings"),
    [
        ("default", {}),
        ("smoke", {"layer": 3, "k": 4, "epochs": 2, "include_outliers": True}),
        (
            "replicate",
            {"profile": True, "controls": ["all"], "control_widths": [4096, 8192], "out": "x"},
        ),
    ],
)
def test_the_command_a_report_gives_runs_with_the_same_settings(preset, settings):
    import shlex

    from causaldim.cli import _config, _parser

    configs = preset_configs(preset, **settings)
    config = dict(zip(CONFIG_CLASSES, (c.to_dict() for c in configs), strict=True))
    command = command_for(preset, config)
    assert command.startswith("causaldim run") and ("--preset" in command) == (preset != "default")
    args = _parser(dict(PRESETS[preset])).parse_args(shlex.split(command)[1:])
    assert tuple(_config(args, type(c)) for c in configs) == configs
