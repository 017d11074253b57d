"""Everything measured at one layer from its store: direct Sigma, the SAE sweep (trained
or imported), CE loss recovered where the model is at hand, AtP scores, and each
architecture's counts and fits."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from ..config import AnalysisConfig
from ..devices import resolve_device
from ..executors import Executor, LocalExecutor
from ..faults import fault_point
from ..harvest.store import Store
from ..model.load import LoadedModel
from ..sae import SAE
from ..sweep_config import SweepConfig
from .analysis import analyze
from .diagnose import imported_l0_spread
from .score import ScoreJob, Scores, load_scores, score_job
from .sigma import measure, other_outlier_choice
from .sweep import SweepEntry, load_entries, splice_evaluation, sweep_saes


class Measurement(NamedTuple):
    """Everything measured at one layer from its store; per architecture, then width."""

    sigma: dict  # reading -> SigmaEstimate
    entries: list[SweepEntry]  # the sweep's SAEs (replicate 0 of each width)
    saes: dict[str, dict[int, SAE]]
    scores: dict[str, dict[int, Scores]]
    evals: dict[str, dict[int, dict]]
    analysis: dict[str, dict]
    ce: dict | None
    replicates: list[SweepEntry] = []  # the same widths trained again (--sae-seeds)
    # each direct reading with the other choice of outliers (sigma.other_outlier_choice)
    other_outliers: dict | None = None

    def sigma_dicts(self) -> dict:
        """The Sigma estimates as results.json holds them."""
        return {reading: est.to_dict() for reading, est in self.sigma.items()}


def measure_layer(
    store: Store,
    out: Path,
    sweep_cfg: SweepConfig,
    analysis_cfg: AnalysisConfig,
    seed: int,
    progress: bool,
    seconds: dict,
    load_lm: Callable[[], LoadedModel] | None = None,
    repair: bool = False,
    executor: Executor | None = None,
    imports: list[dict] | None = None,
    eval_stores: list[Store] | None = None,
    both_ways: bool = False,
) -> Measurement:
    """Direct Sigma, the SAE sweep (SAEs under out/saes, trained or imported), AtP scores
    and the analysis of one store, the training and scoring jobs on executor (default: in
    this process, on the CPU); with load_lm, each SAE is also spliced into the model (CE
    recovered). Each stage's seconds go into `seconds`. `imports`: the sources of the
    imported SAEs, as the pipeline's check described them; where their eval L0s differ by
    more than 10%, each sweep's `l0_spread` and warnings say so. `eval_stores`: what the
    direct Sigma reads (the store and its --until-converged rounds; default the store);
    both_ways: also each direct reading with the other choice of outliers."""

    def timed(name: str, work):
        fault_point(f"stage.{name}")
        t = time.perf_counter()
        value = work()
        seconds[name] = time.perf_counter() - t
        return value

    executor = executor or LocalExecutor()
    device = resolve_device(executor.device)  # under Ray, the driver's
    read = eval_stores or store

    def direct():  # with the run's choice of outliers, and (the headline layer) the other
        found = measure(read, analysis_cfg, seed, device, progress)
        both = other_outlier_choice(read, analysis_cfg, seed, device) if both_ways else None
        return found, both

    sigma, other = timed("sigma", direct)
    trained = timed(
        "sweep",
        lambda: sweep_saes(store, out, sweep_cfg, seed, progress, repair, executor, imports),
    )
    entries = [e for e in trained if e.replicate == 0]
    replicates = [e for e in trained if e.replicate > 0]
    named = load_entries(entries)
    ce = None
    if sweep_cfg.ce_sequences and load_lm is not None:
        seqs = store.token_ids("eval", sweep_cfg.ce_sequences)
        ce = timed("ce_loss_recovered", lambda: splice_evaluation(load_lm(), store, seqs, named))
    saes, scores, evals = {}, {}, {}
    t = time.perf_counter()
    jobs = [
        ScoreJob(
            str(store.root),
            str(e.folder),
            analysis_cfg.blocks,
            analysis_cfg.read_tokens,
            str(out / "scores" / f"{e.name}.safetensors"),
        )
        for e in [*entries, *replicates]
    ]
    scored = [
        load_scores(p).normalised(analysis_cfg.atp_normalisation, analysis_cfg.min_firings)
        for p in executor.map(score_job, jobs, "AtP scores", progress)
    ]
    again: dict[str, dict[int, list[Scores]]] = {}
    for e, s in zip(replicates, scored[len(entries) :], strict=True):
        again.setdefault(e.architecture, {}).setdefault(e.width, []).append(s)
    for e, (name, sae), s in zip(entries, named.items(), scored[: len(entries)], strict=True):
        scores.setdefault(e.architecture, {})[e.width] = s
        saes.setdefault(e.architecture, {})[e.width] = sae
        ev = {**e.meta["eval"], "train_firings": e.meta["train_stats"].get("firings")}
        if ce is not None:
            ev["ce_loss_recovered"] = ce["saes"][name]["ce_loss_recovered"]
        evals.setdefault(e.architecture, {})[e.width] = ev
    seconds["scores"] = time.perf_counter() - t
    analysis = timed(
        "analysis",
        lambda: {
            arch: analyze(
                scores[arch],
                evals[arch],
                store.d_model,
                analysis_cfg,
                seed,
                {m: sae.W_dec for m, sae in saes[arch].items()},
                again.get(arch),
                progress,
            )
            for arch in scores
        },
    )
    if sweep_cfg.imports:  # SAEs of others' L0s: the widths may compare sparsities
        spread = imported_l0_spread(evals)
        for a in analysis.values():
            a["l0_spread"] = spread
            if spread["flagged"]:
                a["warnings"].append(spread["warning"])
                a["cautions"].append(["imported_l0_spread", spread["warning"]])
    return Measurement(sigma, entries, saes, scores, evals, analysis, ce, replicates, other)
