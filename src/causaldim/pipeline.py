"""`causaldim run`: the stages in order, each reading what the one before wrote, ending
in results.json (the single source of every number and figure of the report).

check (no weights: checks.py) -> harvest (the model pass, or a finished store) -> measure the layer
(direct Sigma, SAE sweep, CE loss recovered, AtP scores, counts and fits) -> controls
-> results.json -> figures, report.md, report.html

`causaldim harvest` and `causaldim train` run the first stages of the same pipeline,
with the same checks.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import NamedTuple

from . import controls, faults
from .checks import Plans, check, check_disk, plan_line
from .config import AnalysisConfig, HarvestConfig
from .devices import resolve_device
from .errors import UsageError
from .executors import Executor, executor_for
from .fileio import atomic_write_json, write_sealed_json
from .harvest import HarvestResult, Plan, Store, harvest, plan
from .harvest.plan import extension_sequences
from .lock import held
from .measures import profile
from .measures.ladder import ladder
from .measures.layer import Measurement, measure_layer
from .measures.score import require_gradients
from .measures.sigma import HEADLINE
from .measures.subspace import causal_subspace, shares_of
from .measures.sweep import SweepEntry, load_entries, splice_evaluation, sweep_saes
from .measures.weights import predictors
from .model.load import LoadedModel, load_model
from .progress import bar as progress_bar
from .report.render import render
from .report.results import build_results
from .rounds import headline_extension, until_converged
from .sweep_config import SweepConfig
from .threads import Threads
from .threads import limited as limited_threads


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
    eval_stores: dict[int, list[Store]],
) -> dict:
    if not plans.controls:
        return {}
    t = time.perf_counter()
    bar = progress_bar(plans.controls, desc="controls", enabled=progress)
    assert harvested.result.stores is not None  # harvest() hands back every layer's
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
        eval_stores=eval_stores,
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
    check_disk(the_plan, None)
    with held(cfg.out), limited_threads(threads):
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
        extension_sequences(the_plan),
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
    with held(cfg.out), limited_threads(threads) as used:
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
    t = time.perf_counter()
    extension = headline_extension(plans.main, harvested.result, harvested.load_lm, progress, acc)
    seconds["headline"] = time.perf_counter() - t
    # what each layer's headline reading reads: its eval split and its extension
    assert harvested.result.stores is not None  # harvest() hands back every layer's
    eval_stores = {
        i: [s, *([extension[i]] if i in extension else [])]
        for i, s in harvested.result.stores.items()
    }
    rounds = None
    if cfg.until_converged:
        t = time.perf_counter()
        device = resolve_device(executor.device)
        rounds = until_converged(
            plans.main,
            eval_stores[plans.main.layer],
            analysis_cfg,
            cfg.seed,
            device,
            harvested.load_lm,
            progress,
        )
        seconds["until_converged"] = time.perf_counter() - t
        eval_stores[plans.main.layer] = rounds.stores
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
        eval_stores=eval_stores[plans.main.layer],
        both_ways=True,
    )
    headline = here.entries[0].architecture if sweep_cfg.sae_paths else sweep_cfg.architectures[0]
    subspace = causal_subspace(
        out, plans.main.layer, here.sigma, shares_of(here.digests), here.scores, here.analysis
    )
    t = time.perf_counter()
    weights = predictors(harvested.load_lm())
    seconds["weights"] = time.perf_counter() - t
    ladder_found = None
    if analysis_cfg.ladder_sequences and HEADLINE in here.sigma:
        t = time.perf_counter()
        ladder_found = ladder(
            harvested.load_lm(),
            store,
            here.sigma[HEADLINE],
            min(analysis_cfg.ladder_sequences, store.manifest["splits"]["train"]["n_sequences"]),
            cfg.seed,
        )
        seconds["ladder"] = time.perf_counter() - t
    profiled = None
    if acc is not None:
        t = time.perf_counter()
        probes = {"logits": cfg.logit_probes, "fisher": cfg.fisher_probes}
        found = profile.estimates(acc, analysis_cfg, cfg.seed, probes, progress)
        profiled = profile.profile_results(found, acc, plans.main.layer)
        seconds["profile"] = time.perf_counter() - t
    found = controls_stage(
        plans, harvested, here, analysis_cfg, executor, headline, progress, seconds, eval_stores
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
        rounds=rounds,
        extension=extension.get(plans.main.layer),
        weights=weights,
        ladder=ladder_found,
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
    if sweep_cfg.drop_weights:
        raise UsageError(
            "--drop-weights deletes each SAE once a run has scored it; 'causaldim train' "
            "keeps the SAEs it trains: leave it out, or use 'causaldim run'"
        )
    plans = check(cfg, sweep_cfg, preset=preset)
    for _, note in plans.notes:
        print(f"note: {note}", file=sys.stderr)
    faults.reset()
    executor = executor_for(plans.sweep.executor, plans.sweep.ray_address, cfg.device)
    with held(cfg.out), limited_threads(threads):
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
