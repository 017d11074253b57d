"""Comparing finished runs (layers, models, seeds, corpora, SAE architectures) in one report:
compare.json holds what every number and figure of the comparison is drawn from, taken
from the runs' results.json alone; compare.md, compare.html and figures/compare_*.png are
rendered from compare.json."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .. import __version__
from ..errors import UsageError
from ..fileio import atomic_write_bytes, read_sealed_json, sha256_file, write_sealed_json
from ..fmt import ci, ci_of, growth, num
from ..measures.sigma import DEFINITIONS, DIRECT, HEADLINE
from ..progress import bar
from .compare_figures import figure_plan
from .direct import below_floor, flagged
from .doc import Doc
from .results import SCHEMA, load_results

COMPARE_SCHEMA = "causaldim.compare/1"
FIGURES = {
    "kappa": "figures/compare_kappa.png",
    "profile": "figures/compare_profile.png",
    "wedge": "figures/compare_wedge.png",
    "atp": "figures/compare_atp.png",
}
OWN = {"compare.json", "compare.md", "compare.html", *FIGURES.values()}

# What identifies a run, in the order its label names the fields that differ.
IDENTITY = ("model", "corpus", "layer", "architecture", "sae_source", "seed")
# Settings that the identity already shows, or that say where a run was written.
NOT_COMPARED = {
    "harvest.out",
    "harvest.repair",
    "harvest.seed",
    "harvest.layer",
    "harvest.model",
    "harvest.corpus",
    "sweep.sae_paths",
}


def compare(runs: list[Path | str], out: Path | str, progress: bool = False) -> list[Path]:
    """compare.json, compare.md, compare.html and the figures of a comparison of finished
    runs (their folders or their results.json) in out; returns the paths written. Every
    input is checked before anything is written."""
    paths = results_paths(runs)
    results = read_runs(paths)
    out = check_out(Path(out), paths)
    data = build_comparison(results, paths)
    return write_comparison(data, out, progress)


def results_paths(runs: list[Path | str]) -> list[Path]:
    """Each RUN's results.json, or a one-line UsageError."""
    if len(runs) < 2:
        raise UsageError(
            f"compare needs at least 2 runs, got {len(runs)}; pass the folders (or results.json) "
            "of the runs to compare"
        )
    paths = []
    for run in map(Path, runs):
        path = run / "results.json" if run.is_dir() else run
        if path.is_file() and path.name != "results.json":
            load_results(path)  # says what the file is: not a results file, or damaged
        if not path.is_file():
            raise UsageError(
                f"{run} has no results.json; pass a finished run's folder (its --out) or its "
                "results.json"
            )
        paths.append(path.resolve())
    seen: dict[Path, str] = {}
    for run, path in zip(runs, paths, strict=True):
        if path in seen:
            raise UsageError(f"{run} and {seen[path]} are the same run; pass each run once")
        seen[path] = str(run)
    return paths


def _schema_number(schema) -> int:
    found = re.fullmatch(r"causaldim\.results/(\d+)", str(schema))
    return int(found.group(1)) if found else -1


def read_runs(paths: list[Path]) -> list[dict]:
    """Every run's results, refused in one line where their schemas differ (naming both)
    or where this causaldim cannot read them."""
    schemas = []
    for path in paths:
        raw = read_sealed_json(path, "results (causaldim run with the same --out)")
        schemas.append(raw.get("schema") or "none (an older causaldim)")
    if len(set(schemas)) > 1:
        first = {}  # each schema's first run, the oldest schema first
        for schema, path in zip(schemas, paths, strict=True):
            first.setdefault(schema, path)
        (older, older_path), *_, (newer, newer_path) = sorted(
            first.items(), key=lambda kv: _schema_number(kv[0])
        )
        raise UsageError(
            f"the runs' results.json schemas differ: {older_path} has {older}, {newer_path} "
            f"has {newer}; re-run or re-render the older one with the same causaldim as the "
            f"other (this one reads {SCHEMA}; `causaldim run` with the run's same --out "
            "reuses its store and SAEs)"
        )
    return [load_results(path) for path in paths]


def check_out(out: Path, paths: list[Path]) -> Path:
    """The comparison's folder: neither a run's folder nor one holding anything but an
    earlier comparison's own files (which alone are overwritten)."""
    resolved = out.resolve()
    for path in paths:
        if resolved == path.parent:
            raise UsageError(
                f"--out {out} is the folder of the run {path.parent}; pass a new folder for the "
                "comparison"
            )
    if resolved.exists() and not resolved.is_dir():
        raise UsageError(f"--out {out} is a file; pass a folder for the comparison")
    if resolved.is_dir():
        foreign = sorted(
            p.relative_to(resolved).as_posix()
            for p in resolved.rglob("*")
            if not p.is_dir() and p.relative_to(resolved).as_posix() not in OWN
        )
        if foreign:
            raise UsageError(
                f"--out {out} holds files that are not a comparison ({foreign[0]}"
                f"{f' and {len(foreign) - 1} more' if len(foreign) > 1 else ''}); pass a new "
                "or empty folder, or an earlier comparison's"
            )
    return resolved


# ---------------------------------------------------------------------------------------
# compare.json


def _short_corpus(corpus_id: str) -> str:
    return Path(corpus_id[5:]).name if corpus_id.startswith("path:") else corpus_id


def _sae_source(results: dict) -> str:
    return "files" if results["config"]["sweep"].get("sae_paths") else "trained"


def _flat(config: dict) -> dict:
    return {
        f"{block}.{key}": value
        for block, values in config.items()
        for key, value in values.items()
        if f"{block}.{key}" not in NOT_COMPARED
    }


def run_entry(results: dict, path: Path) -> dict:
    """What the comparison keeps of one run: its identity, the direct eranks, the headline
    sweep's kappa_hat, wedge, epsilon and AtP histograms, and the profile if any."""
    store = results["store"]
    n_layers, layer = store["model"]["n_layers"], store["layer"]
    arch = results["headline"]["architecture"]
    a = results["sweep"][arch]
    free = a["kappa"]["free"]
    depth = (lambda i: i / (n_layers - 1)) if n_layers > 1 else (lambda i: 0.0)
    keep = (
        "erank_corrected",
        "erank_corrected_95",
        "erank",
        "participation_ratio_unbiased",
        "participation_ratio_unbiased_95",
        "n_eff",
        "n_independent",
        "converged",
        "eval_tokens_needed",
        "common_mode_share",
        "warning",
    )
    prof = results.get("profile")
    profile = None
    if prof:
        profile = {
            "run_layer": prof["run_layer"],
            "layers": [
                {
                    "layer": int(i),
                    "relative_depth": depth(int(i)),
                    "readings": {
                        r: {
                            k: row[r].get(k)
                            for k in ("erank_corrected", "erank_corrected_95", "converged")
                        }
                        for r in DIRECT
                        if r in row
                    },
                }
                for i, row in sorted(prof["layers"].items(), key=lambda kv: int(kv[0]))
            ],
        }
    return {
        "path": str(path),
        "results_sha256": sha256_file(path),
        "schema": results["schema"],
        "causaldim_version": results["causaldim_version"],
        "preset": results["preset"],
        "model": results["inputs"]["model"]["name"],
        "d_model": store["model"]["d_model"],
        "n_layers": n_layers,
        "layer": layer,
        "relative_depth": depth(layer),
        "seed": results["seed"],
        "corpus": results["inputs"]["corpus"]["id"],
        "architecture": arch,
        "architectures": list(results["sweep"]),
        "sae_source": _sae_source(results),
        "warnings": list(results.get("warnings") or []),
        "sae_paths": list(results["config"]["sweep"].get("sae_paths") or []),
        "config": _flat(results["config"]),
        "sigma": {
            r: _as_printed(results["sigma"][r], keep) for r in DIRECT if r in results["sigma"]
        },
        "kappa_hat": {
            "estimable": a["estimable"],
            "not_estimable": a["not_estimable"],
            "form": free["form"],
            "kappa": free["kappa"] if a["estimable"] else None,
            "interval_95": free["interval_95"] if a["estimable"] else None,
            "kappa_over_d": free["kappa_over_d"] if a["estimable"] else None,
        },
        "wedge": {
            **a["wedge"],
            "points": [
                {
                    "width": r["width"],
                    "n_repr": r["n_repr"],
                    "n_repr_95": r.get("n_repr_95"),
                    "n_causal": r["n_causal"],
                    "n_causal_95": r.get("n_causal_95"),
                }
                for r in a["per_width"]
            ],
        },
        "epsilon": a["epsilon"],
        "epsilon_95": a["epsilon_95"],
        "percentile": a["percentile"],
        "reference_width": a["reference_width"],
        "normalisation": a["normalisation"],
        # log10(AtP / epsilon), binned by the run itself: the data of its own AtP figure
        "atp_histograms": [{"width": r["width"], **r["atp_histogram"]} for r in a["per_width"]],
        "profile": profile,
    }


def _as_printed(est: dict, keep: tuple[str, ...]) -> dict:
    """A reading as its run prints it: below the floor of independent equivalents the run
    gives no corrected value (n/a), and neither does the comparison."""
    kept = {k: est.get(k) for k in keep}
    kept["below_floor"] = below_floor(est)
    if kept["below_floor"]:
        kept.update(erank_corrected=None, erank_corrected_95=None)
    return kept


def _show(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def labels(entries: list[dict]) -> list[str]:
    """A short label per run: its folder's name (what differs is tabulated beside it),
    numbered where two folders share a name."""
    folders = [Path(e["path"]).parent.name or f"run {i + 1}" for i, e in enumerate(entries)]
    if len(set(folders)) == len(folders):
        return folders
    return [f"{f} #{i + 1}" for i, f in enumerate(folders)]


def build_comparison(results: list[dict], paths: list[Path]) -> dict:
    """compare.json: per run what the comparison shows, its label, and which fields differ."""
    entries = [run_entry(r, p) for r, p in zip(results, paths, strict=True)]
    differ = [f for f in IDENTITY if len({_show(e[f]) for e in entries}) > 1]
    keys = sorted({k for e in entries for k in e["config"]})
    config_differ = [k for k in keys if len({_show(e["config"].get(k)) for e in entries}) > 1]
    for entry, label in zip(entries, labels(entries), strict=True):
        entry["label"] = label
    models_differ = len({(e["model"], e["n_layers"], e["d_model"]) for e in entries}) > 1
    return {
        "schema": COMPARE_SCHEMA,
        "causaldim_version": __version__,
        "results_schema": SCHEMA,
        "differ": differ,
        "config_differ": {k: [e["config"].get(k) for e in entries] for k in config_differ},
        "same": {f: entries[0][f] for f in IDENTITY if f not in differ},
        "models_differ": models_differ,
        "profile_x": "relative_depth" if models_differ else "layer",
        "readings": [r for r in DIRECT if any(r in e["sigma"] for e in entries)],
        "runs": [{"label": e.pop("label"), **e} for e in entries],
    }


# ---------------------------------------------------------------------------------------
# Figures, from compare.json alone


# ---------------------------------------------------------------------------------------
# The text, from compare.json alone

FIELD_NAMES = {
    "model": "model",
    "corpus": "corpus",
    "layer": "layer",
    "architecture": "SAE architecture",
    "sae_source": "SAE source",
    "seed": "seed",
}


def with_interval(value, interval) -> str:
    """A value and its 95% interval at one precision: whole numbers from 100 up."""
    return f"{num(value)} {ci(interval, 0 if value is not None and abs(value) >= 100 else 1)}"


def _kappa_hat(k: dict) -> str:
    return with_interval(k["kappa"], k["interval_95"]) if k["estimable"] else "not estimable"


def _printed(est: dict | None) -> str:
    """A reading's cell, as its run prints it."""
    if not est:
        return "n/a (not measured)"
    if est.get("below_floor"):
        return "n/a (below the floor)"
    if est.get("erank_corrected") is None:
        return "n/a"
    return flagged(est)


def build_doc(data: dict, figures: dict[str, Path]) -> Doc:
    runs, readings = data["runs"], data["readings"]
    doc = Doc()
    doc.h(1, f"Comparison of {len(runs)} causaldim runs")
    differ = [FIELD_NAMES[f] for f in data["differ"]] + list(data["config_differ"])
    same = [f"{FIELD_NAMES[f]} {_show(v)}" for f, v in data["same"].items()]
    doc.p(
        f"The runs differ in: {', '.join(differ) or 'nothing that results.json records'}. "
        + (f"The same in all: {', '.join(same)}. " if same else "")
        + "Labels name what differs. Every number here is read from the runs' results.json "
        "(schema " + data["results_schema"] + ") through compare.json."
    )
    doc.h(2, "The runs")
    # only what differs gets a column: what all share is said above the table
    shown = [f for f in IDENTITY if f in data["differ"] and f != "sae_source"]
    if "sae_source" in data["differ"] and "architecture" not in shown:
        shown.append("architecture")
    cells = {
        "model": lambda run: run["model"],
        "corpus": lambda run: _short_corpus(run["corpus"]),
        "layer": lambda run: f"{run['layer']} of {run['n_layers']} ({run['relative_depth']:.2f})",
        "architecture": lambda run: f"{run['architecture']} ({run['sae_source']})",
        "seed": lambda run: run["seed"],
    }
    names = {"layer": "layer (depth)", "architecture": "SAE"}
    head = ["run", *(names.get(f, f) for f in shown), "d"]
    head += [
        ("direct kappa (logits)" if r == HEADLINE else f"erank {r}") + " [95%]" for r in readings
    ]
    head += ["kappa_hat [95%]", "N_causal growth [95%]", "N_repr growth", "epsilon"]
    rows = []
    for run in runs:
        row = [run["label"], *(cells[f](run) for f in shown), run["d_model"]]
        for r in readings:
            est = run["sigma"].get(r)
            row.append(_printed(est))
        w = run["wedge"]
        row += [
            _kappa_hat(run["kappa_hat"]),
            f"{growth(w['n_causal_growth'])} "
            f"{ci_of(w['n_causal_growth'], w.get('n_causal_growth_95'), 2)} over "
            f"x{w['width_ratio']:g}",
            growth(w["n_repr_growth"]),
            f"{run['epsilon']:.3g}",
        ]
        rows.append(row)
    doc.table(head, rows)
    doc.p(
        f"Direct kappa: {DEFINITIONS[HEADLINE]}, the gauge-invariant logits reading; beside "
        "it the corrected erank of each other reading by name (95%: jackknife over sequences, "
        "simulation and remaining drift; a value that has not converged says so; n/a (below "
        "the floor): under 1 independent equivalent per dimension, where the run gives no "
        "corrected value); "
        "kappa_hat: the free saturating fit of the headline sweep's N_causal; "
        "depth: layer / (n_layers - 1). Columns only for what differs between the runs."
    )
    doc.ul(
        [
            f"{r['label']}: kappa_hat not estimable: {r['kappa_hat']['not_estimable']}"
            for r in runs
            if not r["kappa_hat"]["estimable"]
        ]
    )
    warned = [r for r in runs if r.get("warnings")]
    if warned:
        doc.h(2, "Read with care")
        for r in warned:
            doc.p(f"{r['label']} ({len(r['warnings'])}):")
            doc.ul([f"{w['message']} (`{w['code']}`)" for w in r["warnings"]])
    if data["config_differ"]:
        doc.h(2, "Settings that differ")
        doc.table(
            ["setting", *(r["label"] for r in runs)],
            [[k, *map(_show, v)] for k, v in data["config_differ"].items()],
        )
    doc.h(2, "Corrected eranks")
    doc.img(figures["kappa"], "compare_kappa")
    doc.h(2, "The wedges")
    doc.img(figures["wedge"], "compare_wedge")
    doc.h(2, "AtP distributions")
    doc.p("Each run's AtP histogram in units of its own epsilon (the data of its atp figure).")
    doc.img(figures["atp"], "compare_atp")
    doc.h(2, "Profiles over depth")
    with_profile = [r["label"] for r in runs if r["profile"]]
    if not with_profile:
        doc.p("No run has a profile (run with --profile to measure every layer): nothing drawn.")
    else:
        without = [r["label"] for r in runs if not r["profile"]]
        doc.p(
            f"Runs with a profile: {', '.join(with_profile)}"
            + (f"; without (not drawn): {', '.join(without)}" if without else "")
            + "; x: "
            + (
                "layer / (n_layers - 1), as the models differ."
                if data["models_differ"]
                else "layer."
            )
        )
        doc.img(figures["profile"], "compare_profile")
    doc.h(2, "Provenance")
    doc.ul(
        [
            f"{r['label']}: {r['path']} (sha256 {r['results_sha256']}), causaldim "
            f"{r['causaldim_version']}, preset {r['preset']}"
            for r in runs
        ]
    )
    return doc


def write_comparison(data: dict, out: Path, progress: bool = False) -> list[Path]:
    """compare.json, the figures, compare.md and compare.html in out; an earlier
    comparison's figures that this one does not draw are removed."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "compare.json"]
    write_sealed_json(written[0], data)
    figures = {}
    for key, draw in bar(figure_plan(data).items(), desc="compare figures", enabled=progress):
        figures[key] = draw(data, out / FIGURES[key])
    for key, rel in FIGURES.items():
        if key not in figures:
            (out / rel).unlink(missing_ok=True)
    written += list(figures.values())
    doc = build_doc(data, figures)
    md, page = out / "compare.md", out / "compare.html"
    atomic_write_bytes(md, doc.markdown(out).encode())
    atomic_write_bytes(page, doc.html(f"causaldim: {len(data['runs'])} runs compared").encode())
    return [*written, md, page]
