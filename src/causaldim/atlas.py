"""`causaldim atlas`: the direct kappa at every layer over a grid of models x corpora x
context lengths, each cell with the outliers left out and kept, from one eval pass.

A cell is one eval-only pass of a model over a corpus in sequences of one length, its
backward run on to block 0 so that every block's readings (loss, logits centred and
literal, fisher) are summed on the way (measures/profile.py), twice: outliers left out
and kept. Each layer is corrected as the profile's are (debias.LIGHT), with its interval
and convergence (or the eval tokens that would do). Cells are written one by one to
OUT/cells/NAME.json: a rerun skips the finished ones, a killed one starts its cell again.
No SAEs: the atlas is about kappa, not about the estimator.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from .config import AnalysisConfig, HarvestConfig, option
from .devices import peak_bytes, reset_peak
from .errors import UsageError
from .fileio import read_sealed_json, write_sealed_json
from .harvest import harvest, plan
from .harvest.plan import Plan, extension_sequences
from .measures import profile
from .measures.ladder import ladder_at
from .measures.sigma import HEADLINE
from .measures.weights import predictors
from .paper import MIDDLE_DEPTH, depth_layer
from .rounds import round_plan


@dataclass
class AtlasConfig:
    """The grid and what each cell reads."""

    models: list[str] = option(
        ["smollm2-135m", "gemma3-270m"], "Models: embedded names, hub names, folders, .gguf."
    )
    corpora: list[str] = option(
        ["builtin", "speeches"], "Corpora: built-in names, mixtures (a+b), files, hub names."
    )
    seq_lens: list[int] = option([128, 512], "Context lengths (tokens a sequence).")
    eval_tokens: int = option(16_384, "Eval tokens a cell reads for every reading (full pass).")
    headline_tokens: int = option(
        16_384,
        "Eval tokens beyond --eval-tokens that a cell reads for the headline reading alone, by "
        "the headline pass (no head, no loss gradient, no Fisher probe): about 3x cheaper a "
        "token. 0: none.",
    )
    depths: list[float] = option(
        [],
        "Relative depths to measure (0: the first block, 1: the last; each to its nearest "
        "layer). None given: every layer. Fewer layers make a cell cheaper per eval token.",
    )
    profile_blocks: int = option(8, "Sequence blocks of each layer's sums (memory: see --dry-run).")
    ladder_sequences: int = option(
        8,
        "Held-out sequences (the planned train half, never harvested) on which a cell checks "
        "the directions that matter at its middle layer by intervention (0: not checked).",
    )
    seed: int = option(0, "Seed of the sequences and the probes.")
    max_minutes: float | None = option(
        None,
        "Start no new cell after this many minutes; atlas.md then lists the cells not yet "
        "measured, and the same command measures them (0: only write what is finished).",
    )
    out: str = option("runs/atlas", "Output folder: cells/, atlas.csv, atlas.json, figures.")

    def cells(self) -> list[Cell]:
        return [Cell(m, c, s) for m in self.models for c in self.corpora for s in self.seq_lens]

    def check(self) -> None:
        if self.eval_tokens <= 0 or self.profile_blocks < 2:
            raise UsageError("--eval-tokens must be positive and --profile-blocks at least 2")
        if self.headline_tokens < 0:
            raise UsageError("--headline-tokens must be 0 or more")
        if self.ladder_sequences < 0:
            raise UsageError("--ladder-sequences must be 0 or more")
        if self.max_minutes is not None and not 0 <= self.max_minutes < float("inf"):
            raise UsageError("--max-minutes must be a number of minutes, 0 or more")
        if any(not 0 <= x <= 1 for x in self.depths):
            raise UsageError("every --depths must be between 0 and 1 (a fraction of the depth)")
        if any(s < 2 for s in self.seq_lens):
            raise UsageError("every --seq-lens must be at least 2")
        for name in ("models", "corpora", "seq_lens", "depths"):
            if len(set(getattr(self, name))) < len(getattr(self, name)):
                raise UsageError(f"--{name.replace('_', '-')} names one twice; give each once")

    def layers(self, n_layers: int) -> tuple[int, ...]:
        """The layers a cell of an n_layers model measures."""
        if not self.depths:
            return tuple(range(n_layers))
        return tuple(sorted({depth_layer(x, n_layers) for x in self.depths}))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class Cell(NamedTuple):
    model: str
    corpus: str
    seq_len: int

    @property
    def name(self) -> str:
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in f"{self.model}")
        corpus = "".join(ch if ch.isalnum() or ch in "-_+" else "_" for ch in self.corpus)
        return f"{safe}--{corpus}--{self.seq_len}"


RULES = {"left out": False, "kept": True}  # outliers: include_outliers
# the readings a cell also measures in the activations' metric (kappa_act): the headline's
# (each twin costs a layer's correction again)
TWINS = (HEADLINE,)
METRICS = ["raw", "activation-weighted"]  # what a cell measures; older cells: raw alone


def harvest_config(cfg: AtlasConfig, cell: Cell) -> HarvestConfig:
    """The cell's pass: eval only (the train half is planned, never harvested)."""
    return HarvestConfig(
        model=cell.model,
        corpus=cell.corpus,
        seq_len=cell.seq_len,
        tokens=2 * cfg.eval_tokens,
        eval_fraction=0.5,
        headline_tokens=cfg.headline_tokens,
        seed=cfg.seed,
        out=str(Path(cfg.out) / "passes" / cell.name),
    )


def plans(cfg: AtlasConfig) -> dict[Cell, Plan]:
    """Every cell's plan, checked before any pass (bad input stops here, in one line)."""
    cfg.check()
    return {cell: plan(harvest_config(cfg, cell), profile=True) for cell in cfg.cells()}


def _middle_moments(acc: profile.Accumulator, layer: int):
    """The headline's plug-in Sigma and the activations' mean and covariance at `layer`
    (outliers left out), before the estimates free the sums; None if not measured."""
    sums = acc.sums.get(layer)
    if sums is None or HEADLINE not in sums or "activations" not in sums:
        return None
    acts = sums["activations"]
    assert acts.x is not None  # the activations' sums are centred
    mu = acts.x.double().sum(0) / float(acts.n.sum())
    return sums[HEADLINE].matrix().cpu(), mu.cpu(), acts.matrix().cpu()


class _BothRules:
    """The eval pass's rows to one profile accumulator per outlier rule."""

    def __init__(self, accs: dict[str, profile.Accumulator]):
        self.accs = accs
        self.layers = next(iter(accs.values())).layers

    @property
    def wants_forward(self) -> bool:
        return any(acc.wants_forward for acc in self.accs.values())

    def add(self, layer, rows) -> None:
        for acc in self.accs.values():
            acc.add(layer, rows)

    def add_forward(self, layer, rows) -> None:
        for acc in self.accs.values():
            acc.add_forward(layer, rows)

    def forward_done(self) -> None:
        for acc in self.accs.values():
            acc.forward_done()


def run_cell(cfg: AtlasConfig, cell: Cell, the_plan, progress: bool) -> dict:
    """One cell: its pass, every layer under both rules, as cells/NAME.json holds it."""
    c = the_plan.config
    planned = estimate(cfg, the_plan)
    t0 = time.perf_counter()
    device = torch.device(c.device)
    in_use = reset_peak(device)
    readings = profile.profile_readings(c.logit_probes, c.fisher_probes)
    n_head = extension_sequences(the_plan)  # sequences the headline pass adds
    accs = {
        rule: profile.Accumulator(
            cfg.layers(the_plan.source.n_layers),
            the_plan.source.d_model,
            len(the_plan.splits.eval),
            c.seq_len,
            cfg.profile_blocks,
            readings,
            include,
            c.device,
            n_head,
            TWINS,
        )
        for rule, include in RULES.items()
    }
    # no store folders: the passes only feed the accumulators (nothing of them is reused)
    passing = the_plan._replace(keys={}, store_dirs={})
    parts = {}  # seconds of each part: the corrections' share is what to keep small
    t = time.perf_counter()
    done = harvest(c, progress, passing, observer=_BothRules(accs))
    # no store to reuse: the pass ran, so it hands back its model and norms
    assert done.lm is not None and done.median_norms is not None
    parts["pass"] = time.perf_counter() - t
    t = time.perf_counter()
    if n_head:  # the headline pass, on the same thresholds
        headline = round_plan(the_plan, 0, n_head)
        harvest(
            c,
            progress,
            headline._replace(keys={}, store_dirs={}),
            observer=_BothRules(accs),
            eval_round=len(the_plan.splits.eval),
            lm=done.lm,
            median_norms=done.median_norms,
        )
    parts["headline_pass"] = time.perf_counter() - t
    middle = depth_layer(MIDDLE_DEPTH, the_plan.source.n_layers)
    at_middle = _middle_moments(accs["left out"], middle)
    t = time.perf_counter()
    analysis = AnalysisConfig(profile=True, profile_blocks=cfg.profile_blocks)
    probes = {"logits": c.logit_probes, "fisher": c.fisher_probes}
    layers: dict = {}
    for rule, acc in accs.items():
        found = profile.estimates(acc, analysis, cfg.seed, probes, progress)
        for layer, by_reading in profile.profile_results(found, acc, 0)["layers"].items():
            layers.setdefault(layer, {})[rule] = by_reading
    parts["estimates"] = time.perf_counter() - t
    t = time.perf_counter()
    lad = None
    if at_middle is not None and cfg.ladder_sequences:
        e = layers[str(middle)]["left out"][HEADLINE]
        eranks = {"raw": e["erank_corrected"], "act": e["activation_weighted"]["erank_corrected"]}
        lad = ladder_at(
            done.lm,
            middle,
            *at_middle,
            c.outlier_factor * done.median_norms[middle],
            the_plan.splits.train[: cfg.ladder_sequences],  # planned, never harvested
            eranks,
            HEADLINE,
            cfg.seed,
        )
    parts["ladder"] = time.perf_counter() - t
    weights = predictors(done.lm)
    return {
        "cell": cell._asdict(),
        "key": the_plan.key,
        "model": {
            "n_layers": the_plan.source.n_layers,
            "d_model": the_plan.source.d_model,
            "family": the_plan.source.family,
        },
        "corpus": the_plan.corpus.id,
        "eval_tokens": len(the_plan.splits.eval) * c.seq_len,
        "headline_tokens": n_head * c.seq_len,
        "measured_layers": list(cfg.layers(the_plan.source.n_layers)),
        "metrics": METRICS,
        "twins": list(TWINS),
        "weights": weights,  # what the weights alone predict (measures/weights.py)
        "ladder": lad,  # the middle layer's directions that matter, by intervention
        "layers": layers,
        "seconds": time.perf_counter() - t0,
        "seconds_parts": parts,
        # beside the plan made at the cell's start, for the dry run's honesty
        "memory": {"in_use_before": in_use, "peak": peak_bytes(device)},
        "planned": {"seconds": planned.seconds, "memory_bytes": planned.memory_bytes},
    }


def run(cfg: AtlasConfig, progress: bool = True, checked: dict | None = None) -> list[dict]:
    """Every cell (or those begun within --max-minutes), the finished ones read back (same
    key) instead of measured again; checked: the cells' plans, where the caller has made
    them."""
    checked = checked or plans(cfg)
    folder = Path(cfg.out) / "cells"
    folder.mkdir(parents=True, exist_ok=True)
    done, t0 = [], time.perf_counter()
    for i, (cell, the_plan) in enumerate(checked.items(), 1):
        path = folder / f"{cell.name}.json"
        if path.is_file():
            found = read_sealed_json(path, "atlas cell")
            if found.get("key") == the_plan.key and _holds(found, cfg, the_plan):
                done.append(found)
                continue
        if cfg.max_minutes is not None and time.perf_counter() - t0 >= 60 * cfg.max_minutes:
            continue  # past the budget: left for the next run of the same command
        if progress:
            print(f"atlas: cell {i} of {len(checked)}: {cell.name}", file=sys.stderr)
        found = run_cell(cfg, cell, the_plan, progress)
        write_sealed_json(path, found)
        done.append(found)
    return done


def _holds(found: dict, cfg: AtlasConfig, the_plan) -> bool:
    """Whether a finished cell measured every layer this atlas asks of it."""
    wanted = set(cfg.layers(the_plan.source.n_layers))
    return wanted <= {int(i) for i in found["layers"]} and found.get("metrics") == METRICS


def command(cfg: AtlasConfig) -> str:
    """The command line that makes this atlas."""
    import shlex

    parts = ["causaldim", "atlas"]
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if value is None or value == []:
            continue
        parts += [
            f"--{f.name.replace('_', '-')}",
            *map(str, value if isinstance(value, list) else [value]),
        ]
    return shlex.join(parts)


def write(cfg: AtlasConfig, cells: list[dict], command: str) -> list[Path]:
    """atlas.json (the cells), atlas.csv, atlas.png and atlas.md under OUT."""
    from .report import atlas as report

    out = Path(cfg.out)
    saved = {"config": cfg.to_dict(), "command": command, "cells": cells}
    write_sealed_json(out / "atlas.json", saved)
    table = report.rows(cells)
    paths = [
        out / "atlas.json",
        report.write_csv(table, out / "atlas.csv"),
        report.figure(table, out / "atlas.png"),
    ]
    (out / "atlas.md").write_text(markdown_of(saved))
    return [*paths, out / "atlas.md"]


def markdown_of(saved: dict) -> str:
    """atlas.md from what atlas.json holds: its grid, command and cells."""
    from .report import atlas as report
    from .report import atlas_md

    cfg, cells = AtlasConfig(**saved["config"]), saved["cells"]
    measured = {Cell(**c["cell"]) for c in cells}
    missing = [cell.name for cell in cfg.cells() if cell not in measured]
    return atlas_md.markdown(saved["config"], cells, report.rows(cells), saved["command"], missing)


class CellCost(NamedTuple):
    seconds: float
    pass_bytes: int  # the model pass, its weights included
    sums_bytes: int  # the profile sums of both rules
    # Loading holds the weights a second time for a moment, and the process keeps that
    # memory: a SmolLM2 cell peaked 0.18 GiB above the pass and the sums (weights 0.5 GiB)
    load_bytes: int

    @property
    def memory_bytes(self) -> int:
        return self.pass_bytes + self.sums_bytes + self.load_bytes


def estimate(cfg: AtlasConfig, the_plan) -> CellCost:
    """A cell's time and peak memory as planned (speeds measured here, now)."""
    from .costs import estimate as plan_costs
    from .sweep_config import SweepConfig

    analysis = AnalysisConfig(profile=True, profile_blocks=cfg.profile_blocks)
    est = plan_costs(
        the_plan,
        SweepConfig(widths=[16], sae_dtype="float32"),
        analysis,
        profile_layers=cfg.layers(the_plan.source.n_layers),
    )
    sec, mem = est["seconds"], est["memory"]
    seconds = (
        sec["start"]
        + sec["harvest_eval"]
        + sec["harvest_headline"]
        + len(RULES) * sec["profile"]
        + sec.get("convert_gguf_once", 0.0)
    )
    return CellCost(
        seconds,
        mem["model_pass_bytes"],
        len(RULES) * mem["profile_sums_bytes"],
        mem["model_weights_bytes"],
    )


def dry_run(cfg: AtlasConfig) -> None:
    """Each cell's plan: tokens, memory of its sums and pass, and time, measured here."""
    total = 0.0
    for cell, the_plan in plans(cfg).items():
        cost = estimate(cfg, the_plan)
        total += cost.seconds
        print(
            f"cell {cell.name}: {len(the_plan.splits.eval) * the_plan.config.seq_len:,} eval "
            f"tokens (and {extension_sequences(the_plan) * the_plan.config.seq_len:,} for the "
            f"headline reading alone), {len(cfg.layers(the_plan.source.n_layers))} of "
            f"{the_plan.source.n_layers} layers; memory "
            f"{cost.memory_bytes / 2**30:,.1f} GiB (the pass {cost.pass_bytes / 2**30:,.1f}, "
            f"the sums of both rules {cost.sums_bytes / 2**30:,.1f}, loading the weights "
            f"{cost.load_bytes / 2**30:,.1f}); about "
            f"{cost.seconds / 60:,.1f} min"
        )
    print(f"atlas: {len(cfg.cells())} cells, about {total / 60:,.0f} min in all; nothing written")
