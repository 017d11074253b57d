"""`causaldim run`: the stages in order, each reading what the one before wrote, ending
in results.json (the single source of every number and figure of the report).

corpus -> store (harvest) -> direct Sigma -> SAE sweep -> AtP scores -> counts and fits
       -> results.json -> figures, report.md, report.html
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import NamedTuple

from tqdm.auto import tqdm

from . import __version__, models
from .analysis import PAPER, analyze
from .config import AnalysisConfig, HarvestConfig, SweepConfig
from .controls import run_controls
from .fileio import atomic_write_json, sha256_file
from .harvest import harvest, plan
from .report import SCHEMA, render
from .sae.sweep import load_entries, run_sweep, splice_evaluation
from .score import atp_scores, require_gradients
from .sigma import measure


class RunResult(NamedTuple):
    results: dict
    path: Path  # results.json
    outputs: list[Path]  # figures and reports


def check(cfg: HarvestConfig, sweep_cfg: SweepConfig, analysis_cfg: AnalysisConfig):
    """Every check that needs no weights; returns the harvest plan."""
    sweep_cfg.check()
    analysis_cfg.check()
    analysis_cfg.check_against(sweep_cfg)
    return plan(cfg)


def run(
    cfg: HarvestConfig,
    sweep_cfg: SweepConfig | None = None,
    analysis_cfg: AnalysisConfig | None = None,
    progress: bool = True,
    preset: str = "default",
) -> RunResult:
    """The whole measurement; finished stages of an earlier run (store, SAEs) are reused."""
    analysis_cfg = analysis_cfg or AnalysisConfig()
    sweep_cfg = analysis_cfg.sweep_for(sweep_cfg or SweepConfig())
    the_plan = check(cfg, sweep_cfg, analysis_cfg)  # before anything is written
    out = Path(cfg.out)
    started, t0 = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), time.perf_counter()
    seconds = {}

    def stage(name: str, t: float) -> None:
        seconds[name] = time.perf_counter() - t

    t = time.perf_counter()
    result = harvest(cfg, progress=progress, the_plan=the_plan)
    store = result.store
    require_gradients(store)
    stage("harvest", t)
    m = store.manifest

    t = time.perf_counter()
    sigma = measure(store, analysis_cfg, seed=cfg.seed)
    stage("sigma", t)

    t = time.perf_counter()
    entries = run_sweep(store, out, sweep_cfg, cfg.seed, progress=progress)
    saes = load_entries(entries)
    stage("sweep", t)

    ce = None
    if sweep_cfg.ce_sequences:
        t = time.perf_counter()
        lm = result.lm or models.load_model(the_plan.source, cfg.dtype, the_plan.layers_path)
        seqs = the_plan.splits.eval[: sweep_cfg.ce_sequences]
        ce = splice_evaluation(lm, store, seqs, saes)
        del lm
        stage("ce_loss_recovered", t)

    t = time.perf_counter()
    scores, evals, training, by_arch = {}, {}, {}, {}
    for e, (name, sae) in tqdm(
        zip(entries, saes.items(), strict=True), desc="AtP scores", disable=not progress
    ):
        scores.setdefault(e.architecture, {})[e.width] = atp_scores(
            sae, store, analysis_cfg.blocks, analysis_cfg.read_tokens
        )
        by_arch.setdefault(e.architecture, {})[e.width] = sae
        ev = dict(e.meta["eval"])
        if ce is not None:
            ev["ce_loss_recovered"] = ce["saes"][name]["ce_loss_recovered"]
        evals.setdefault(e.architecture, {})[e.width] = ev
        training[name] = {
            "folder": str(e.folder.relative_to(out)),
            "reused": e.reused,
            "seconds": e.meta["train_stats"]["seconds"],
            "steps": e.meta["train_stats"].get("steps"),
        }
    stage("scores", t)

    t = time.perf_counter()
    sweep = {
        arch: analyze(scores[arch], evals[arch], store.d_model, analysis_cfg, cfg.seed)
        for arch in sweep_cfg.architectures
    }
    stage("analysis", t)

    controls, selected = {}, analysis_cfg.selected_controls()
    if selected:
        t = time.perf_counter()
        bar = tqdm(selected, desc="controls", disable=not progress)
        controls = run_controls(
            selected,
            store,
            by_arch,
            scores,
            evals,
            sweep,
            sweep_cfg.architectures[0],
            float(sweep_cfg.k),
            analysis_cfg,
            cfg.seed,
            lambda: (
                result.lm or models.load_model(the_plan.source, cfg.dtype, the_plan.layers_path)
            ),
            progress=lambda name: bar.set_postfix_str(name) or bar.update(),
        )
        bar.close()
        stage("controls", t)

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
        "sigma": {reading: est.to_dict() for reading, est in sigma.items()},
        "ce": None if ce is None else {k: v for k, v in ce.items() if k != "saes"},
        "saes": training,
        "sweep": sweep,
        "controls": controls,
        "headline": sweep_cfg.architectures[0],
        "paper": PAPER,
        "versions": {**m["versions"], **_versions()},
        "started": started,
        "seconds": seconds,
    }
    path = out / "results.json"
    # Figures first; then results.json with the final timings, which the text report shows.
    t = time.perf_counter()
    atomic_write_json(path, results)
    figures = render(path, text=False)
    stage("report", t)
    seconds["total"] = time.perf_counter() - t0
    atomic_write_json(path, results)
    return RunResult(results, path, [*figures, *render(path, figures=False)])


def _versions() -> dict:
    import platform

    import numpy
    import scipy

    return {
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
    }
