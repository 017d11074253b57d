"""Typed run configuration. Each field's ``help`` becomes its command-line help."""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

from .errors import UsageError

COMPUTE_DTYPES = ("float32", "bfloat16")
DTYPE_CHOICES = ("auto", *COMPUTE_DTYPES)
STORE_DTYPES = ("float32", "bfloat16", "float16")
# The controls, in the report's order: each is the module causaldim.controls.NAME.
CONTROLS = (
    "thresholds",
    "architectures",
    "l0",
    "four_cell",
    "geometry",
    "synthetic",
    "task",
    "depth",
    "scale",
    "ablation",
    "nulls",
)
ATP_NORMALISATIONS = ("all", "firing")  # what AtP_i is the mean over: every token, or its firings


_T = TypeVar("_T")


def option(default: _T, help: str, **kw: Any) -> _T:
    """A config field whose help becomes its command-line help (a list default: a fresh
    copy per config)."""
    if isinstance(default, list):
        # typed as the default, as dataclasses.field is, so the field's annotation is checked
        return cast(_T, field(default_factory=lambda: list(default), metadata={"help": help, **kw}))
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class HarvestConfig:
    """What to run the model on, and where the activation-and-gradient store goes."""

    model: str = option(
        "smollm2-135m",
        "Model: 'smollm2-135m' or 'gemma3-270m' (embedded, offline), a Hugging Face hub "
        "name, a local model folder, or a .gguf file.",
    )
    layer: int | None = option(
        None, "Layer L whose output residual stream is measured (0-based); default: the middle."
    )
    layers_path: str | None = option(
        None,
        "Dotted path of the model's list of blocks (e.g. 'model.layers'); only needed "
        "for model families causaldim does not know.",
    )
    corpus: str = option(
        "builtin",
        "Text to run on: 'builtin' (docstrings of this Python's standard library), a .txt "
        "file or folder of .txt files, a .jsonl file, a local HF dataset folder, or a "
        "Hugging Face hub dataset by name (e.g. 'NeelNanda/pile-10k'; streamed, only the "
        "documents --tokens needs are read, and cached).",
    )
    corpus_config: str | None = option(
        None, "Config (subset) of a hub --corpus, e.g. 'sample-10BT'; default: its default."
    )
    corpus_split: str = option("train", "Split of a hub --corpus to read.")
    corpus_revision: str | None = option(
        None,
        "Branch, tag or commit sha of a hub --corpus; default: its latest commit (the sha "
        "read is recorded). A cached copy of a pinned revision is used without the network.",
    )
    text_field: str = option(
        "text", "Field holding the text in .jsonl files and HF datasets (local or hub)."
    )
    # 65,536 train and 16,384 eval tokens: on the embedded model the direct readings needed
    # about 11,500-14,500 eval tokens to reach 4 independent equivalents a dimension (the
    # rule before it took 8: twice that now, which --until-converged harvests), and the
    # train split is what it was.
    tokens: int = option(
        81_920, "Tokens to harvest in all (train + eval); fewer if the corpus is smaller."
    )
    eval_fraction: float = option(
        0.2,
        "Fraction of sequences in the eval split (h, gradients, probes; the costly part); "
        "the rest train SAEs.",
    )
    headline_tokens: int = option(
        12_288,
        "Eval tokens beyond --tokens on which only the headline is measured: the centred "
        "logits reading, by a pass that skips the output head (about 2x (SmolLM2) to 6x "
        "(Gemma 3) cheaper a token than the eval split's). The loss, literal and Fisher "
        "readings, AtP scores and CE loss recovered read the eval split alone. 0: none.",
    )
    seq_len: int = option(128, "Tokens per sequence.")
    batch_size: int | None = option(
        None,
        "Sequences per model batch; default: on a GPU as many as fit in its free memory, "
        "on the CPU 8 (--dry-run prints the choice and the memory estimate).",
    )
    logit_probes: int = option(
        1,
        "Gaussian probes per eval position for Sigma_logits (each costs one backward from "
        "the logits down to L; 0: none).",
    )
    fisher_probes: int = option(
        1, "Probes per eval position for Sigma_fisher, y drawn from the model (0: none)."
    )
    device: str = option(
        "auto",
        "Where the model pass, SAE training, scoring and splicing run: 'auto' (the first "
        "CUDA GPU if there is one, else the CPU), 'cpu', 'cuda' or 'cuda:N'.",
    )
    dtype: str = option(
        "auto",
        "Model compute dtype; 'auto': bfloat16 on GPUs fast at it (compute capability 8.0 "
        "on), float32 elsewhere.",
        choices=DTYPE_CHOICES,
    )
    store_dtype: str = option(
        "float32",
        "Dtype of h and g on disk (float16 stores a recorded per-shard scale).",
        choices=STORE_DTYPES,
    )
    outlier_factor: float = option(
        10.0,
        "Tokens whose residual norm exceeds this multiple of the median norm (and every "
        "position 0) are flagged as outliers and left out downstream.",
    )
    shard_tokens: int = option(16_384, "Tokens per store shard (bounds memory while writing).")
    until_converged: bool = option(
        False,
        "Harvest further eval sequences in rounds (from the corpus beyond --tokens, each "
        "round reusing the ones before) until the headline direct kappa converges, its "
        "interval is as narrow as --target-width asks, or --max-eval-tokens is reached.",
    )
    max_eval_tokens: int = option(
        262_144, "With --until-converged: the most eval tokens, all rounds together."
    )
    target_width: float | None = option(
        None,
        "With --until-converged: also go on until the headline's 95% interval's half-width "
        "is at most this share of its value (e.g. 0.02); default: converged is enough.",
    )
    seed: int = option(0, "Seed for the split, data order and everything random.")
    out: str = option("runs/default", "Output folder of the run; the store lives under it.")
    repair: bool = option(
        False,
        "Recompute damaged artifacts (store shards, SAEs, checkpoints) instead of stopping "
        "with an error that names them.",
    )
    trust_remote_code: bool = option(
        False, "Allow a hub model's own Python code to run (only for models that need it)."
    )

    def check(self) -> None:
        """Checks that need no model, corpus or disk access beyond stat calls."""
        check_finite(self)
        positive = ("tokens", "seq_len", "batch_size", "shard_tokens", "max_eval_tokens")
        for name in positive:
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise UsageError(f"--{flag_of(name)} must be positive, got {getattr(self, name)}")
        if self.seq_len < 2:
            raise UsageError("--seq-len must be at least 2 (a next token is needed for the loss)")
        for name in ("logit_probes", "fisher_probes", "headline_tokens"):
            if getattr(self, name) < 0:
                raise UsageError(f"--{flag_of(name)} must be >= 0, got {getattr(self, name)}")
        if self.layer is not None and self.layer < 0:
            raise UsageError(f"--layer must be >= 0, got {self.layer}")
        if not 0.0 < self.eval_fraction < 1.0:
            raise UsageError(f"--eval-fraction must lie in (0, 1), got {self.eval_fraction}")
        # two eval sequences (a jackknife over one has nothing to resample) and a train one
        least = max(
            math.ceil(2 * self.seq_len / self.eval_fraction),
            math.ceil(self.seq_len / (1 - self.eval_fraction)),
        )
        if self.tokens < least:
            raise UsageError(
                f"--tokens {self.tokens:,} holds fewer than two eval sequences of "
                f"{self.seq_len} tokens at --eval-fraction {self.eval_fraction:g}; pass "
                f"--tokens {least:,} or more"
            )
        near_name(self.model, self.corpus)
        if self.outlier_factor <= 1.0:
            raise UsageError(f"--outlier-factor must exceed 1, got {self.outlier_factor}")
        if self.target_width is not None and not 0.0 < self.target_width < 1.0:
            raise UsageError(f"--target-width must lie in (0, 1), got {self.target_width}")
        if self.target_width is not None and not self.until_converged:
            raise UsageError("--target-width needs --until-converged")
        if self.until_converged and not self.logit_probes:
            raise UsageError(
                "--until-converged follows the headline (logits) reading: give --logit-probes 1"
            )
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            if choices and getattr(self, f.name) not in choices:
                raise UsageError(
                    f"--{flag_of(f.name)} must be one of {', '.join(choices)}, "
                    f"got {getattr(self, f.name)!r}"
                )
        out = Path(self.out)
        if out.exists() and not out.is_dir():
            raise UsageError(f"--out {out} is a file; name a folder")
        parent = next((p for p in [out, *out.parents] if p.exists()), Path("."))
        if not os.access(parent, os.W_OK):
            raise UsageError(f"--out {out}: {parent} is not writable; choose another folder")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class AnalysisConfig:
    """How the measurements are summarised: the direct Sigma estimates, the calibration of
    AtP scores and the kappa_hat fits, and their intervals."""

    blocks: int = option(
        32,
        "Sequence blocks: the units of Sigma's jackknife and convergence curve and of the "
        "SAE-side bootstraps.",
    )
    bootstrap: int = option(
        200, "Bootstrap resamples of sequence blocks for the SAE-side numbers (0: none)."
    )
    percentile: float = option(
        98.0, "epsilon = this percentile of AtP over the reference width's features."
    )
    reference_width: int | None = option(
        None, "Width whose AtP scores calibrate epsilon; default: the smallest of the sweep."
    )
    atp_normalisation: str = option(
        "all",
        "AtP_i as the mean of |f_i (g . d_i)| over all eval tokens ('all', the paper's "
        "formula as written) or over the tokens where feature i fires ('firing'); the "
        "report shows the other beside it.",
        choices=ATP_NORMALISATIONS,
    )
    min_firings: int = option(
        20,
        "Under the firing-token AtP reading, features that fire on fewer eval tokens than "
        "this are too rare to score: counted apart, never causal (one or two firings would "
        "score a feature by its largest single effect).",
    )
    include_outliers: bool = option(False, "Keep outlier tokens (position 0, huge norms) in.")
    min_samples_per_dim: float = option(
        10.0, "Warn when rank-1 samples are fewer than this many times d."
    )
    converged_change: float = option(
        0.05, "Warn when erank still moves by more than this fraction over the last doubling."
    )
    read_tokens: int = option(4096, "Tokens read from the store at a time (bounds memory).")
    profile: bool = option(
        False,
        "Also measure Sigma at every layer in the eval pass (its backward runs on down to "
        "block 0): corrected erank and unbiased PR of each reading against depth.",
    )
    ladder_sequences: int = option(
        4,
        "Held-out sequences (the train split's first, apart from the eval split the "
        "rankings are fitted on) on which the directions that matter are checked by "
        "intervention: keep the top k directions of each ranking, mean-ablate the rest, "
        "measure KL(clean || edited). 0: not checked.",
    )
    profile_blocks: int = option(
        16,
        "Sequence blocks of the profile's estimates (each layer and reading keeps a d x d "
        "sum per block: memory grows with it).",
    )
    controls: list[str] = option(
        [],
        "Controls to run beside the headline: 'all', or any of "
        + ", ".join(CONTROLS)
        + " ('architectures' adds JumpReLU and ReLU to the sweep).",
        choices=("all", *CONTROLS),
    )
    control_epochs: int | None = option(
        None,
        "Epochs of the SAEs the depth, scale and architectures controls train of their own "
        "(default: --epochs): a lighter sweep for them, which their sections state. With "
        "this or --control-widths, the architectures control trains its three sweeps apart "
        "instead of widening the headline's.",
    )
    control_widths: list[int] = option(
        [],
        "Widths of those controls' own sweeps (default: --widths).",
    )
    ablation_features: int = option(16, "Features per width really ablated (control 'ablation').")
    ablation_sequences: int = option(16, "Eval sequences they are ablated on (control 'ablation').")
    task_prompts: int = option(64, "Generated subject-verb agreement prompts (control 'task').")
    depth_layers: list[int] = option(
        [],
        "Layers measured beside --layer, in the same model pass (control 'depth'); "
        "default: 1, n/4, n/2, 3n/4 and n-2 of the model's n blocks.",
    )
    scale_model: str | None = option(
        None,
        "A second model of the same family for control 'scale' (hub name, folder or "
        ".gguf), measured at the same relative depth and with the same sweep.",
    )

    @property
    def lighter_controls(self) -> bool:
        """Whether the controls that train SAEs of their own use a sweep of their own."""
        return self.control_epochs is not None or bool(self.control_widths)

    def selected_controls(self) -> list[str]:
        return list(CONTROLS) if "all" in self.controls else list(dict.fromkeys(self.controls))

    def check(self) -> None:
        check_finite(self)
        bad = [c for c in self.controls if c not in ("all", *CONTROLS)]
        if bad:
            raise UsageError(
                f"--controls: unknown {', '.join(bad)}; choose 'all' or among {', '.join(CONTROLS)}"
            )
        if min(self.ablation_features, self.ablation_sequences, self.task_prompts) < 1:
            raise UsageError(
                "--ablation-features, --ablation-sequences and --task-prompts must be >= 1"
            )
        if self.control_epochs is not None and self.control_epochs < 1:
            raise UsageError(f"--control-epochs must be >= 1, got {self.control_epochs}")
        if any(w < 1 for w in self.control_widths) or len(set(self.control_widths)) != len(
            self.control_widths
        ):
            raise UsageError(
                f"--control-widths must be distinct positive widths, got {self.control_widths}"
            )
        if any(i < 0 for i in self.depth_layers):
            raise UsageError(f"--depth-layers must be >= 0, got {self.depth_layers}")
        if self.atp_normalisation not in ATP_NORMALISATIONS:
            raise UsageError(
                f"--atp-normalisation must be one of {', '.join(ATP_NORMALISATIONS)}, got "
                f"{self.atp_normalisation!r}"
            )
        if self.blocks < 2:
            raise UsageError(f"--blocks must be at least 2, got {self.blocks}")
        if self.min_firings < 1:
            raise UsageError(f"--min-firings must be at least 1, got {self.min_firings}")
        if self.bootstrap < 0:
            raise UsageError(f"--bootstrap must be >= 0, got {self.bootstrap}")
        if self.ladder_sequences < 0:
            raise UsageError(f"--ladder-sequences must be >= 0, got {self.ladder_sequences}")
        if self.profile_blocks < 2:
            raise UsageError(f"--profile-blocks must be at least 2, got {self.profile_blocks}")
        if self.read_tokens <= 0:
            raise UsageError(f"--read-tokens must be positive, got {self.read_tokens}")
        if not 0.0 < self.percentile < 100.0:
            raise UsageError(f"--percentile must lie in (0, 100), got {self.percentile}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def flag_of(name: str) -> str:
    return name.replace("_", "-")


def near_name(model: str, corpus: str) -> None:
    """A model or corpus name one slip from an embedded model or a built-in corpus is
    refused with the name meant, before anything goes to the hub."""
    from .model.corpus import BUILT_IN
    from .model.load import EMBEDDED
    from .model.nulls import split_null

    def near(name: str, known) -> str | None:
        if not name or "/" in name or name in known or Path(name).expanduser().exists():
            return None
        found = difflib.get_close_matches(name, list(known), n=1, cutoff=0.8)
        return found[0] if found else None

    base = split_null(model)[0]
    if meant := near(base, EMBEDDED):
        raise UsageError(
            f"--model {model!r} is not embedded; did you mean {meant!r}? (embedded: "
            f"{', '.join(EMBEDDED)}; a hub model is named owner/name)"
        )
    for part in corpus.split("+"):
        if meant := near(part, BUILT_IN):
            raise UsageError(
                f"--corpus {corpus!r}: {part!r} is not built in; did you mean {meant!r}? "
                f"(built in: {', '.join(BUILT_IN)}; a hub dataset is named owner/name)"
            )


def check_finite(cfg) -> None:
    """One rule for every float setting: NaN and infinity are refused by name (a range
    check alone lets NaN through, since every comparison with it is false)."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        values = value if isinstance(value, (list, tuple)) else [value]
        bad = [v for v in values if isinstance(v, float) and not math.isfinite(v)]
        if bad:
            raise UsageError(f"--{flag_of(f.name)} must be a finite number, got {bad[0]}")
