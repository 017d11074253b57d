"""`causaldim run`: the stages in order, each reading what the one before wrote, ending
in results.json (the single source of every number and figure of the report)."""

from __future__ import annotations

import time
from pathlib import Path

from . import __version__
from .config import HarvestConfig, SigmaConfig
from .fileio import atomic_write_json
from .harvest import harvest, plan
from .report import render
from .sigma import measure


def run(cfg: HarvestConfig, sigma_cfg: SigmaConfig | None = None, progress: bool = True):
    """Harvest (or reuse) the store, measure Sigma directly, write results and figures."""
    sigma_cfg = sigma_cfg or SigmaConfig()
    sigma_cfg.check()
    the_plan = plan(cfg)  # every check before anything is written
    out = Path(cfg.out)
    seconds = {}

    t = time.perf_counter()
    result = harvest(cfg, progress=progress, the_plan=the_plan)
    seconds["harvest"] = time.perf_counter() - t
    m = result.store.manifest

    t = time.perf_counter()
    sigma = measure(result.store, sigma_cfg, seed=cfg.seed)
    seconds["sigma"] = time.perf_counter() - t

    results = {
        "causaldim_version": __version__,
        "config": {"harvest": cfg.to_dict(), "sigma": sigma_cfg.to_dict()},
        "stages_done": ["harvest", "sigma"],
        "store": {
            "path": str(result.store.root.relative_to(out)),
            "reused": result.reused,
            "model": m["model"],
            "layer": m["layer"],
            "site": m["site"],
            "corpus": m["corpus"],
            "tokens": {k: v["n_tokens"] for k, v in m["splits"].items()},
            "throughput_tokens_per_second": {
                k: v["tokens_per_second"] for k, v in m["splits"].items()
            },
            "outliers": m["outliers"],
            "eval_mean_loss": m["splits"]["eval"]["mean_loss"],
            "probes": {"logits": m["key"]["logit_probes"], "fisher": m["key"]["fisher_probes"]},
        },
        "sigma": {reading: est.to_dict() for reading, est in sigma.items()},
        "versions": m["versions"],
        "seconds": seconds,
    }
    path = out / "results.json"
    atomic_write_json(path, results)
    figures = render(path)
    return results, path, figures
