"""`causaldim run`: the stages in order, each reading what the one before wrote, ending
in results.json (the single source of every number and figure of the report).

corpus -> store (harvest) -> direct Sigma -> SAE sweep -> AtP scores -> counts and fits
       -> results.json -> figures, report.md, report.html
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import torch
from tqdm.auto import tqdm

from . import __version__, faults, models
from .ablation import eval_sequences
from .analysis import PAPER, analyze
from .config import AnalysisConfig, HarvestConfig, SweepConfig
from .controls import run_controls
from .costs import disk_bytes
from .devices import resolve_device, resolve_dtype
from .errors import UsageError
from .executors import Executor, LocalExecutor, executor_for
from .faults import fault_point
from .fileio import sha256_file, write_sealed_json
from .harvest import Plan, harvest, plan
from .memory import check_sae_training
from .models import resolve_model
from .report import SCHEMA, render
from .sae import SAE
from .sae.formats import peek_d_in
from .sae.sweep import SweepEntry, import_saes, load_entries, run_sweep, splice_evaluation
from .score import ScoreJob, Scores, load_scores, require_gradients, score_job
from .sigma import measure
from .store import Store
from .structure import default_depth_layers, depth_summary, matched_layer, scale_comparison
from .synthetic import synthetic_ground_truth
from .task import task_recovery


class RunResult(NamedTuple):
    results: dict
    path: Path  # results.json
    outputs: list[Path]  # figures and reports


class Plans(NamedTuple):
    """The harvest plans (every layer the pass writes; device, dtype and batch size
    resolved), for control 'scale' the second model's, and the sweep as it will run."""

    main: Plan
    scale: Plan | None
    sweep: SweepConfig


def check(cfg: HarvestConfig, sweep_cfg: SweepConfig, analysis_cfg: AnalysisConfig) -> Plans:
    """Every check that needs no weights; returns the plans."""
    sweep_cfg.check()
    analysis_cfg.check()
    analysis_cfg.check_against(sweep_cfg)
    selected = analysis_cfg.selected_controls()
    if sweep_cfg.sae_paths and {"depth", "scale", "synthetic"} & set(selected):
        raise UsageError(
            "--sae-paths holds one layer's SAEs, and the depth, scale and synthetic controls "
            "train their own; drop those controls or --sae-paths"
        )
    executor_for(sweep_cfg.executor, sweep_cfg.ray_address)  # Ray installed, if asked for
    main = plan(cfg)
    device = torch.device(main.config.device)
    sweep_cfg = replace(sweep_cfg, sae_dtype=resolve_dtype(sweep_cfg.sae_dtype, device))
    if sweep_cfg.executor == "local" and not sweep_cfg.sae_paths:
        check_sae_training(
            main.source.d_model,
            sweep_cfg.widths,
            sweep_cfg.batch_tokens,
            sweep_cfg.sae_dtype,
            device,
            beside=main.pass_memory.weights,
        )
    for path in sweep_cfg.sae_paths:
        if (d := peek_d_in(Path(path))) != main.source.d_model:
            raise UsageError(
                f"--sae-paths {path}: the SAE reads d = {d}, layer {main.layer} of "
                f"{cfg.model} has d = {main.source.d_model}; pass SAEs of this model"
            )
    if "depth" in selected:
        n = main.source.n_layers
        extra = analysis_cfg.depth_layers or default_depth_layers(n, main.layer)
        main = plan(cfg, extra_layers=tuple(extra))
    _check_out_folder(Path(cfg.out), main.key)
    _check_disk(main, sweep_cfg)
    scale = None
    if "scale" in selected and analysis_cfg.scale_model:
        other = resolve_model(analysis_cfg.scale_model, cfg.trust_remote_code)
        layer = matched_layer(main.layer, main.source.n_layers, other.n_layers)
        scale = plan(
            replace(
                cfg, model=analysis_cfg.scale_model, layer=layer, out=str(Path(cfg.out) / "scale")
            )
        )
    return Plans(main, scale, sweep_cfg)


RUN_ENTRIES = {"results.json", "stores", "saes", "scores", "figures", "report.md", "report.html"}


def _check_out_folder(out: Path, key: dict) -> None:
    """A run writes into an empty folder or its own earlier output (the same store key:
    it resumes or adds to it), nothing else."""
    if not out.is_dir():
        return
    entries = {p.name for p in out.iterdir() if not p.name.startswith(".")}
    foreign = sorted(entries - RUN_ENTRIES - {"depth", "scale", "controls"})
    if foreign:
        raise UsageError(
            f"--out {out} holds files that are not a causaldim run ({', '.join(foreign[:3])}"
            f"{', ...' if len(foreign) > 3 else ''}); choose an empty or new folder"
        )
    try:
        earlier = json.loads((out / "results.json").read_text())["inputs"]["store"]["key"]
    except (OSError, ValueError, KeyError, TypeError):
        return  # no finished run here (a damaged results.json is rewritten by this one)
    changed = sorted(k for k in set(key) | set(earlier) if key.get(k) != earlier.get(k))
    if changed:
        raise UsageError(
            f"--out {out} holds a run of another harvest ({', '.join(changed)} differ); "
            "choose another --out folder"
        )


def _check_disk(the_plan: Plan, sweep_cfg: SweepConfig) -> None:
    """Refuse a run whose stores and SAEs would not fit on the output's disk."""
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


class Measurement(NamedTuple):
    """Everything measured at one layer from its store; per architecture, then width."""

    sigma: dict  # reading -> SigmaEstimate
    entries: list[SweepEntry]
    saes: dict[str, dict[int, SAE]]
    scores: dict[str, dict[int, Scores]]
    evals: dict[str, dict[int, dict]]
    analysis: dict[str, dict]
    ce: dict | None


def measure_layer(
    store: Store,
    out: Path,
    sweep_cfg: SweepConfig,
    analysis_cfg: AnalysisConfig,
    seed: int,
    progress: bool,
    seconds: dict,
    load_lm=None,
    repair: bool = False,
    executor: Executor | None = None,
) -> Measurement:
    """Direct Sigma, the SAE sweep (SAEs under out/saes, trained or imported), AtP scores
    and the analysis of one store, the training and scoring jobs on executor (default: in
    this process, on the CPU); with load_lm, each SAE is also spliced into the model (CE
    recovered)."""

    def timed(name: str, work):
        fault_point(f"stage.{name}")
        t = time.perf_counter()
        value = work()
        seconds[name] = time.perf_counter() - t
        return value

    executor = executor or LocalExecutor()
    device = resolve_device(executor.device)  # under Ray, the driver's
    sigma = timed("sigma", lambda: measure(store, analysis_cfg, seed, device))
    if sweep_cfg.sae_paths:
        entries = timed("sweep", lambda: import_saes(store, out, sweep_cfg.sae_paths))
    else:
        entries = timed(
            "sweep", lambda: run_sweep(store, out, sweep_cfg, seed, progress, repair, executor)
        )
    named = load_entries(entries)
    ce = None
    if sweep_cfg.ce_sequences and load_lm is not None:

        def splice():
            seqs = eval_sequences(store, sweep_cfg.ce_sequences)
            return splice_evaluation(load_lm(), store, seqs, named)

        ce = timed("ce_loss_recovered", splice)
    saes, scores, evals = {}, {}, {}
    t = time.perf_counter()
    jobs = [
        ScoreJob(
            str(store.root),
            str(e.folder),
            analysis_cfg.blocks,
            analysis_cfg.read_tokens,
            str(out / "scores" / f"{e.architecture}-w{e.width}.safetensors"),
        )
        for e in entries
    ]
    scored = [load_scores(p) for p in executor.map(score_job, jobs, "AtP scores", progress)]
    for e, (name, sae), s in zip(entries, named.items(), scored, strict=True):
        scores.setdefault(e.architecture, {})[e.width] = s
        saes.setdefault(e.architecture, {})[e.width] = sae
        ev = dict(e.meta["eval"])
        if ce is not None:
            ev["ce_loss_recovered"] = ce["saes"][name]["ce_loss_recovered"]
        evals.setdefault(e.architecture, {})[e.width] = ev
    seconds["scores"] = time.perf_counter() - t
    analysis = timed(
        "analysis",
        lambda: {
            arch: analyze(scores[arch], evals[arch], store.d_model, analysis_cfg, seed)
            for arch in scores
        },
    )
    return Measurement(sigma, entries, saes, scores, evals, analysis, ce)


def run(
    cfg: HarvestConfig,
    sweep_cfg: SweepConfig | None = None,
    analysis_cfg: AnalysisConfig | None = None,
    progress: bool = True,
    preset: str = "default",
) -> RunResult:
    """The whole measurement; finished stages of an earlier run (store, SAEs) are reused."""
    analysis_cfg = analysis_cfg or AnalysisConfig()
    plans = check(cfg, analysis_cfg.sweep_for(sweep_cfg or SweepConfig()), analysis_cfg)
    faults.reset()
    # Under Ray, 'auto' is resolved by each worker (the GPU it is given, if any).
    executor = executor_for(plans.sweep.executor, plans.sweep.ray_address, cfg.device)
    the_plan, sweep_cfg = plans.main, plans.sweep
    cfg = the_plan.config  # device, dtype and batch size resolved
    out = Path(cfg.out)
    started, t0 = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), time.perf_counter()
    seconds = {}

    t = time.perf_counter()
    result = harvest(cfg, progress=progress, the_plan=the_plan)
    store = result.store
    require_gradients(store)
    seconds["harvest"] = time.perf_counter() - t
    m = store.manifest
    lm = result.lm

    def load_lm():
        nonlocal lm
        lm = lm or models.load_model(the_plan.source, cfg.dtype, the_plan.layers_path, cfg.device)
        return lm

    here = measure_layer(
        store,
        out,
        sweep_cfg,
        analysis_cfg,
        cfg.seed,
        progress,
        seconds,
        load_lm,
        cfg.repair,
        executor,
    )
    headline = here.entries[0].architecture if sweep_cfg.sae_paths else sweep_cfg.architectures[0]
    controls, selected = {}, analysis_cfg.selected_controls()
    if selected:
        t = time.perf_counter()
        bar = tqdm(selected, desc="controls", disable=not progress)
        # The structure experiments measure other layers and models with the headline's
        # settings: one architecture, no controls of their own.
        quiet = replace(analysis_cfg, controls=[])
        one_arch = replace(sweep_cfg, architectures=[headline])

        def depth():
            per_layer = {the_plan.layer: (_sigma_dicts(here.sigma), here.analysis[headline])}
            for layer, other in sorted(result.stores.items()):
                if layer != the_plan.layer:
                    folder = out / "depth" / f"L{layer}"
                    there = measure_layer(
                        other, folder, one_arch, quiet, cfg.seed, False, {}, executor=executor
                    )
                    per_layer[layer] = (_sigma_dicts(there.sigma), there.analysis[headline])
            return depth_summary(per_layer)

        def task():
            width = analysis_cfg.reference_width or min(sweep_cfg.widths)
            sae, scores = here.saes[headline][width], here.scores[headline][width]
            return {
                "width": width,
                **task_recovery(
                    load_lm(), store, sae, scores, analysis_cfg.task_prompts, seed=cfg.seed
                ),
            }

        def scale():
            if plans.scale is None:
                return {"skipped": "needs a second model of the family: pass --scale-model"}
            other = harvest(plans.scale.config, progress=False, the_plan=plans.scale).store
            there = measure_layer(
                other, out / "scale", one_arch, quiet, cfg.seed, False, {}, executor=executor
            )
            names = (cfg.model, analysis_cfg.scale_model)
            return {
                "layers": [the_plan.layer, plans.scale.layer],
                "n_layers": [the_plan.source.n_layers, plans.scale.source.n_layers],
                "d_model": [store.d_model, other.d_model],
                **scale_comparison(
                    (here.scores[headline], here.analysis[headline]),
                    (there.scores[headline], there.analysis[headline]),
                    names,
                    seed=cfg.seed,
                ),
            }

        controls = run_controls(
            selected,
            store,
            here.saes,
            here.scores,
            here.evals,
            here.analysis,
            headline,
            float(sweep_cfg.k),
            analysis_cfg,
            cfg.seed,
            load_lm,
            {
                "synthetic": lambda: synthetic_ground_truth(
                    out / "controls" / "synthetic", one_arch, quiet, cfg.seed
                ),
                "task": task,
                "depth": depth,
                "scale": scale,
            },
            progress=lambda name: bar.set_postfix_str(name) or bar.update(),
        )
        bar.close()
        seconds["controls"] = time.perf_counter() - t

    training = {
        f"{e.architecture}-w{e.width}": {
            "folder": str(e.folder.relative_to(out)),
            "reused": e.reused,
            "seconds": e.meta["train_stats"]["seconds"],
            "steps": e.meta["train_stats"].get("steps"),
        }
        for e in here.entries
    }
    sigma, ce, sweep = here.sigma, here.ce, here.analysis
    results = {
        "schema": SCHEMA,
        "causaldim_version": __version__,
        "preset": preset,
        "config": {
            "harvest": cfg.to_dict(),
            "sweep": sweep_cfg.to_dict(),
            "analysis": analysis_cfg.to_dict(),
        },
        "seed": cfg.seed,
        "inputs": {
            "model": m["model"]["identity"],
            "corpus": m["corpus"],
            "store": {
                "path": str(store.root.relative_to(out)),
                "manifest_sha256": sha256_file(store.root / "manifest.json"),
                "key": m["key"],
            },
        },
        "store": {
            "reused": result.reused,
            "model": m["model"],
            "layer": m["layer"],
            "site": m["site"],
            "seq_len": m["seq_len"],
            "tokens": {k: v["n_tokens"] for k, v in m["splits"].items()},
            "throughput_tokens_per_second": {
                k: v["tokens_per_second"] for k, v in m["splits"].items()
            },
            "outliers": m["outliers"],
            "eval_mean_loss": m["splits"]["eval"]["mean_loss"],
            "probes": {"logits": m["key"]["logit_probes"], "fisher": m["key"]["fisher_probes"]},
        },
        "sigma": _sigma_dicts(sigma),
        "ce": None if ce is None else {k: v for k, v in ce.items() if k != "saes"},
        "saes": training,
        "sweep": sweep,
        "controls": controls,
        "headline": headline,
        "paper": PAPER,
        "versions": {**m["versions"], **_versions()},
        "started": started,
        "seconds": seconds,
    }
    path = out / "results.json"
    # Figures first; then results.json with the final timings, which the text report shows.
    t = time.perf_counter()
    write_sealed_json(path, results)
    fault_point("stage.report")
    figures = render(path, text=False)
    seconds["report"] = time.perf_counter() - t
    seconds["total"] = time.perf_counter() - t0
    write_sealed_json(path, results)
    return RunResult(results, path, [*figures, *render(path, figures=False)])


def _sigma_dicts(sigma: dict) -> dict:
    return {reading: est.to_dict() for reading, est in sigma.items()}


def _versions() -> dict:
    import platform

    import numpy
    import scipy

    return {
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
    }
