"""The disk a run needs at most: its stores, the SAEs in their saved precision (or as few
as --drop-weights holds at once), their scores and digests, and the training checkpoint."""

from __future__ import annotations

from .config import AnalysisConfig
from .harvest import Plan
from .harvest.plan import extension_sequences
from .harvest.store import n_blocks
from .measures.score import VV_GROUPS
from .memory import element_bytes
from .sae.optim import moment_bytes
from .sweep_config import SweepConfig

STORE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
EXTRA_BYTES_PER_TOKEN = 4 + 4 + 4 + 1  # token, pos, seq, outlier


def checkpoint_bytes(d: int, width: int, optimizer: str) -> int:
    """One SAE's training checkpoint: its weights and the optimiser's moments."""
    _, moments = moment_bytes(optimizer)
    return ((4 + moments) * 2 * d + 3 * 4 * 3) * width


def saved_sae_bytes(d: int, width: int, save_dtype: str) -> int:
    """An SAE folder's weights: W_enc and W_dec in save_dtype, biases and thresholds in
    float32 (sae/formats.py)."""
    return (2 * d * element_bytes(save_dtype) + 3 * 4) * width


def scores_bytes(d: int, width: int, blocks: int) -> int:
    """One SAE's scores file: AtP sums and firing counts per block in float64, and the
    v v^T sums of at most VV_GROUPS groups (measures/score.py)."""
    return (16 * width + 16) * blocks + 8 * min(blocks, VV_GROUPS) * d * d


def digest_bytes(width: int) -> int:
    """One decoder's digest, at most: share, nearest feature and its cosine per feature,
    and the reference's best cosines, no more than a width's (measures/digest.py)."""
    return 20 * width


def sweep_disk(d: int, sweep: SweepConfig, blocks: int, reference: int | None = None) -> dict:
    """The SAEs' bytes on disk at most, kept or dropped (--drop-weights: every
    architecture's reference, beside one width's trainings at a time), and their scores
    and digests (kept either way)."""
    reference = reference or sweep.widths[0]
    n_arch, seeds = len(sweep.architectures), sweep.sae_seeds
    saved = {m: saved_sae_bytes(d, m, sweep.save_dtype) for m in sweep.widths}
    dropped = max(
        n_arch * seeds * saved[m] + (n_arch * saved[reference] if m != reference else 0)
        for m in sweep.widths
    )
    scores = n_arch * sum(
        seeds * scores_bytes(d, m, blocks) + digest_bytes(m) for m in sweep.widths
    )
    return {"kept": n_arch * seeds * sum(saved.values()), "dropped": dropped, "scores": scores}


def disk_bytes(
    the_plan: Plan, sweep: SweepConfig | None, analysis: AnalysisConfig | None = None
) -> dict[str, int]:
    """Bytes the run writes at most: every planned layer's store (and its --headline-tokens
    extension), the sweep's SAEs (if
    any) in their saved precision (all of them, or with --drop-weights as many as are
    held at once, and `saes_other`: the figure the other way), their scores, and the
    training checkpoint of the widest while it trains: its float32 weights and moments,
    twice at a save (the new one is whole before the last is removed; --checkpoint-steps
    0 writes none)."""
    cfg = the_plan.config
    d, seq = the_plan.source.d_model, cfg.seq_len
    n_train, n_eval = len(the_plan.splits.train) * seq, len(the_plan.splits.eval) * seq
    n_head = extension_sequences(the_plan) * seq
    probes = 2 * cfg.logit_probes + cfg.fisher_probes  # a Gaussian probe stores two parts
    element = STORE_BYTES[cfg.store_dtype]
    store = n_train * (d * element + EXTRA_BYTES_PER_TOKEN) + n_eval * (
        d * element * (2 + probes) + EXTRA_BYTES_PER_TOKEN
    )
    # the --headline-tokens store: h and the centred probes' products
    store += n_head * (d * element * (1 + cfg.logit_probes) + EXTRA_BYTES_PER_TOKEN)
    store *= len(the_plan.store_dirs)
    if sweep is None:
        return {
            "store": store,
            "saes": 0,
            "saes_other": 0,
            "scores": 0,
            "checkpoint": 0,
            "total": store,
        }
    analysis = analysis or AnalysisConfig()
    blocks = n_blocks(len(the_plan.splits.eval), analysis.blocks)
    found = sweep_disk(d, sweep, blocks, analysis.reference_width)
    saes, other = found["kept"], found["dropped"]
    if sweep.drop_weights:
        saes, other = other, saes
    checkpoint = 0
    if sweep.checkpoint_steps and not sweep.imports:
        checkpoint = 2 * checkpoint_bytes(d, max(sweep.widths), sweep.optimizer)
    return {
        "store": store,
        "saes": saes,
        "saes_other": other,
        "scores": found["scores"],
        "checkpoint": checkpoint,
        "total": store + saes + found["scores"] + checkpoint,
    }
