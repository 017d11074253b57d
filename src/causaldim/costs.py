"""What a run will cost, before it starts: a time estimate (the disk it needs: disk.py).

Each stage's work is counted in three kinds, each timed here in under a second at the
run's own shapes (`calibrate`): matmul FLOPs shaped as the model's products (the passes,
splices and Sigma's sums), FLOPs shaped as the SAE encoder product (training and scoring),
and d x d eigendecompositions (the corrections, fits and resamples). The estimate ignores
attention's own FLOPs and data movement: the share of each kind's measured speed a stage
reaches was measured on whole runs (benchmarks/busy.py, docs/measured.md).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import NamedTuple, TypedDict

import torch

from .config import AnalysisConfig
from .devices import describe, planned
from .disk import disk_bytes
from .harvest import Plan
from .harvest.plan import extension_sequences
from .measures import debias, profile
from .memory import dense_batch_tokens, sae_training_bytes, step_entries
from .model.load import decoder_layers, skeleton
from .sweep_config import SweepConfig

# The share of the calibrated speed whole stages reach, and a stage's seconds per
# eigendecomposition over the calibration's, fitted to the stages of the smoke and default
# runs on a 2-core AVX-512 CPU (benchmarks/busy.py; docs/measured.md, "The dry run's
# estimate"): the passes lose a third to attention, norms and activations; an SAE step is
# about half GEMMs (topk, the embedding-bag backward, copies: benchmarks/sae_step.py); the
# corrections run their eigendecompositions one a core, side by side (threads.parallel_map).
MODEL_EFFICIENCY = 0.65
SAE_EFFICIENCY = 0.36
EIG_OVERHEAD = 0.6
# A planned GPU is not here to time: its eigendecompositions are counted as this many d^3
# FLOPs at its stated matmul speed (about what the 2-core CPU's measured).
EIG_D3 = 8.5
CORRECTION_STEPS = 10  # the deconvolution settles in about this many steps (measured)
PLUG_IN_EIGS = 8  # per reading: the estimate, its split halves and its convergence curve
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


@dataclass(frozen=True)
class Work:
    """A stage's work in the three kinds the calibration times."""

    model: float = 0.0  # FLOPs of products shaped as the model's
    sae: float = 0.0  # FLOPs of products shaped as the SAE encoder's
    eigs: float = 0.0  # d x d symmetric eigendecompositions

    def __add__(self, other: Work) -> Work:
        return Work(self.model + other.model, self.sae + other.sae, self.eigs + other.eigs)

    def __mul__(self, k: float) -> Work:
        return Work(self.model * k, self.sae * k, self.eigs * k)

    __rmul__ = __mul__


class Rates(NamedTuple):
    """The speeds the estimate divides by, measured at the run's shapes (or, for a
    planned GPU, its stated matmul speed)."""

    model: float  # FLOP/s of a [batch x seq, d] @ [d, d_ff] product in the model's dtype
    sae: float  # FLOP/s of a [batch_tokens, d] @ [d, width] product in the SAE dtype
    eig: float  # seconds of one d x d eigendecomposition (float32, as debias computes)
    source: str  # "measured here" or "stated for <GPU>"

    def seconds(self, work: Work) -> float:
        return (
            work.model / (self.model * MODEL_EFFICIENCY)
            + work.sae / (self.sae * SAE_EFFICIENCY)
            + work.eigs * self.eig * EIG_OVERHEAD
        )


PRODUCT_FLOPS = 4e9  # the largest product the dry run times (a fraction of a second)
PROBE_ROWS = 8  # rows of the first, small product that tells a slow number type
SLOW_RATE = 2e9  # FLOP/s: a probe slower than this gives the rate itself


def _median_seconds(fn, reps: int, sync) -> float:
    fn()  # warm-up
    sync()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def calibrate(
    d: int,
    d_ff: int,
    model_rows: int,
    sae_rows: int,
    width: int,
    dtype: str = "float32",
    sae_dtype: str = "float32",
    device: str = "cpu",
) -> Rates:
    """Time, on device, one product of each shape a run computes and one d x d
    eigendecomposition (the median of a few repetitions: what the machine gives now, busy
    or not). A planned GPU (devices.planning_for) is not timed: its stated speed."""
    dev = torch.device(device)
    if dev.type == "cuda" and (gpu := planned()) is not None:
        model, sae = gpu.matmul_flops[dtype], gpu.matmul_flops[sae_dtype]
        return Rates(model, sae, EIG_D3 * d**3 / model, f"stated for {gpu.name}")
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def product_rate(rows: int, cols: int, dt: str) -> float:
        # A product of PROBE_ROWS rows first: where even that is slow (bfloat16 on a CPU
        # without bf16 instructions runs at a fraction of a GFLOP/s), the rate is timed on
        # it alone; otherwise on a product of at most PRODUCT_FLOPS.
        b = torch.randn(d, cols, dtype=getattr(torch, dt), device=dev)
        probe = torch.randn(PROBE_ROWS, d, dtype=getattr(torch, dt), device=dev)
        probe_rate = 2 * PROBE_ROWS * d * cols / _median_seconds(lambda: probe @ b, 1, sync)
        if probe_rate < SLOW_RATE:
            return probe_rate
        rows = max(64, min(rows, int(PRODUCT_FLOPS / (2 * d * cols))))
        a = torch.randn(rows, d, dtype=getattr(torch, dt), device=dev)
        return 2 * rows * d * cols / _median_seconds(lambda: a @ b, 7, sync)

    x = torch.randn(d, d, device=dev)
    spd = x @ x.T + d * torch.eye(d, device=dev)
    eig = _median_seconds(lambda: torch.linalg.eigvalsh(spd), 5, sync)
    return Rates(
        product_rate(min(model_rows, 4096), d_ff, dtype),
        product_rate(min(sae_rows, 4096), min(width, 16_384), sae_dtype),
        eig,
        "measured here",
    )


def d_ff(the_plan: Plan) -> int:
    """The width of the model's MLP (4 d where its config does not say)."""
    size = getattr(the_plan.source.config, "intermediate_size", None)
    return size or 4 * the_plan.source.d_model


class ParameterCounts(TypedDict):
    """parameter_counts' weights: through L, above L, the head's, and each block's."""

    through_layer: int
    above_layer: int
    head: int
    per_block: list[int]


def parameter_counts(the_plan: Plan) -> ParameterCounts:
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


def correction_work(n_eval: int, d: int, readings: int, b: debias.Budget = debias.FULL) -> Work:
    """The finite-sample correction (measures/debias.py) of each direct reading: its
    eigendecompositions (the point, about CORRECTION_STEPS deconvolution steps of b.draws
    each; the half-blocks estimate and each jackknife replicate, a few steps from it) and
    its simulated sampling of n_eval weighted Gaussian samples per draw."""
    eigs = b.draws * (CORRECTION_STEPS + b.half_iterations)
    eigs += b.groups * (1 + b.replicate_draws * b.replicate_iterations)
    return readings * Work(model=b.draws * 2 * n_eval * d * d, eigs=eigs)


def sigma_work(n_eval: int, d: int, probes: int, readings: int, b: debias.Budget) -> Work:
    """One layer's direct readings: every reading's sum of u u^T over the eval tokens,
    the plug-in estimates (PLUG_IN_EIGS each) and the correction."""
    sums = Work(model=4 * 2 * n_eval * d * d * (1 + probes / 2))
    plug_in = Work(eigs=(1 + readings) * PLUG_IN_EIGS)
    return sums + plug_in + correction_work(n_eval, d, readings, b)


def headline_sigma_work(n_head: int, d: int, probes: int, b: debias.Budget) -> Work:
    """What the --headline-tokens extension adds to the headline reading's and the
    activations' sums and simulated sampling (their eigendecompositions are counted with
    the eval split's)."""
    if not n_head or not probes:
        return Work()
    sums = Work(model=2 * n_head * d * d * (probes + 1))
    return sums + Work(model=2 * b.draws * n_head * d * d)


def analysis_work(n_widths: int) -> Work:
    """kappa_SAE of each width: its point and each resample, a d x d eigendecomposition."""
    from .measures.attributed import RESAMPLES

    return Work(eigs=n_widths * (1 + RESAMPLES))


def digest_work(d: int, sweep: SweepConfig, reference: int | None) -> Work:
    """The decoders' digests: each wider width's cosines against the reference's
    (measures/digest.py), a product of the encoder's shape."""
    reference = reference or sweep.widths[0]
    wider = sum(m for m in sweep.widths if m > reference)
    return Work(sae=2 * d * reference * wider * len(sweep.architectures))


def control_work(
    the_plan: Plan,
    sweep: SweepConfig,
    analysis: AnalysisConfig,
    layer_work: dict[str, Work],
    params: ParameterCounts,
) -> dict[str, Work]:
    """The controls that cost more than a few seconds: the real ablations (a forward of
    the blocks above L and the head per feature over the sequences it is ablated on), the
    task control's clean passes and ablations on short prompts, and the depth control's
    other layers (each measured as the run's layer is: `layer_work`). The synthetic
    control is counted in steps (synthetic_steps). params: parameter_counts(the_plan)."""

    cfg = the_plan.config
    # Both start from block L's cached clean output: only the blocks above it and the head
    # run for each ablation (the task control's head, for one position only).
    above = 2 * (params["above_layer"] + params["head"])
    model = 2 * (params["through_layer"] + params["above_layer"] + params["head"])
    picked = set(analysis.selected_controls())
    out = {}
    if "ablation" in picked:
        features = 1 + analysis.ablation_features * len(sweep.widths)
        out["control.ablation"] = Work(
            model=above * features * analysis.ablation_sequences * cfg.seq_len
        )
    if "task" in picked:
        tokens = analysis.task_prompts * TASK_PROMPT_TOKENS
        out["control.task"] = Work(
            model=3 * model * tokens
            + 2 * params["above_layer"] * tokens * (TASK_FEATURES * TASK_FIRING_SHARE)
        )
    # the controls' own sweeps (depth, architectures): one architecture each, at
    # --control-widths and --control-epochs where given
    n_arch = len(sweep.architectures)
    widths = analysis.control_widths or sweep.widths
    lighter = (sum(widths) * (analysis.control_epochs or sweep.epochs)) / (
        sum(sweep.widths) * sweep.epochs
    )
    one_sweep = (1 / n_arch) * (
        lighter * layer_work["sweep"]
        + len(widths) / len(sweep.widths) * (layer_work["scores"] + layer_work["analysis"])
    )
    if "depth" in picked:
        # with a lighter sweep of its own it measures the headline layer again too
        layers = len(the_plan.store_dirs) - (0 if analysis.lighter_controls else 1)
        out["control.depth"] = layers * (layer_work["sigma"] + one_sweep)
    if "architectures" in picked and analysis.lighter_controls:
        out["control.architectures"] = 3 * one_sweep
    if "nulls" in picked:
        # each untrained network: the headline pass over the eval split and its extension
        # (a forward to the head's input, the centred probes' backwards from there), its
        # headline reading raw and activation-weighted (controls/nulls.py)
        from .model.nulls import KINDS

        n = (len(the_plan.splits.eval) + extension_sequences(the_plan)) * cfg.seq_len
        blocks_to_head = params["through_layer"] + params["above_layer"]
        one_pass = Work(model=2 * (blocks_to_head + cfg.logit_probes * params["above_layer"]) * n)
        reading = sigma_work(n, the_plan.source.d_model, cfg.logit_probes, 1, debias.FULL)
        out["control.nulls"] = len(KINDS) * (one_pass + 2 * reading)
    if "four_cell" in picked:
        # three random cells scored per width, with L0 held (the headline's SAEs) and with
        # L0 free (JumpReLU SAEs: the run's, else the controls' sweep, trained here unless
        # the architectures control trains it)
        scores = (1 / n_arch) * layer_work["scores"]
        free = 3 * len(widths) / len(sweep.widths) * scores
        if "jumprelu" not in sweep.architectures and "architectures" not in picked:
            free = free + one_sweep
        out["control.four_cell"] = 3 * scores + free
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
    rates: Rates | None = None,
    profile_layers: tuple[int, ...] | None = None,
) -> dict:
    """The run's tokens, parameters, disk, memory and seconds per stage; rates: measured
    here (calibrate) unless given; profile_layers: the layers the profile taps (None:
    every layer)."""
    cfg = the_plan.config
    assert cfg.batch_size is not None  # resolved by plan()
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
    tapped = profile_taps(the_plan, analysis, profile_layers)
    blocks_above = sum(params["per_block"][lowest + 1 :])
    backward = sum(params["per_block"][min(lowest, *tapped) :]) if tapped else blocks_above
    # one p W product a batch (the Gaussian probes are drawn at the head's input)
    head_products = 1
    # the --headline-tokens extension: the forward to the head's input, the centred
    # probes' backwards from there, no head
    n_head = extension_sequences(the_plan) * seq
    blocks_to_head = up + params["above_layer"]
    work = {
        "harvest_train": Work(model=2 * up_train * n_train),
        "harvest_eval": Work(
            model=2 * (up + above) * n_eval
            + ((1 + probes) * backward + head_products * params["head"]) * 2 * n_eval
        ),
        "harvest_headline": Work(
            model=2 * (blocks_to_head + cfg.logit_probes * blocks_above) * n_head
        ),
        # each output reading raw and activation-weighted (measures/kappa.py): twice
        "sigma": 2
        * (
            sigma_work(n_eval, d, probes, direct, debias.FULL)
            + headline_sigma_work(n_head, d, cfg.logit_probes, debias.FULL)
        ),
        # the head's centred Gram (measures/weights.py)
        "weights": Work(model=2 * params["head"] * d),
        # the sparse step (sae/sparse.py): the dense encoder product (2 d m a token) and
        # the selection among its m outputs; the rest touches only the kept entries.
        # About 4 d m a token, measured on the default sweep. Imported SAEs train nothing.
        "sweep": Work(sae=0 if sweep.imports else 4 * d * width_sum * n_train * sweep.epochs),
        "ce_loss_recovered": Work(model=2 * (up + above) * sweep.ce_sequences * seq * (2 + n_saes)),
        "scores": Work(sae=4 * d * width_sum * n_eval),
        "analysis": analysis_work(len(sweep.widths) * len(sweep.architectures))
        + digest_work(d, sweep, analysis.reference_width),
    }
    if analysis.ladder_sequences and cfg.logit_probes:
        # block L's output once, then the blocks above and the head for the clean pass and
        # each ranking's every k but the shared k = 0 (measures/ladder.py)
        from .measures.ladder import ladder_of

        tokens = min(analysis.ladder_sequences, len(the_plan.splits.train)) * seq
        passes = 1 + 4 * (len(ladder_of(d)) - 1) + 1
        work["ladder"] = Work(model=2 * (up + passes * above) * tokens)
    work.update(control_work(the_plan, sweep, analysis, work, params))
    if tapped:
        # the metric pass (a forward to the deepest tapped block), then each layer's
        # readings raw and activation-weighted
        deepest = sum(params["per_block"][: max(tapped) + 1])
        work["metric_pass"] = Work(model=2 * deepest * n_eval)
        work["profile"] = 2 * len(tapped) * sigma_work(n_eval, d, probes, direct, debias.LIGHT)
    if rates is None:
        rates = calibrate(
            d,
            d_ff(the_plan),
            cfg.batch_size * seq,
            sweep.batch_tokens,
            max(sweep.widths),
            cfg.dtype,
            sweep.sae_dtype,
            cfg.device,
        )
    seconds = {k: rates.seconds(w) for k, w in work.items()}
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
        "tokens": {"train": n_train, "eval": n_eval, "headline": n_head},
        "parameters": {k: v for k, v in params.items() if k != "per_block"},
        "saes": n_saes,
        "disk_bytes": disk_bytes(the_plan, sweep, analysis),
        "memory": memory_plan(the_plan, sweep, analysis, tapped),
        "rates": rates._asdict(),
        "seconds": {**seconds, "total": sum(seconds.values())},
    }


def profile_taps(
    the_plan: Plan, analysis: AnalysisConfig, layers: tuple[int, ...] | None = None
) -> tuple[int, ...]:
    """The layers whose profile sums the eval pass fills: none without --profile."""
    if not analysis.profile:
        return ()
    return tuple(range(the_plan.source.n_layers)) if layers is None else tuple(layers)


def memory_plan(
    the_plan: Plan,
    sweep: SweepConfig,
    analysis: AnalysisConfig,
    tapped: tuple[int, ...] | None = None,
) -> dict:
    """The device, its memory, and each stage's estimated peak and batch size; tapped: the
    profile's layers (profile_taps)."""
    if tapped is None:
        tapped = profile_taps(the_plan, analysis)
    cfg, need = the_plan.config, the_plan.pass_memory
    assert cfg.batch_size is not None  # resolved by plan()
    device, d, widest = torch.device(cfg.device), the_plan.source.d_model, max(sweep.widths)
    return {
        "device": describe(device),
        "usable_bytes": need.budget,
        "model_weights_bytes": need.weights,
        "model_bytes_per_sequence": need.per_sequence,
        "model_batch_size": cfg.batch_size,
        "model_pass_bytes": need.weights + cfg.batch_size * need.per_sequence,
        "widest_sae_training_bytes": sae_training_bytes(
            d,
            widest,
            sweep.batch_tokens,
            sweep.sae_dtype,
            sweep.optimizer,
            step_entries(sweep.k, sweep.architectures),
        ),
        "sae_optimizer": sweep.optimizer,
        "widest_sae_score_tokens": dense_batch_tokens(d, widest, analysis.read_tokens, device),
        "profile_sums_bytes": profile.sums_bytes(
            len(tapped),
            d,
            min(analysis.profile_blocks, len(the_plan.splits.eval)),
            profile.sums_per_layer(cfg.logit_probes, cfg.fisher_probes),
        ),
    }
