"""`causaldim run --dry-run`: every check a run makes, then the plan, memory, disk and
time it would take, and what it would stop on; nothing written."""

from __future__ import annotations

from .checks import check
from .config import AnalysisConfig, HarvestConfig
from .costs import Rates, estimate
from .devices import planned, planning_for
from .harvest import Plan
from .harvest.plan import CHARS_PER_TOKEN
from .model.corpus import as_if_whole
from .model.sites import describe as describe_site
from .sweep_config import SweepConfig

GPU_LOW_EFFICIENCY = 0.07  # of the datasheet's peak, whole stages at the range's slow end


def dry_run(
    cfg: HarvestConfig,
    sweep_cfg: SweepConfig,
    analysis_cfg: AnalysisConfig,
    preset: str,
    plan_for: str | None = None,
) -> None:
    """Print the plan for this machine, or for the GPU named by plan_for
    (devices.PROFILES), its notes, and what here would stop a run."""
    with planning_for(plan_for) as profile:
        plans = check(cfg, sweep_cfg, analysis_cfg, dry_run=True, preset=preset)
        if profile is not None:
            print(
                f"planned for {profile.name}, not this machine: its memory "
                f"({profile.memory_bytes / 2**30:,.0f} GiB) and matmul speed as stated "
                "(causaldim.devices.PROFILES)"
            )
        print_plan(plans.main, plans.sweep, analysis_cfg, plans.imports)
    for _, note in plans.notes:
        print(f"note: {note}")
    for reason in plans.would_stop:
        print(f"here, a run would stop: {reason}")
    print("dry run: nothing written")


def print_plan(
    the_plan: Plan, sweep_cfg: SweepConfig, analysis_cfg: AnalysisConfig, imports: list[dict]
) -> None:
    """The plan's lines: model and corpus, tokens, the layer's names, stores, SAEs, the
    widest SAE's firings, device and memory, disk and time."""
    est = estimate(the_plan, sweep_cfg, analysis_cfg)
    s, cfg = the_plan.source, the_plan.config
    reused = (the_plan.store_dir / "manifest.json").is_file()
    print(
        f"model {cfg.model} ({s.family}, {s.n_layers} layers, d={s.d_model}), layer "
        f"{the_plan.layer}; corpus {the_plan.corpus.label}"
    )
    if s.kind == "known-shape":
        print(
            f"the Hugging Face Hub cannot be reached: {cfg.model} is planned from its known "
            f"shape, and its tokens from the corpus's characters (about "
            f"{CHARS_PER_TOKEN} a token); a run needs the hub or the model in the HF cache"
        )
    print(
        f"tokens: {est['tokens']['train']:,} train, {est['tokens']['eval']:,} eval "
        f"(every reading, AtP and CE), {est['tokens']['headline']:,} more eval for the "
        f"headline reading alone (--headline-tokens, a pass without the head), in "
        f"sequences of {cfg.seq_len}; probes: {cfg.logit_probes} logits, "
        f"{cfg.fisher_probes} fisher"
    )
    print(f"layer {the_plan.layer} is {describe_site(the_plan.layer)}")
    print(f"store: {the_plan.store_dir}{' (exists: would be reused)' if reused else ''}")
    if len(the_plan.store_dirs) > 1:
        print(
            f"depth: layers {', '.join(map(str, the_plan.store_dirs))} in the same pass, each "
            "with its own store and sweep (their stages are the estimate's control.depth)"
        )
    if imports:  # their widths make the sweep; the estimates below still use --widths
        names = "; ".join(f"{i.get('id') or i['path']} ({i['site']})" for i in imports)
        print(f"SAEs: {len(imports)} imported, none trained: {names}")
    else:
        print(
            f"SAEs: {', '.join(sweep_cfg.architectures)} at widths "
            f"{' '.join(map(str, sweep_cfg.widths))}, k={sweep_cfg.k}, {sweep_cfg.epochs} "
            f"epoch(s); epsilon at the {analysis_cfg.percentile:g}th percentile of width "
            f"{analysis_cfg.reference_width or sweep_cfg.widths[0]}; "
            f"{analysis_cfg.bootstrap} bootstrap resamples"
        )
    widest, n_train, n_eval = max(sweep_cfg.widths), est["tokens"]["train"], est["tokens"]["eval"]
    print(
        f"the widest SAE ({widest:,}): each feature fires about "
        f"{sweep_cfg.k * n_train * sweep_cfg.epochs / widest:,.0f} times in training "
        f"(k x tokens x epochs / width; the median feature fewer) and "
        f"{sweep_cfg.k * n_eval / widest:,.0f} times in eval, on average"
    )
    mem, gib = est["memory"], 2**30
    print(f"device: {mem['device']}; model {cfg.dtype}, SAE encoder product {sweep_cfg.sae_dtype}")
    print(
        f"memory, estimated: model pass {mem['model_weights_bytes'] / gib:,.2f} GiB of weights + "
        f"{mem['model_bytes_per_sequence'] / gib:,.2f} GiB per sequence x batch "
        f"{mem['model_batch_size']} = {mem['model_pass_bytes'] / gib:,.2f} GiB (usable: "
        f"{mem['usable_bytes'] / gib:,.1f} GiB); training the widest SAE "
        f"{mem['widest_sae_training_bytes'] / gib:,.2f} GiB ({mem['sae_optimizer']} "
        "optimiser); scoring it "
        f"{mem['widest_sae_score_tokens']:,} tokens at a time"
    )
    if analysis_cfg.profile:
        print(
            f"profile: every one of the {s.n_layers} layers from the eval pass (its backward "
            f"on down to block 0), {mem['profile_sums_bytes'] / gib:,.2f} GiB of sums"
        )
    disk = est["disk_bytes"]
    print(
        f"disk: store {disk['store'] / 1e6:,.0f} MB, SAEs {disk['saes'] / 1e6:,.0f} MB "
        f"({sweep_cfg.save_dtype} weights, --save-dtype; {drop_text(disk, sweep_cfg)}), "
        f"their scores and digests {disk['scores'] / 1e6:,.0f} MB, {checkpoint_text(disk)}, "
        f"total {disk['total'] / 1e9:,.2f} GB"
    )
    sec = est["seconds"]
    stages = ", ".join(f"{k} {v:,.0f}" for k, v in sec.items() if k != "total")
    r = est["rates"]
    print(
        f"time, rough (work / speed {r['source']}: model products "
        f"{r['model'] / 1e9:,.0f} GFLOP/s, SAE encoder {r['sae'] / 1e9:,.0f} GFLOP/s, "
        f"{r['eig'] * 1e3:,.1f} ms an eigendecomposition): about {sec['total'] / 60:,.1f} "
        f"min ({stages} s){'; the store would be reused' if reused else ''}"
    )
    if cfg.until_converged:
        pool = the_plan.splits.n_rest
        most = min(cfg.max_eval_tokens, (len(the_plan.splits.eval) + pool) * cfg.seq_len)
        n_head = est["tokens"]["headline"]
        # rounds are harvested by the headline pass, like the --headline-tokens extension
        per_token = (
            sec["harvest_headline"] / n_head
            if n_head
            else sec.get("harvest_eval", 0) / max(n_eval, 1)
        )
        print(
            f"until converged: eval rounds beyond --tokens, up to {most:,} eval tokens in all "
            f"(--max-eval-tokens {cfg.max_eval_tokens:,}; the corpus has "
            f"{pool * cfg.seq_len:,} more), at most about "
            f"{max(0, most - n_eval - n_head) * per_token / 60:,.0f} min more; how many the "
            "headline needs "
            "is known only from the run's own eval split"
        )
    if planned():
        # the estimate runs the work at 70% of the datasheet's dense peak; whole stages of a
        # model this size (small matmuls, eigendecompositions, attention, data movement)
        # reach far less: the range's slow end takes them at GPU_LOW_EFFICIENCY of the peak
        slow = sec["total"] * 0.7 / GPU_LOW_EFFICIENCY
        print(
            f"  on the planned GPU, not timed: between {sec['total'] / 60:,.1f} min (the "
            f"work's FLOPs at 70% of the datasheet's dense peak) and {slow / 60:,.1f} min (at "
            f"{100 * GPU_LOW_EFFICIENCY:.0f}%, what whole stages of a small model may reach); "
            "book the slow end"
        )
    if (n_train + n_eval) < cfg.tokens - cfg.seq_len:
        print_whole(the_plan, sweep_cfg, analysis_cfg, est["rates"])


def print_whole(the_plan: Plan, sweep_cfg, analysis_cfg, rates: dict) -> None:
    """Time and disk for the --tokens the corpus is short of (a hub corpus would give
    them), at the same speeds; memory does not grow with tokens."""
    cfg = the_plan.config
    whole = the_plan._replace(splits=as_if_whole(the_plan.splits, cfg.tokens, cfg.eval_fraction))
    est = estimate(whole, sweep_cfg, analysis_cfg, Rates(**rates))
    sec, disk = est["seconds"], est["disk_bytes"]
    slowest = sorted((v, k) for k, v in sec.items() if k != "total")[-3:][::-1]
    stages = ", ".join(f"{k} {v / 60:,.0f}" for v, k in slowest)
    gb = {k: f"{v / 1e9:,.1f} GB" for k, v in disk.items()}
    print(
        f"with all {cfg.tokens:,} tokens --tokens asks (a hub --corpus gives them; this "
        f"corpus is short): {est['tokens']['train']:,} train, {est['tokens']['eval']:,} eval; "
        f"time about {sec['total'] / 3600:,.1f} h ({stages} min, the longest stages); disk: "
        f"store {gb['store']}, SAEs {gb['saes']} ({gb['saes_other']} "
        f"{'without' if sweep_cfg.drop_weights else 'with'} --drop-weights), scores "
        f"{gb['scores']}, training checkpoint {gb['checkpoint']}, total {gb['total']}; "
        "memory as above"
    )


def drop_text(disk: dict, sweep_cfg) -> str:
    """What --drop-weights does to the SAEs' disk, either way."""
    if sweep_cfg.drop_weights:
        return (
            "--drop-weights: the reference and one width at a time; "
            f"{disk['saes_other'] / 1e6:,.0f} MB kept"
        )
    return f"{disk['saes_other'] / 1e6:,.0f} MB with --drop-weights"


def checkpoint_text(disk: dict) -> str:
    if not disk["checkpoint"]:
        return "no training checkpoint"
    return (
        f"the widest's training checkpoint {disk['checkpoint'] / 1e6:,.0f} MB while it "
        "trains (two copies at a save; --checkpoint-steps 0: none)"
    )
