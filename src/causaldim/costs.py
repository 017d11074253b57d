"""What a run will cost, before it starts: the disk it needs and a time estimate from a
count of matmul FLOPs per stage divided by this machine's measured matmul speed.

The estimate ignores attention's own FLOPs and data movement. On the 2-core CPU it was
written on (large fp32 matmuls at 100-120 GFLOP/s), the default run's stages ran at 40-80%
of that peak (the stopped forward fastest, the Sigma eigendecompositions slowest): 60% is
assumed.
"""

from __future__ import annotations

import time

import torch

from .config import AnalysisConfig, SweepConfig
from .devices import describe, planned
from .harvest import Plan
from .measures import debias, profile
from .memory import dense_batch_tokens, sae_training_bytes
from .model.load import decoder_layers, skeleton

EFFICIENCY = 0.6
CORRECTION_STEPS = 10  # the deconvolution settles in about this many steps (measured)
PLUG_IN_EIGS = 8  # per reading: the estimate, its split halves and its convergence curve
# FLOPs of one d x d eigendecomposition, in units of d^3 at the matmul speed: 12.7 ms
# (float32) and 21 ms (float64) at d = 576 on one core of the 2-core CPU, run side by side
# on every core (threads.parallel_map), give 3.5-6; the sigma stage of the smoke and
# default runs (14 s and 17 s, benchmarks/busy.py) took about 8.5 with the deconvolution's
# real step counts and the Python between the steps.
EIG_D3 = 8.5
TASK_PROMPT_TOKENS = 12  # a generated agreement prompt, about (controls/task.py)
TASK_FEATURES = 96  # at most this many features really ablated (controls/task.py)
# The share of the prompts an evaluated feature fires on (it is ablated only there):
# about a quarter in the smoke run's task control (measured 31 s with the whole forward).
TASK_FIRING_SHARE = 0.25
# Seconds that are not matmuls, measured on the 2-core CPU: Python, the imports and the
# plan before the first stage; the report and its figures; one step of the synthetic
# control's toy SAEs (thousands of small steps, each dominated by its overhead).
START_SECONDS = 6.0
LOAD_BYTES_PER_SECOND = 400e6  # reading the model's weights
REPORT_SECONDS = 2.0
REPORT_SECONDS_PER_CONTROL = 0.3
SYNTHETIC_STEP_SECONDS = 0.003
STORE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
EXTRA_BYTES_PER_TOKEN = 4 + 4 + 4 + 1  # token, pos, seq, outlier


def matmul_flops_per_second(
    dtype: str = "float32", device: str = "cpu", size: int = 2048, reps: int = 5
) -> float:
    """The speed of a large square matmul on device: the machine's peak (a planned GPU's
    stated speed, devices.PROFILES)."""
    dt, device = getattr(torch, dtype), torch.device(device)
    if device.type == "cuda" and (profile := planned()) is not None:
        return profile.matmul_flops[dtype]
    a = torch.randn(size, size, dtype=dt, device=device)
    b = torch.randn(size, size, dtype=dt, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    a @ b  # warm-up
    sync()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - t)
    return 2 * size**3 / best


def parameter_counts(the_plan: Plan) -> dict[str, int]:
    """Weights in the blocks up to and including L, above L, and in the output head."""
    model = skeleton(the_plan.source)
    blocks = [
        sum(p.numel() for p in b.parameters()) for b in decoder_layers(model, the_plan.layers_path)
    ]
    head = model.get_output_embeddings()
    return {
        "through_layer": sum(blocks[: the_plan.layer + 1]),
        "above_layer": sum(blocks[the_plan.layer + 1 :]),
        "head": head.weight.numel() if head is not None else 0,
        "per_block": blocks,
    }


def disk_bytes(the_plan: Plan, sweep: SweepConfig | None) -> dict[str, int]:
    """Bytes the run writes: every planned layer's store, and the SAEs of the sweep, if
    any (checkpoints hold about twice an SAE's weights, one SAE at a time)."""
    cfg = the_plan.config
    d, seq = the_plan.source.d_model, cfg.seq_len
    n_train, n_eval = len(the_plan.splits.train) * seq, len(the_plan.splits.eval) * seq
    probes = 2 * cfg.logit_probes + cfg.fisher_probes  # a Gaussian probe stores two parts
    element = STORE_BYTES[cfg.store_dtype]
    store = n_train * (d * element + EXTRA_BYTES_PER_TOKEN) + n_eval * (
        d * element * (2 + probes) + EXTRA_BYTES_PER_TOKEN
    )
    store *= len(the_plan.store_dirs)
    if sweep is None:
        return {"store": store, "saes": 0, "total": store}
    width_sum = sum(sweep.widths) * len(sweep.architectures)
    sae = 4 * (2 * d + 3) * width_sum  # W_enc, W_dec, biases and thresholds, float32
    sae += 3 * 4 * (2 * d + 3) * max(sweep.widths)  # the largest one's checkpoint
    return {"store": store, "saes": sae, "total": store + sae}


def correction_flops(n_eval: int, d: int, readings: int, b: debias.Budget = debias.FULL) -> float:
    """The finite-sample correction (measures/debias.py) of each direct reading: its
    eigendecompositions (the point, about CORRECTION_STEPS deconvolution steps of b.draws
    each; the half-blocks estimate and each jackknife replicate, a few steps from it) and
    its simulated sampling of n_eval weighted Gaussian samples per draw."""
    eigs = b.draws * (CORRECTION_STEPS + b.half_iterations)
    eigs += b.groups * (1 + b.replicate_draws * b.replicate_iterations)
    sims = b.draws
    return readings * (eigs * EIG_D3 * d**3 + sims * 2 * n_eval * d * d)


def analysis_flops(d: int, n_widths: int) -> float:
    """kappa_SAE of each width: its point and each resample, a d x d eigendecomposition."""
    from .measures.attributed import RESAMPLES

    return n_widths * (1 + RESAMPLES) * EIG_D3 * d**3


def control_flops(
    the_plan: Plan, sweep: SweepConfig, analysis: AnalysisConfig, layer_flops: dict
) -> dict[str, float]:
    """The controls that cost more than a few seconds: the real ablations (a forward of
    the blocks above L and the head per feature over the sequences it is ablated on), the
    task control's clean passes and ablations on short prompts, and the depth control's
    other layers (each measured as the run's layer is: `layer_flops`). The synthetic
    control is counted in steps (synthetic_steps)."""

    cfg, params = the_plan.config, parameter_counts(the_plan)
    # Both start from block L's cached clean output: only the blocks above it and the head
    # run for each ablation (the task control's head, for one position only).
    above = 2 * (params["above_layer"] + params["head"])
    model = 2 * (params["through_layer"] + params["above_layer"] + params["head"])
    picked = set(analysis.selected_controls())
    out = {}
    if "ablation" in picked:
        features = 1 + analysis.ablation_features * len(sweep.widths)
        out["control.ablation"] = above * features * analysis.ablation_sequences * cfg.seq_len
    if "task" in picked:
        tokens = analysis.task_prompts * TASK_PROMPT_TOKENS
        out["control.task"] = 3 * model * tokens + 2 * params["above_layer"] * tokens * (
            TASK_FEATURES * TASK_FIRING_SHARE
        )
    # the controls' own sweeps (depth, architectures): one architecture each, at
    # --control-widths and --control-epochs where given
    n_arch = len(sweep.architectures)
    widths = analysis.control_widths or sweep.widths
    lighter = (sum(widths) * (analysis.control_epochs or sweep.epochs)) / (
        sum(sweep.widths) * sweep.epochs
    )
    one_sweep = (
        lighter * layer_flops["sweep"]
        + len(widths) / len(sweep.widths) * (layer_flops["scores"] + layer_flops["analysis"])
    ) / n_arch
    if "depth" in picked:
        # with a lighter sweep of its own it measures the headline layer again too
        layers = len(the_plan.store_dirs) - (0 if analysis.lighter_controls else 1)
        out["control.depth"] = layers * (layer_flops["sigma"] + one_sweep)
    if "architectures" in picked and analysis.lighter_controls:
        out["control.architectures"] = 3 * one_sweep
    return out


def synthetic_steps(sweep: SweepConfig) -> int:
    """The synthetic control's toy SAE steps: its cost on a CPU is their overhead."""
    from .controls.synthetic import SyntheticSpec, synthetic_sweep

    spec = SyntheticSpec()
    toy = synthetic_sweep(sweep, spec.d)
    steps_per_width = -(-spec.train_tokens * toy.epochs // toy.batch_tokens)
    return steps_per_width * len(toy.widths)


def estimate(
    the_plan: Plan,
    sweep: SweepConfig,
    analysis: AnalysisConfig,
    flops_per_second: float | None = None,
) -> dict:
    cfg = the_plan.config
    d, seq = the_plan.source.d_model, cfg.seq_len
    n_train, n_eval = len(the_plan.splits.train) * seq, len(the_plan.splits.eval) * seq
    params = parameter_counts(the_plan)
    up, above = params["through_layer"], params["above_layer"] + params["head"]
    # with other layers tapped (control 'depth'), the train pass runs up to the highest and
    # the eval pass's backwards down to the lowest
    lowest, highest = min(the_plan.store_dirs), max(the_plan.store_dirs)
    up_train = sum(params["per_block"][: highest + 1])
    probes = 2 * cfg.logit_probes + cfg.fisher_probes  # backwards: two per Gaussian probe
    n_saes = len(sweep.widths) * len(sweep.architectures)
    width_sum = sum(sweep.widths) * len(sweep.architectures)
    # loss, logits and logits_uncentred, fisher
    direct = 1 + 2 * min(cfg.logit_probes, 1) + min(cfg.fisher_probes, 1)
    # the eval pass: a full forward, then one backward from the loss and one per probe,
    # down to L only (or on to block 0 for the profile); only the centred logit probes
    # go back through the head, the rest start below it after one p W product (model_pass)
    blocks_above = sum(params["per_block"][lowest + 1 :])
    backward = (up + blocks_above) if analysis.profile else blocks_above
    head_products = cfg.logit_probes + 1
    sums = 4 * 2 * n_eval * d * d * (1 + probes / 2)  # every reading's sum of u u^T
    flops = {
        "harvest_train": 2 * up_train * n_train,
        "harvest_eval": 2 * (up + above) * n_eval
        + ((1 + probes) * backward + head_products * params["head"]) * 2 * n_eval,
        "sigma": sums
        + (1 + direct) * PLUG_IN_EIGS * EIG_D3 * d**3
        + correction_flops(n_eval, d, direct),
        # the sparse step (sae/sparse.py): the dense encoder product (2 d m a token) and
        # the selection among its m outputs; the rest touches only the kept entries.
        # About 4 d m a token, measured on the default sweep. Imported SAEs train nothing.
        "sweep": 0 if sweep.imports else 4 * d * width_sum * n_train * sweep.epochs,
        "ce_loss_recovered": 2 * (up + above) * sweep.ce_sequences * seq * (2 + n_saes),
        "scores": 4 * d * width_sum * n_eval,
        "analysis": analysis_flops(d, len(sweep.widths) * len(sweep.architectures)),
    }
    flops.update(control_flops(the_plan, sweep, analysis, flops))
    if analysis.profile:
        n_layers = the_plan.source.n_layers
        flops["profile"] = n_layers * (
            sums
            + (1 + direct) * PLUG_IN_EIGS * EIG_D3 * d**3
            + correction_flops(n_eval, d, direct, debias.LIGHT)
        )
    speed = (flops_per_second or matmul_flops_per_second(cfg.dtype, cfg.device)) * EFFICIENCY
    seconds = {k: v / speed for k, v in flops.items()}
    weight_bytes = the_plan.pass_memory.weights
    seconds = {"start": START_SECONDS + weight_bytes / LOAD_BYTES_PER_SECOND, **seconds}
    if "synthetic" in analysis.selected_controls():
        seconds["control.synthetic"] = synthetic_steps(sweep) * SYNTHETIC_STEP_SECONDS
    seconds["report"] = REPORT_SECONDS + REPORT_SECONDS_PER_CONTROL * len(
        analysis.selected_controls()
    )
    if not the_plan.source.converted and the_plan.source.gguf_origin:
        seconds["convert_gguf_once"] = 45.0  # measured for SmolLM2-135M on 2 CPU cores
    return {
        "tokens": {"train": n_train, "eval": n_eval},
        "parameters": {k: v for k, v in params.items() if k != "per_block"},
        "saes": n_saes,
        "disk_bytes": disk_bytes(the_plan, sweep),
        "memory": memory_plan(the_plan, sweep, analysis),
        "matmul_flops_per_second": speed / EFFICIENCY,
        "efficiency_assumed": EFFICIENCY,
        "seconds": {**seconds, "total": sum(seconds.values())},
    }


def memory_plan(the_plan: Plan, sweep: SweepConfig, analysis: AnalysisConfig) -> dict:
    """The device, its memory, and each stage's estimated peak and batch size."""
    cfg, need = the_plan.config, the_plan.pass_memory
    device, d, widest = torch.device(cfg.device), the_plan.source.d_model, max(sweep.widths)
    return {
        "device": describe(device),
        "usable_bytes": need.budget,
        "model_weights_bytes": need.weights,
        "model_bytes_per_sequence": need.per_sequence,
        "model_batch_size": cfg.batch_size,
        "model_pass_bytes": need.weights + cfg.batch_size * need.per_sequence,
        "widest_sae_training_bytes": sae_training_bytes(
            d, widest, sweep.batch_tokens, sweep.sae_dtype
        ),
        "widest_sae_score_tokens": dense_batch_tokens(d, widest, analysis.read_tokens, device),
        "profile_sums_bytes": profile.sums_bytes(
            the_plan.source.n_layers,
            d,
            min(analysis.profile_blocks, len(the_plan.splits.eval)),
            len(profile.profile_readings(cfg.logit_probes, cfg.fisher_probes)),
        )
        if analysis.profile
        else 0,
    }
