"""Named sets of settings and where a run's settings come from: the presets, a --config
file, and the checks of each value against its field's type."""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path

from .config import AnalysisConfig, HarvestConfig
from .errors import UsageError
from .model.corpus import is_built_in
from .sweep_config import SweepConfig

# Wall time of `causaldim run` with the default preset on 2 CPU cores, the machine alone,
# the embedded model converted (233 s in benchmarks/busy.py; docs/measured.md, "On a busy
# machine"). The help and the README quote it; the report states each run's own.
DEFAULT_RUN_MINUTES = 6

# Named sets of defaults; flags given on the command line override them.
PRESETS: dict[str, dict] = {
    # The dataclass defaults: SmolLM2-135M layer 15, 5 widths over 16x, in about
    # DEFAULT_RUN_MINUTES on 2 CPU cores.
    "default": {},
    # Every stage on a few thousand tokens: a check that the tool works, in under a minute
    # once the embedded model is converted.
    "smoke": {
        "tokens": 4096,
        "eval_fraction": 0.25,
        "headline_tokens": 3072,  # the headline read on 4,096 eval tokens
        "seq_len": 64,
        "widths": [64, 128, 256, 512, 1024],
        "k": 8,
        "epochs": 1,
        "batch_tokens": 256,
        "blocks": 16,
        "bootstrap": 50,
        "ce_sequences": 4,
        "ladder_sequences": 2,
        "out": "runs/smoke",
    },
    # The paper's regime on the embedded model, on a CPU in about an hour: the reference
    # width 7.1 d (the paper's 16,384 / 2,304), a sweep of x8, the whole built-in corpus
    # (450k tokens) and k = 64, so that the median feature of the widest SAE fires about
    # 1,000+ times in training (tokens x epochs) and 20+ times in eval (--min-firings: at
    # 7.5% eval the widest SAE's median feature fired 18 times, below that floor), in
    # the paper's sequences of 512 tokens.
    "replicate": {
        "tokens": 450_560,
        "seq_len": 512,
        "eval_fraction": 0.1,
        "widths": [4096, 8192, 16384, 32768],
        "k": 64,
        "epochs": 3,
        "ce_sequences": 16,
        "out": "runs/replicate",
    },
    # The paper's setting (Gemma-2-2B layer 12, widths 16,384..1,048,576, seq 512), for a
    # GPU: bf16 compute and store, JumpReLU SAEs as in Gemma Scope; batches fill the GPU;
    # the lean optimiser, without which the widest SAE needs 77 GiB to train.
    "paper": {
        "model": "google/gemma-2-2b",
        "layer": 12,
        "seq_len": 512,
        "tokens": 8_388_608,
        "eval_fraction": 0.0625,
        "dtype": "bfloat16",
        "store_dtype": "bfloat16",
        "shard_tokens": 65_536,
        "widths": [16_384, 32_768, 65_536, 131_072, 262_144, 524_288, 1_048_576],
        "architectures": ["jumprelu"],
        "optimizer": "lean",
        "save_dtype": "float16",
        "k": 64,
        "epochs": 1,
        "batch_tokens": 4096,
        "ce_sequences": 64,
        "blocks": 64,
        "out": "runs/paper",
    },
}


def preset_configs(
    name: str = "default", **overrides
) -> tuple[HarvestConfig, SweepConfig, AnalysisConfig]:
    """The three configs of a run from a preset, with overrides by field name."""
    if name not in PRESETS:
        raise UsageError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    values = {**PRESETS[name], **overrides}
    types_ = field_types()
    for key, value in values.items():
        if key in types_:
            check_value(key, value, types_[key])
    out = []
    for cls in (HarvestConfig, SweepConfig, AnalysisConfig):
        names = {f.name for f in dataclasses.fields(cls)}
        out.append(cls(**{k: v for k, v in values.items() if k in names}))
    known = {f.name for c in out for f in dataclasses.fields(c)}
    unknown = sorted(set(values) - known)
    if unknown:
        hints = [
            f"{k!r}: did you mean {close[0]!r}?"
            for k in unknown
            if (close := difflib.get_close_matches(k, known, n=1))
        ]
        raise UsageError(
            f"unknown setting(s) {', '.join(unknown)}" + (f" ({'; '.join(hints)})" if hints else "")
        )
    return tuple(out)


CONFIG_CLASSES = {"harvest": HarvestConfig, "sweep": SweepConfig, "analysis": AnalysisConfig}


def preset_values(preset: str) -> dict:
    """Every setting's value under a preset: its own, else the field's default."""
    return {
        f.name: PRESETS.get(preset, {}).get(
            f.name,
            f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default,
        )
        for c in CONFIG_CLASSES.values()
        for f in dataclasses.fields(c)
    }


def field_types() -> dict[str, object]:
    """Every setting's name and type, across the three configs."""
    import typing

    return {
        name: kind
        for cls in CONFIG_CLASSES.values()
        for name, kind in typing.get_type_hints(cls).items()
    }


def check_value(name: str, value, kind) -> None:
    """UsageError unless value has the field's type (ints pass for floats; bools are not
    ints; None only where the field allows it)."""
    import types
    import typing

    options = typing.get_args(kind) if isinstance(kind, types.UnionType) else (kind,)
    for option in options:
        if option is type(None) and value is None:
            return
        if typing.get_origin(option) is list:
            (item,) = typing.get_args(option)
            if isinstance(value, list) and all(_is(v, item) for v in value):
                return
        elif option is not type(None) and _is(value, option):
            return
    wanted = " or ".join(getattr(o, "__name__", str(o)) for o in options).replace(
        "NoneType", "null"
    )
    raise UsageError(f"setting {name!r} must be {wanted}, got {value!r}")


def _is(value, kind) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def read_config_file(path: str | Path) -> dict:
    """Settings from a JSON file: field names and values, flat or nested under harvest,
    sweep and analysis (a results.json's "config" block can be saved and passed as is).
    UsageError naming the fix if the file is missing, not JSON, or holds an unknown key or
    a value of the wrong type."""
    import json

    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--config {path} does not exist; pass a JSON file of settings")
    try:
        obj = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"--config {path} is not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise UsageError(f"--config {path} must hold a JSON object of settings")
    flat = {}
    for key, value in obj.items():
        if key in CONFIG_CLASSES:
            if not isinstance(value, dict):
                raise UsageError(f"--config {path}: {key!r} must be an object of settings")
            flat.update(value)
        else:
            flat[key] = value
    types_ = field_types()
    for key, value in flat.items():
        if key not in types_:
            close = difflib.get_close_matches(key, types_, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise UsageError(f"--config {path}: unknown setting {key!r}{hint}")
        check_value(key, value, types_[key])
    return flat


def _training(what: str = ""):
    """A sweep setting that only training reads: unused when the SAEs are imported."""

    def reason(h: HarvestConfig, s: SweepConfig, a: AnalysisConfig, own: set[str]):
        if s.imports:
            flag = "--sae-paths" if s.sae_paths else "--sae-release"
            return f"only training reads it, and with {flag} nothing is trained{what}"
        return None

    return reason


def _with_control(names: tuple[str, ...], what: str):
    """An analysis setting that only some controls read ("own": those whose SAEs follow
    --control-epochs and --control-widths)."""

    def reason(h: HarvestConfig, s: SweepConfig, a: AnalysisConfig, own: set[str]):
        picked = set(a.selected_controls())
        wanted = sorted(own) if names == ("own",) else list(names)
        if picked & set(wanted):
            return None
        return f"it is read only by {what}; add --controls {' or '.join(wanted)} (or all)"

    return reason


# Settings that only some runs read, each with why a run does not: a setting given (its
# value differs from the preset's) to a run that does not read it is said in one line,
# never passed over in silence. The rest are read by every run.
READ_ONLY_WHEN = {
    "text_field": lambda h, s, a, own: (
        f"only .jsonl files and datasets have text fields, and --corpus {h.corpus} is neither"
        if is_built_in(h.corpus) or Path(h.corpus).suffix in (".txt", ".text", ".md")
        else None
    ),
    "max_eval_tokens": lambda h, s, a, own: (
        None if h.until_converged else "only --until-converged reads it; add --until-converged"
    ),
    "headline_tokens": lambda h, s, a, own: (
        None
        if h.logit_probes
        else "only the logits readings read it, and --logit-probes 0 asks for none"
    ),
    "ladder_sequences": lambda h, s, a, own: (
        None
        if h.logit_probes
        else "only the headline (logits) reading's ladder reads it, and --logit-probes 0 asks "
        "for none"
    ),
    "profile_blocks": lambda h, s, a, own: (
        None if a.profile else "only the all-layer profile reads it; add --profile"
    ),
    "control_epochs": _with_control(("own",), "the controls with a sweep of their own"),
    "control_widths": _with_control(("own",), "the controls with a sweep of their own"),
    "ablation_features": _with_control(("ablation",), "the real-ablation control"),
    "ablation_sequences": _with_control(("ablation",), "the real-ablation control"),
    "task_prompts": _with_control(("task",), "the task control"),
    "depth_layers": _with_control(("depth",), "the depth control"),
    "scale_model": _with_control(("scale",), "the scale control"),
    "ray_address": lambda h, s, a, own: (
        None if s.executor == "ray" else "only the Ray executor reads it; add --executor ray"
    ),
    **{
        name: _training()
        for name in (
            "architectures",
            "k",
            "sae_dtype",
            "optimizer",
            "save_dtype",
            "epochs",
            "lr",
            "batch_tokens",
            "dead_tokens",
            "checkpoint_steps",
        )
    },
    "widths": _training(" (the imported SAEs' widths make the sweep)"),
}


def unused_settings(
    preset: str,
    harvest: HarvestConfig,
    sweep: SweepConfig,
    analysis: AnalysisConfig | None,
    control_sweeps: set[str],
) -> list[tuple[str, str]]:
    """(code, message) for each setting given (it differs from the preset's value) that
    this run will not read, and why: "--task-prompts 8 is not used: it is read only by the
    task control; add --controls task (or all)". control_sweeps: the controls whose SAEs
    follow --control-epochs and --control-widths. Without analysis (`causaldim train`),
    only the harvest and sweep settings are checked."""
    defaults = preset_values(preset)
    given = {
        **dataclasses.asdict(harvest),
        **dataclasses.asdict(sweep),
        **(dataclasses.asdict(analysis) if analysis is not None else {}),
    }
    out = []
    for name, reason_of in READ_ONLY_WHEN.items():
        if name not in given or given[name] == defaults[name]:
            continue
        why = reason_of(harvest, sweep, analysis or AnalysisConfig(), control_sweeps)
        if why:
            value = given[name]
            shown = " ".join(map(str, value)) if isinstance(value, list) else value
            flag = "--" + name.replace("_", "-")
            out.append((f"unused.{name}", f"{flag} {shown} is not used: {why}"))
    return out


# Resolved for the machine that ran (device, dtypes, batch): a re-run resolves its own.
_RESOLVED = ("device", "dtype", "sae_dtype", "batch_size")


def command_for(preset: str, config: dict) -> str:
    """The `causaldim run` command that gives a results.json's settings (its "config"
    block): the preset, and every setting whose value differs from the preset's (those
    resolved for the machine that ran left out)."""
    defaults = preset_values(preset)
    flags = ["causaldim run"] + ([] if preset == "default" else [f"--preset {preset}"])
    for part in CONFIG_CLASSES:
        for name, value in config.get(part, {}).items():
            if name in _RESOLVED or name not in defaults or value == defaults[name]:
                continue
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                flags.append(flag if value else f"--no-{flag[2:]}")
            elif isinstance(value, list):
                flags.append(f"{flag} {' '.join(map(str, value))}")
            elif value is not None:
                flags.append(f"{flag} {value}")
    return " ".join(flags)
