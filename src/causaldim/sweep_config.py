"""The SAE width sweep's configuration: which SAEs, how they are trained and kept."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from .config import DTYPE_CHOICES, check_finite, flag_of, option
from .errors import UsageError
from .executors import EXECUTORS
from .sae import ARCHITECTURES
from .sae.formats import SAVE_DTYPES
from .sae.optim import OPTIMIZERS


@dataclass
class SweepConfig:
    """The SAE width sweep: which SAEs, and how they are trained."""

    widths: list[int] = option(
        [256, 512, 1024, 2048, 4096],
        "SAE widths, increasing (the smallest is the reference width).",
    )
    architectures: list[str] = option(
        ["topk"],
        "Architectures to train: topk, jumprelu, relu.",
        choices=tuple(ARCHITECTURES),
    )
    k: int = option(32, "TopK's k, and the target L0 of JumpReLU and ReLU (matched L0).")
    sae_dtype: str = option(
        "auto",
        "Dtype of the dense encoder product in training (weights and optimiser stay "
        "float32); 'auto': bfloat16 on GPUs fast at it, float32 elsewhere.",
        choices=DTYPE_CHOICES,
    )
    optimizer: str = option(
        "adam",
        "SAE optimiser: 'adam' (torch's Adam: float32 weights, gradients and both moments, "
        "16 bytes a weight) or 'lean' (the same update from sparse row gradients, first "
        "moments in bfloat16: 10 bytes a weight), for widths past the device's memory.",
        choices=OPTIMIZERS,
    )
    save_dtype: str = option(
        "float32",
        "Precision of the saved SAE weights' matrices: 'float16' or 'bfloat16' halve the "
        "SAEs' disk (float16 keeps 3 more bits). The weights are rounded to it before the "
        "SAE is evaluated, so FVE, L0, scores and every later stage read what is on disk "
        "(docs/measured.md: what it changes).",
        choices=SAVE_DTYPES,
    )
    drop_weights: bool = option(
        False,
        "Train, score and digest the widths one at a time, narrowest first, and delete "
        "each SAE's weights once scored (the reference width's are kept: the wider ones "
        "are compared with it), so that the SAEs' disk is about the reference and the "
        "widest, not all of them; the scores and digests are kept, and a re-run reuses "
        "them. Not with the controls that read the weights (geometry, ablation, task, "
        "four_cell).",
    )
    epochs: int = option(3, "Passes over the train split per SAE.")
    lr: float = option(1e-3, "Adam learning rate (falls linearly to 0 over the last 20%).")
    batch_tokens: int = option(1024, "Tokens per training step.")
    dead_tokens: int | None = option(
        None,
        "A feature silent for this many training tokens counts as dead (AuxK revives it); "
        "default: a tenth of the tokens each SAE trains on (tokens x epochs).",
    )
    sae_seeds: int = option(
        1,
        "Trainings per width, with seeds seed, seed + 1, ...: the first gives the point "
        "estimates; with more, every resample of the intervals draws one training per "
        "width, so they carry the training's variance.",
    )
    checkpoint_steps: int = option(
        100,
        "Save each SAE's training state every this many steps, so that a killed sweep "
        "resumes mid-SAE (0: never).",
    )
    sae_paths: list[str] = option(
        [],
        "SAEs trained elsewhere, used instead of training: Gemma Scope "
        "params.npz files, SAELens or sparsify folders (their widths make the sweep).",
    )
    sae_release: str | None = option(
        None,
        "Pretrained SAEs by name, used instead of training: a release as SAELens names it "
        "(gemma-scope-2b-pt-res, gemma-scope-9b-pt-res, gpt2-small-res-jb, "
        "EleutherAI/sae-llama-3-8b-32x, ...) or any hub repo 'owner/name'; the SAEs are "
        "named by --sae-ids and fetched into the Hugging Face cache.",
    )
    sae_ids: list[str] = option(
        [],
        "The SAEs of --sae-release, as their folders in its repo (e.g. "
        "layer_12/width_16k/average_l0_82 layer_12/width_65k/average_l0_72; "
        "blocks.7.hook_resid_pre; layers.12): their widths make the sweep.",
    )
    executor: str = option(
        "local",
        "Where the SAE and scoring jobs run: 'local' (this process) or 'ray' (Ray tasks, "
        "one CPU each, or one GPU each where there are GPUs; pip install 'causaldim[ray]').",
        choices=EXECUTORS,
    )
    ray_address: str | None = option(
        None, "Ray cluster to join (e.g. 'auto'); default: start a local one."
    )
    ce_sequences: int = option(
        8,
        "Eval sequences on which each SAE is spliced into the model (CE loss recovered); 0: skip.",
    )

    @property
    def imports(self) -> bool:
        """Whether the sweep's SAEs are imported (--sae-paths or --sae-release), not trained."""
        return bool(self.sae_paths or self.sae_release)

    def check(self) -> None:
        check_finite(self)
        missing = [p for p in self.sae_paths if not Path(p).exists()]
        if missing:
            raise UsageError(f"--sae-paths: {missing[0]} does not exist")
        if self.sae_release and self.sae_paths:
            raise UsageError(
                "--sae-release and --sae-paths both name the sweep's SAEs; pass one of them"
            )
        if self.sae_ids and not self.sae_release:
            raise UsageError(
                "--sae-ids names SAEs of a release; pass the release with --sae-release "
                "(e.g. --sae-release gemma-scope-2b-pt-res)"
            )
        if self.sae_release and not self.sae_ids:
            raise UsageError(
                f"--sae-release {self.sae_release}: name its SAEs with --sae-ids (e.g. "
                "--sae-ids layer_12/width_16k/average_l0_82 for gemma-scope-2b-pt-res)"
            )
        if not self.widths or any(w <= 0 for w in self.widths):
            raise UsageError("--widths must be positive integers")
        if sorted(set(self.widths)) != list(self.widths):
            raise UsageError(f"--widths must be strictly increasing, got {self.widths}")
        bad = [a for a in self.architectures if a not in ARCHITECTURES]
        if bad or not self.architectures:
            raise UsageError(f"--architectures must be among {', '.join(ARCHITECTURES)}")
        if self.k <= 0 or self.k > self.widths[0]:
            raise UsageError(f"--k must lie in 1..{self.widths[0]} (the smallest width)")
        if self.sae_seeds < 1:
            raise UsageError(f"--sae-seeds must be at least 1, got {self.sae_seeds}")
        if self.sae_seeds > 1 and self.imports:
            flag = "--sae-paths" if self.sae_paths else "--sae-release"
            raise UsageError(f"--sae-seeds trains replicates; with {flag} nothing is trained")
        if self.drop_weights and self.imports:
            raise UsageError(
                "--drop-weights drops the SAEs a sweep trains; imported SAEs are not "
                "trained here: leave it out"
            )
        if self.ce_sequences < 0:
            raise UsageError("--ce-sequences must be >= 0")
        if self.checkpoint_steps < 0:
            raise UsageError("--checkpoint-steps must be >= 0")
        if self.executor not in EXECUTORS:
            raise UsageError(
                f"--executor must be one of {', '.join(EXECUTORS)}, got {self.executor!r}"
            )
        for name in ("epochs", "batch_tokens", "dead_tokens"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise UsageError(f"--{flag_of(name)} must be positive")
        if self.lr <= 0:
            raise UsageError("--lr must be positive")
        if self.sae_dtype not in DTYPE_CHOICES:
            raise UsageError(f"--sae-dtype must be one of {', '.join(DTYPE_CHOICES)}")
        if self.optimizer not in OPTIMIZERS:
            raise UsageError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}")

    def check_reference(self, reference_width: int | None) -> None:
        """--reference-width among the widths (imported SAEs' widths are known once read)."""
        if self.imports or reference_width is None or reference_width in self.widths:
            return
        raise UsageError(
            f"--reference-width {reference_width} is not among --widths "
            f"{' '.join(map(str, self.widths))}; pass one of them"
        )

    def dead_tokens_for(self, trained_tokens: int) -> int:
        """--dead-tokens, or its default for SAEs that train on this many tokens."""
        return self.dead_tokens or max(1, trained_tokens // 10)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
