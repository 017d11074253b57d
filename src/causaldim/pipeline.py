"""`causaldim run`: the stages in order, each reading what the one before wrote, ending
in results.json (the single source of every number and figure of the report).

check (no weights) -> harvest (the model pass, or a finished store) -> measure the layer
(direct Sigma, SAE sweep, CE loss recovered, AtP scores, counts and fits) -> controls
-> results.json -> figures, report.md, report.html

`causaldim harvest` and `causaldim train` run the first stages of the same pipeline,
with the same checks.
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import torch

from . import controls, faults
from .config import AnalysisConfig, HarvestConfig, SweepConfig
from .costs import disk_bytes
from .devices import memory, resolve_dtype
from .errors import UsageError
from .executors import Executor, executor_for
from .fileio import atomic_write_json, write_sealed_json
from .harvest import HarvestResult, Plan, Store, harvest, plan
from .measures import profile
from .measures.analysis import MIN_WIDTHS
from .measures.layer import Measurement, measure_layer
from .measures.score import require_gradients
from .measures.subspace import causal_subspace
from .measures.sweep import SweepEntry, load_entries, splice_evaluation, sweep_saes
from .memory import HEADROOM, check_sae_training
from .model.corpus import budget_tokens
from .model.load import LoadedModel, load_model
from .model.sites import NotABlockOutput, equivalents
from .presets import PRESETS, unused_settings
from .progress import bar as progress_bar
from .report.render import render
from .report.results import build_results
from .sae import releases
from .sae.formats import check_weights, describe_source, peek_d_in
from .threads import Threads
from .threads import limited as limited_threads


class Plans(NamedTuple):
    """The harvest plan (every layer the pass writes; device, dtype and batch size
    resolved), the controls' plans of other harvests, the sweep as it will run, and the
    selected controls."""

    main: Plan
    side: dict[str, Plan | None]
    sweep: SweepConfig
    controls: list[str]
    # Per imported SAE (--sae-paths, --sae-release): its local path, format and the site
    # its metadata names; for --sae-release also release, id, repo and revision.
    imports: list[dict] = []
    # A dry run's refusals of what this machine lacks (memory, disk): a run would stop there.
    would_stop: tuple[str, ...] = ()
    # What the user should know before the run starts, (code, message): the dry run and
    # the run print them, and results.json's warnings carry them
    notes: tuple[tuple[str, str], ...] = ()


def check(
    cfg: HarvestConfig,
    sweep_cfg: SweepConfig,
    analysis_cfg: AnalysisConfig | None = None,
    dry_run: bool = False,
    preset: str = "default",
) -> Plans:
    """Every check that needs no weights; returns the plans (preset: the one the settings
    came from, so that its notes can say how the run stands to the data it names). A dry
    run plans a known hub model from its shape when the hub cannot be reached, and lists
    what this machine lacks (memory, disk) instead of stopping there."""
    own = {n for n in controls.NAMES if controls.get(n).uses_control_sweep}
    unused = unused_settings(preset, cfg, sweep_cfg, analysis_cfg, own)
    analysis_cfg = analysis_cfg or AnalysisConfig()
    would_stop: list[str] = []

    def resource(check_fn, *args, **kw) -> None:
        try:
            check_fn(*args, **kw)
        except UsageError as exc:
            if not dry_run:
                raise
            would_stop.append(str(exc))

    sweep_cfg.check()
    analysis_cfg.check()
    analysis_cfg.check_against(sweep_cfg)
    # The release's ids as files to fetch: no download yet (an unknown release stops here).
    wanted = (
        releases.resolve(sweep_cfg.sae_release, sweep_cfg.sae_ids) if sweep_cfg.sae_release else []
    )
    selected = analysis_cfg.selected_controls()
    chosen = [controls.get(name) for name in selected]
    if sweep_cfg.imports and any(c.trains_own_saes for c in chosen):
        own = [name for name in controls.NAMES if controls.get(name).trains_own_saes]
        flag = "--sae-paths" if sweep_cfg.sae_paths else "--sae-release"
        raise UsageError(
            f"{flag} holds one layer's SAEs, and the {', '.join(own[:-1])} and {own[-1]} "
            f"controls train their own; drop those controls or {flag}"
        )
    for c in chosen:
        if c.widen_sweep is not None:
            sweep_cfg = c.widen_sweep(sweep_cfg, analysis_cfg)
    executor_for(sweep_cfg.executor, sweep_cfg.ray_address)  # Ray installed, if asked for
    main = plan(cfg, profile=analysis_cfg.profile, dry_run=dry_run)
    device = torch.device(main.config.device)
    sweep_cfg = replace(sweep_cfg, sae_dtype=resolve_dtype(sweep_cfg.sae_dtype, device))
    if sweep_cfg.executor == "local" and not sweep_cfg.imports:
        resource(
            check_sae_training,
            main.source.d_model,
            sweep_cfg.widths,
            sweep_cfg.batch_tokens,
            sweep_cfg.sae_dtype,
            device,
            beside=main.pass_memory.weights,
        )
    trained = sweep_cfg.epochs * main.splits.train.numel()
    if sweep_cfg.dead_tokens and sweep_cfg.dead_tokens >= trained and not sweep_cfg.imports:
        raise UsageError(
            f"--dead-tokens {sweep_cfg.dead_tokens:,} is not below the {trained:,} tokens each "
            "SAE trains on: no feature could count as dead and AuxK would never switch on; "
            "pass a smaller value, or leave it out (default: a tenth of them)"
        )
    # Imported SAEs: fetched (--sae-release), then each checked against the model's d and
    # the run's layer, from headers and metadata only.
    sources = releases.fetch(wanted) if wanted else [{"path": p} for p in sweep_cfg.sae_paths]
    imports = [_check_import(s, main, cfg.model) for s in sources]
    if wanted:  # the fetched files go through the --sae-paths machinery
        sweep_cfg = replace(sweep_cfg, sae_paths=[s["path"] for s in imports])
    extra = [
        layer
        for c in chosen
        if c.extra_layers is not None
        for layer in c.extra_layers(analysis_cfg, main.source.n_layers, main.layer)
    ]
    if extra:
        main = plan(cfg, extra_layers=tuple(extra), profile=analysis_cfg.profile, dry_run=dry_run)
    if analysis_cfg.profile:
        c, need = main.config, main.pass_memory
        free = int(HEADROOM * memory(device)[1]) - need.weights - c.batch_size * need.per_sequence
        readings = len(profile.profile_readings(c.logit_probes, c.fisher_probes))
        blocks = min(analysis_cfg.profile_blocks, len(main.splits.eval))
        resource(
            profile.check_memory,
            main.source.n_layers,
            main.source.d_model,
            blocks,
            readings,
            free,
            str(device),
        )
    resource(_check_disk, main, sweep_cfg)
    side = {c.name: c.side_plan(cfg, analysis_cfg, main) for c in chosen if c.side_plan}
    return Plans(
        main,
        side,
        sweep_cfg,
        selected,
        imports,
        tuple(would_stop),
        tuple(
            _notes(main, imports, PRESETS["paper"]["tokens"] if preset == "paper" else None)
            + unused
        ),
    )


def plan_line(the_plan: Plan, preset: str) -> str:
    """The run's first line: the model and layer, and the data (corpus, tokens)."""
    cfg, splits = the_plan.config, the_plan.splits
    return (
        f"causaldim run (preset {preset}): {cfg.model} layer {the_plan.layer}; corpus "
        f"{the_plan.corpus.id}: {len(splits.train) * cfg.seq_len:,} train and "
        f"{len(splits.eval) * cfg.seq_len:,} eval tokens in sequences of {cfg.seq_len}; "
        f"out {cfg.out}"
    )


def _notes(the_plan: Plan, imports: list[dict], preset_tokens: int | None) -> list[tuple[str, str]]:
    """Before the run, as (code, message): a corpus shorter than --tokens asks (and, for a
    preset that names its data, how far short of it the run is); what a sweep of imported
    SAEs cannot give."""
    notes = []
    cfg, splits = the_plan.config, the_plan.splits
    got = (len(splits.train) + len(splits.eval)) * cfg.seq_len
    asked = budget_tokens(cfg.seq_len, cfg.tokens)
    if got < asked:
        notes.append(
            (
                "corpus_short",
                f"the corpus {the_plan.corpus.id} holds {got:,} tokens in sequences of "
                f"{cfg.seq_len}, fewer than the {asked:,} --tokens asks "
                f"({100 * got / asked:.1f}%): the run uses them all; pass a larger --corpus "
                "(a hub dataset) for more",
            )
        )
    if preset_tokens and got < preset_tokens and cfg.tokens == preset_tokens:
        notes.append(
            (
                "short_of_the_papers_data",
                f"this preset's data is {preset_tokens:,} tokens (the paper's); this run has "
                f"{100 * got / preset_tokens:.1f}% of it, from {the_plan.corpus.id}",
            )
        )
    if imports and len(imports) < MIN_WIDTHS:
        notes.append(
            (
                "few_imported_widths",
                f"kappa_hat needs SAEs of {MIN_WIDTHS} widths or more, and {len(imports)} "
                "imported SAE(s) give no saturating fit: the report gives each width's "
                "N_causal, its AtP distribution and kappa_SAE, beside the direct kappa",
            )
        )
    return notes


def _check_import(source: dict, the_plan: Plan, model: str) -> dict:
    """An imported SAE refused, in one line, where its file is damaged or a variant
    causaldim does not read, it reads another d than the model's, its metadata names
    another site than the run's layer, or a weight is not finite; else its source, with
    the format and the site it names ("unknown" where it names none)."""
    path, layer = Path(source["path"]), the_plan.layer
    label = (
        f"--sae-release {source['release']} --sae-ids {source['id']}"
        if "release" in source
        else f"--sae-paths {path}"
    )
    if (d := peek_d_in(path)) != the_plan.source.d_model:
        raise UsageError(
            f"{label}: the SAE reads d = {d}, layer {layer} of {model} has "
            f"d = {the_plan.source.d_model}; pass SAEs of this model"
        )
    here = f"this run measures --layer {layer} ({equivalents(layer)['transformer_lens']})"
    try:
        own = describe_source(path, source.get("id"))
    except NotABlockOutput as exc:
        raise UsageError(
            f"{label}: {exc} (named by its metadata); {here}; pass residual-stream SAEs "
            f"of layer {layer}"
        ) from None
    if own["block"] is not None and own["block"] != layer:
        raise UsageError(
            f"{label}: its metadata names {own['site']} (the output of block {own['block']}); "
            f"{here}; pass SAEs of layer {layer}, or --layer {own['block']}"
        )
    check_weights(path)  # NaN or infinite weights: refused now, not when the sweep reads them
    return {**source, "path": str(path), **own}


def _check_disk(the_plan: Plan, sweep_cfg: SweepConfig | None) -> None:
    """Refuse a run whose stores and SAEs (none without a sweep) would not fit on the
    output's disk."""
    missing = [i for i, d in the_plan.store_dirs.items() if not (d / "manifest.json").is_file()]
    need = disk_bytes(the_plan, sweep_cfg)
    planned = need["saes"] + need["store"] * len(missing) // len(the_plan.store_dirs)
    folder = next(
        p for p in [Path(the_plan.config.out), *Path(the_plan.config.out).parents] if p.exists()
    )
    free = shutil.disk_usage(folder).free
    if planned > free:
        raise UsageError(
            f"--out {the_plan.config.out}: the run needs about {planned / 1e9:,.2f} GB and "
            f"{folder} has {free / 1e9:,.2f} GB free; free space, choose another --out, or "
            "harvest fewer --tokens"
        )


class Harvested:
    """The harvest stage's stores, and the model: the one the pass loaded, or loaded on
    first use by a later stage (none when every store was reused and no stage needs it)."""

    def __init__(self, result: HarvestResult, the_plan: Plan):
        self.result, self.plan, self._lm = result, the_plan, result.lm

    def load_lm(self) -> LoadedModel:
        if self._lm is None:
            p = self.plan
            self._lm = load_model(p.source, p.config.dtype, p.layers_path, p.config.device)
        return self._lm


def harvest_stage(
    the_plan: Plan, progress: bool, seconds: dict, observer: profile.Accumulator | None = None
) -> Harvested:
    t = time.perf_counter()
    result = harvest(the_plan.config, progress=progress, the_plan=the_plan, observer=observer)
    require_gradients(result.store)
    seconds["harvest"] = time.perf_counter() - t
    return Harvested(result, the_plan)


def controls_stage(
    plans: Plans,
    harvested: Harvested,
    here: Measurement,
    analysis_cfg: AnalysisConfig,
    executor: Executor,
    headline: str,
    progress: bool,
    seconds: dict,
) -> dict:
    if not plans.controls:
        return {}
    t = time.perf_counter()
    bar = progress_bar(plans.controls, desc="controls", enabled=progress)
    ctx = controls.Context(
        store=harvested.result.store,
        here=here,
        headline=headline,
        sweep_cfg=plans.sweep,
        analysis_cfg=analysis_cfg,
        seed=plans.main.config.seed,
        out=Path(plans.main.config.out),
        load_lm=harvested.load_lm,
        executor=executor,
        stores=harvested.result.stores,
        plan=plans.main,
        side_plans=plans.side,
        progress=progress,
    )
    out = controls.run_controls(
        plans.controls,
        ctx,
        progress=lambda name: bar.set_postfix_str(name) or bar.update(),
        seconds=seconds,
    )
    bar.close()
    seconds["controls"] = time.perf_counter() - t
    return out


def harvest_only(
    cfg: HarvestConfig, progress: bool = True, threads: int | None = None
) -> HarvestResult:
    """The pipeline's first stage alone (`causaldim harvest`), with the checks a run makes
    of it: the plan, the output folder and the disk."""
    the_plan = plan(cfg)
    _check_disk(the_plan, None)
    with limited_threads(threads):
        return harvest_stage(the_plan, progress, {}).result


def _profile_accumulator(the_plan: Plan, cfg: AnalysisConfig) -> profile.Accumulator:
    """The profile's sums of every block output, filled by the eval pass."""
    c = the_plan.config
    return profile.Accumulator(
        range(the_plan.source.n_layers),
        the_plan.source.d_model,
        len(the_plan.splits.eval),
        c.seq_len,
        cfg.profile_blocks,
        profile.profile_readings(c.logit_probes, c.fisher_probes),
        cfg.include_outliers,
        c.device,
    )


class RunResult(NamedTuple):
    results: dict
    path: Path  # results.json
    outputs: list[Path]  # figures and reports


def run(
    cfg: HarvestConfig,
    sweep_cfg: SweepConfig | None = None,
    analysis_cfg: AnalysisConfig | None = None,
    progress: bool = True,
    preset: str = "default",
    threads: int | None = None,
) -> RunResult:
    """The whole measurement; finished stages of an earlier run (store, SAEs) are reused.
    `threads`: how many to compute with (default: one per core this process may use)."""
    analysis_cfg = analysis_cfg or AnalysisConfig()
    plans = check(cfg, sweep_cfg or SweepConfig(), analysis_cfg, preset=preset)
    if progress:  # what is about to run, on what data, before the first bar
        print(plan_line(plans.main, preset), file=sys.stderr)
    for _, note in plans.notes:  # what to know first: printed with --quiet too
        print(f"note: {note}", file=sys.stderr)
    faults.reset()
    # Under Ray, 'auto' is resolved by each worker (the GPU it is given, if any).
    executor = executor_for(plans.sweep.executor, plans.sweep.ray_address, cfg.device)
    with limited_threads(threads) as used:
        return _run(plans, analysis_cfg, executor, progress, preset, used)


def _run(
    plans: Plans,
    analysis_cfg: AnalysisConfig,
    executor: Executor,
    progress: bool,
    preset: str,
    used: Threads,
) -> RunResult:
    cfg, sweep_cfg = plans.main.config, plans.sweep  # device, dtype and batch size resolved
    out = Path(cfg.out)
    started, t0 = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), time.perf_counter()
    seconds = {}

    acc = _profile_accumulator(plans.main, analysis_cfg) if analysis_cfg.profile else None
    harvested = harvest_stage(plans.main, progress, seconds, acc)
    store = harvested.result.store
    here = measure_layer(
        store,
        out,
        sweep_cfg,
        analysis_cfg,
        cfg.seed,
        progress,
        seconds,
        harvested.load_lm,
        cfg.repair,
        executor,
        imports=plans.imports,
    )
    headline = here.entries[0].architecture if sweep_cfg.sae_paths else sweep_cfg.architectures[0]
    subspace = causal_subspace(
        out, plans.main.layer, here.sigma, here.saes, here.scores, here.analysis
    )
    profiled = None
    if acc is not None:
        t = time.perf_counter()
        probes = {"logits": cfg.logit_probes, "fisher": cfg.fisher_probes}
        found = profile.estimates(acc, analysis_cfg, cfg.seed, probes, progress)
        profiled = profile.profile_results(found, acc, plans.main.layer)
        seconds["profile"] = time.perf_counter() - t
    found = controls_stage(
        plans, harvested, here, analysis_cfg, executor, headline, progress, seconds
    )
    results = build_results(
        preset=preset,
        harvest_cfg=cfg,
        sweep_cfg=sweep_cfg,
        analysis_cfg=analysis_cfg,
        store=store,
        store_reused=harvested.result.reused,
        out=out,
        here=here,
        controls=found,
        subspace=subspace,
        profile=profiled,
        headline=headline,
        started=started,
        seconds=seconds,
        threads=used,
        notes=plans.notes,
    )
    path = out / "results.json"
    # Figures first; then results.json with the final timings, which the text report shows.
    t = time.perf_counter()
    write_sealed_json(path, results)
    faults.fault_point("stage.report")
    figures = render(path, text=False)
    seconds["report"] = time.perf_counter() - t
    seconds["total"] = time.perf_counter() - t0
    write_sealed_json(path, results)
    return RunResult(results, path, [*figures, *render(path, figures=False)])


class TrainResult(NamedTuple):
    store: Store
    entries: list[SweepEntry]
    ce: dict | None  # CE loss recovered, when --ce-sequences > 0


def train(
    cfg: HarvestConfig,
    sweep_cfg: SweepConfig,
    progress: bool = True,
    threads: int | None = None,
    preset: str = "default",
) -> TrainResult:
    """The pipeline up to the SAE sweep (`causaldim train`): the same checks as a run,
    the store (harvested if needed), the SAEs trained on the executor or imported from
    --sae-paths, and CE loss recovered written to OUT/saes/ce_loss_recovered.json."""
    plans = check(cfg, sweep_cfg, preset=preset)
    for _, note in plans.notes:
        print(f"note: {note}", file=sys.stderr)
    faults.reset()
    executor = executor_for(plans.sweep.executor, plans.sweep.ray_address, cfg.device)
    with limited_threads(threads):
        return _train(plans, executor, progress)


def _train(plans: Plans, executor: Executor, progress: bool) -> TrainResult:
    cfg, sweep_cfg = plans.main.config, plans.sweep
    harvested = harvest_stage(plans.main, progress, {})
    store = harvested.result.store
    entries = sweep_saes(
        store, Path(cfg.out), sweep_cfg, cfg.seed, progress, cfg.repair, executor, plans.imports
    )
    ce = None
    if sweep_cfg.ce_sequences:
        seqs = store.token_ids("eval", sweep_cfg.ce_sequences)
        ce = splice_evaluation(harvested.load_lm(), store, seqs, load_entries(entries))
        atomic_write_json(Path(cfg.out) / "saes" / "ce_loss_recovered.json", ce)
    return TrainResult(store, entries, ce)
