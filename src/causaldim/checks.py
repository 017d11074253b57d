"""Every check a run makes before any weights are loaded, and the plans it then follows:
the settings against each other and the model's shape, the imported SAEs against the
model and the layer, memory and disk against the machine, and the notes the run prints
first (a corpus short of --tokens, the data a preset names, flags it will not read).
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import torch

from . import controls
from .config import AnalysisConfig, HarvestConfig
from .devices import memory, resolve_dtype
from .disk import disk_bytes
from .errors import UsageError
from .executors import executor_for
from .harvest import Plan, plan
from .measures import profile
from .measures.analysis import MIN_WIDTHS
from .memory import HEADROOM, check_sae_training, step_entries
from .model.corpus import budget_tokens
from .model.sites import NotABlockOutput, equivalents
from .presets import PRESETS, unused_settings
from .sae import releases
from .sae.formats import check_weights, describe_source, peek_d_in
from .sweep_config import SweepConfig


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
    sweep_cfg.check_reference(analysis_cfg.reference_width)
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
    reading = [c.name for c in chosen if c.reads_weights]
    if sweep_cfg.drop_weights and reading:
        raise UsageError(
            f"--drop-weights deletes the SAEs' weights once scored, and the control(s) "
            f"{', '.join(reading)} read them; drop those controls or --drop-weights"
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
            optimizer=sweep_cfg.optimizer,
            entries_per_token=step_entries(sweep_cfg.k, sweep_cfg.architectures),
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
        assert c.batch_size is not None  # resolved by plan()
        free = int(HEADROOM * memory(device)[1]) - need.weights - c.batch_size * need.per_sequence
        readings = profile.sums_per_layer(c.logit_probes, c.fisher_probes)
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
    resource(check_disk, main, sweep_cfg, analysis_cfg)
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


def check_disk(
    the_plan: Plan, sweep_cfg: SweepConfig | None, analysis_cfg: AnalysisConfig | None = None
) -> None:
    """Refuse a run whose stores, SAEs and scores (none without a sweep) would not fit on
    the output's disk."""
    missing = [i for i, d in the_plan.store_dirs.items() if not (d / "manifest.json").is_file()]
    need = disk_bytes(the_plan, sweep_cfg, analysis_cfg)
    planned = (
        need["saes"]
        + need["scores"]
        + need["checkpoint"]
        + need["store"] * len(missing) // len(the_plan.store_dirs)
    )
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
