"""The atlas written out: one row per cell, layer, outlier rule and reading (atlas.csv),
a figure of kappa / d against relative depth (a line per model and context length, a
panel per corpus), and atlas.md, which says from the numbers what moves kappa."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

from ..measures.sigma import HEADLINE
from .direct import below_floor

FIELDS = (
    "model",
    "corpus",
    "seq_len",
    "layer",
    "depth",
    "outliers",
    "reading",
    "kappa",
    "low",
    "high",
    "kappa_over_d",
    "converged",
    "independent_per_dim",
    "eval_tokens_needed",
    "plug_in",
)


def rows(cells: list[dict]) -> list[dict]:
    out = []
    for c in cells:
        d, n = c["model"]["d_model"], c["model"]["n_layers"]
        for layer, rules in sorted(c["layers"].items(), key=lambda kv: int(kv[0])):
            for rule, readings in rules.items():
                for reading, e in readings.items():
                    if reading == "activations":
                        continue
                    est = {**e, "samples_per_dim": e["n_samples"] / d}
                    value = None if below_floor(est) else e.get("erank_corrected")
                    lo, hi = e.get("erank_corrected_95") or (None, None)
                    lo, hi = (lo, hi) if value else (None, None)
                    out.append(
                        {
                            **c["cell"],
                            "layer": int(layer),
                            "depth": round(int(layer) / max(n - 1, 1), 4),
                            "outliers": rule,
                            "reading": reading,
                            "kappa": value,
                            "low": lo,
                            "high": hi,
                            "kappa_over_d": None if value is None else value / d,
                            "converged": e.get("converged"),
                            "independent_per_dim": (e.get("n_independent") or 0) / d,
                            "eval_tokens_needed": e.get("eval_tokens_needed"),
                            "plug_in": e.get("erank"),
                        }
                    )
    return out


def write_csv(table: list[dict], path: Path) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(table)
    return path


def _short(name: str) -> str:
    """A local path by its last part (a hub name keeps its owner)."""
    return Path(name).name if name.startswith(("/", ".", "~")) else name


def figure(table: list[dict], path: Path) -> Path:
    """kappa / d of the headline reading (outliers left out) against relative depth."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mine = [r for r in table if r["reading"] == HEADLINE and r["outliers"] == "left out"]
    corpora = sorted({r["corpus"] for r in mine})
    fig, axes = plt.subplots(1, len(corpora), figsize=(5 * len(corpora), 4), squeeze=False)
    for ax, corpus in zip(axes[0], corpora, strict=True):
        for model in sorted({r["model"] for r in mine}):
            for seq_len in sorted({r["seq_len"] for r in mine}):
                line = [
                    r
                    for r in mine
                    if (r["corpus"], r["model"], r["seq_len"]) == (corpus, model, seq_len)
                ]
                line.sort(key=lambda r: r["depth"])
                xs = [r["depth"] for r in line if r["kappa_over_d"] is not None]
                ys = [r["kappa_over_d"] for r in line if r["kappa_over_d"] is not None]
                style = "-" if seq_len == min(r["seq_len"] for r in mine) else "--"
                ax.plot(xs, ys, style, marker=".", label=f"{_short(model)}, seq {seq_len}")
        ax.axhline(0.86, color="grey", lw=0.8, ls=":", label="the paper's 0.86")
        ax.set(title=_short(corpus), ylabel="kappa / d")
        ax.set_xlabel("relative depth (layer / (layers - 1))")
        ax.set_ylim(0, 1)
        ax.set_xlim(-0.03, 1.03)  # the whole depth, also where an atlas measured a few
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _ratio_line(table: list[dict], what: str, a, b, **fixed) -> str | None:
    """The median over matching layers of kappa(what = b) / kappa(what = a)."""
    axes = ("model", "corpus", "seq_len", "layer", "outliers", "reading")

    def key(r):
        return tuple(r[k] for k in axes if k != what)

    def chosen(r):
        return all(r[k] == v for k, v in fixed.items())

    base = {key(r): r["kappa"] for r in table if r[what] == a and chosen(r)}
    ratios = [
        r["kappa"] / base[key(r)]
        for r in table
        if r[what] == b and chosen(r) and r["kappa"] and base.get(key(r))
    ]
    if not ratios:
        return None
    return (
        f"{what} {b} against {a}: kappa x{statistics.median(ratios):.2f} in the median over "
        f"{len(ratios)} layers (x{min(ratios):.2f} to x{max(ratios):.2f})"
    )


def _headline(table: list[dict]) -> list[dict]:
    return [
        r
        for r in table
        if r["reading"] == HEADLINE and r["outliers"] == "left out" and r["kappa_over_d"]
    ]


def _model_line(table: list[dict]) -> str | None:
    """kappa / d of each model, the median over its layers and cells."""
    mine = _headline(table)
    models = sorted({r["model"] for r in mine})
    if len(models) < 2:
        return None
    parts = [
        f"{_short(m)} {_median(r['kappa_over_d'] for r in mine if r['model'] == m):.2f}"
        for m in models
    ]
    return (
        f"model: kappa / d, the median over layers and cells, {', '.join(parts)} (layers "
        "below the floor left out)"
    )


def _depth_lines(table: list[dict]) -> list[str]:
    """Per model, kappa / d in each third of the depth (medians over layers and cells)."""
    mine = _headline(table)
    out = []
    for model in sorted({r["model"] for r in mine}):
        thirds = []
        for lo, hi, name in ((0, 1 / 3, "first"), (1 / 3, 2 / 3, "middle"), (2 / 3, 1.01, "last")):
            part = [
                r["kappa_over_d"] for r in mine if r["model"] == model and lo <= r["depth"] < hi
            ]
            if part:
                thirds.append(f"{name} third {_median(part):.2f}")
        if len(thirds) > 1:
            out.append(
                f"depth, {_short(model)}: kappa / d {', '.join(thirds)} (medians over the "
                "layers and cells of each third)"
            )
    return out


def markdown(
    cfg: dict, cells: list[dict], table: list[dict], command: str, missing: list[str] = ()
) -> str:
    lines = [
        "# The atlas: the direct kappa across models, text, context and depth",
        "",
        f"Made by `{command}` (causaldim atlas; cells in `cells/`, every number in "
        "`atlas.csv`). Each cell is one eval pass; every layer it measures ("
        + (f"relative depths {', '.join(map(str, cfg['depths']))}" if cfg.get("depths") else "all")
        + ") is corrected for finite samples with the profile's lighter budget; outliers "
        "(position 0 and large norms) left out and kept, from the same tokens.",
        "",
        "![kappa / d against depth](atlas.png)",
        "",
        "## Cells",
        "",
        "| model | corpus | seq | eval tokens | headline kappa / d, median over layers "
        "(range) | layers converged | minutes: planned, measured | memory GiB: planned, "
        "peak |",
        "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for c in cells:
        cell = c["cell"]
        mine = [
            r
            for r in table
            if (r["model"], r["corpus"], r["seq_len"]) == tuple(cell.values())
            and r["reading"] == HEADLINE
            and r["outliers"] == "left out"
        ]
        values = [r["kappa_over_d"] for r in mine if r["kappa_over_d"] is not None]
        said = (
            f"{statistics.median(values):.2f} ({min(values):.2f} to {max(values):.2f})"
            if values
            else "n/a (below the floor at every layer)"
        )
        converged = sum(1 for r in mine if r["converged"])
        lines.append(
            f"| {cell['model']} | {cell['corpus']} | {cell['seq_len']} | {c['eval_tokens']:,} | "
            f"{said} | {converged} of {len(mine)} | {_cost(c)} |"
        )
    if missing:
        lines += [
            "",
            f"Not yet measured ({len(missing)} of the grid's {len(cells) + len(missing)} "
            f"cells; --max-minutes ended the run before them): {', '.join(missing)}. The "
            "same command without --max-minutes measures them and keeps the rest.",
        ]
    lines += ["", "## What moves kappa (the headline reading, medians of matched ratios)", ""]
    head, out = {"reading": HEADLINE}, {"outliers": "left out"}
    found = [
        _ratio_line(table, "outliers", "left out", "kept", **head),
        *(
            _ratio_line(table, "seq_len", a, b, **head, **out)
            for a, b in zip(cfg["seq_lens"], cfg["seq_lens"][1:], strict=False)
        ),
        *(
            _ratio_line(table, "corpus", cfg["corpora"][0], other, **head, **out)
            for other in cfg["corpora"][1:]
        ),
        *(
            _ratio_line(table, "reading", HEADLINE, other, **out)
            for other in ("logits_uncentred", "loss", "fisher")
        ),
    ]
    found += [_model_line(table), *_depth_lines(table)]
    lines += [f"- {line}." for line in found if line]
    lines += [
        "",
        "## The claims it answers (the middle layer, by the claims tables' rules)",
        "",
        "| claim | compared | verdict | why |",
        "| --- | --- | --- | --- |",
        *(
            f"| {claim} | {shown} | {verdict} | {why} |".replace("\n", " ")
            for claim, shown, verdict, why in claims(cells)
        ),
    ]
    lines += [
        "",
        "Planned: the dry run's figures, made as the cell began (`causaldim atlas --dry-run` "
        "prints them). Peak: the process's resident memory above what it held before the "
        "cell, the model's weights included (n/a: a cell measured before peaks were kept).",
    ]
    unconverged = [r for r in table if r["reading"] == HEADLINE and r["converged"] is False]
    if unconverged:
        need = max(r["eval_tokens_needed"] or 0 for r in unconverged)
        lines += [
            "",
            f"Not converged: {len(unconverged)} of the headline's layer readings; about "
            f"{need:,} eval tokens a cell would do at all of them (`--eval-tokens`).",
        ]
    return "\n".join(lines) + "\n"


def _cost(cell: dict) -> str:
    """The cell's planned and measured minutes, planned and peak memory."""
    planned, memory = cell.get("planned"), cell.get("memory")
    minutes = f"{cell['seconds'] / 60:,.1f}"
    if planned is None or memory is None:
        return f"n/a, {minutes} | n/a"
    peak = (memory["peak"] - memory["in_use_before"]) / 2**30
    return (
        f"{planned['seconds'] / 60:,.1f}, {minutes} | "
        f"{planned['memory_bytes'] / 2**30:,.1f}, {peak:,.1f}"
    )


def _run_at(cell: dict, layer: str) -> tuple[str, dict]:
    """One cell's layer (outliers left out) as the claims rules read a run."""
    from ..paper import PAPER

    c = cell["cell"]
    model = cell["model"]
    est = cell["layers"][layer]["left out"]
    sigma = {
        r: {**e, "samples_per_dim": e["n_samples"] / model["d_model"]}
        for r, e in est.items()
        if r != "activations"
    }
    results = {
        "store": {
            "layer": int(layer),
            "model": {**model, "identity": {"name": c["model"], "family": model["family"]}},
        },
        "inputs": {"corpus": {"id": cell["corpus"]}, "model": {"name": c["model"]}},
        "sigma": sigma,
        "paper": PAPER,
    }
    return f"{c['model']} on {c['corpus']}, seq {c['seq_len']}", results


def _middle(cell: dict) -> str:
    """The layer at about half the depth, where the paper measured (12 of 26)."""
    from ..atlas import MIDDLE_DEPTH, depth_layer

    return str(depth_layer(MIDDLE_DEPTH, cell["model"]["n_layers"]))


def claims(cells: list[dict]) -> list[tuple[str, str, str, str]]:
    """The claims the atlas answers, each at the middle layer by the claims tables' own
    rules (cells that did not measure it left aside): (claim, what was compared, verdict,
    why)."""
    from .claims_kappa import across, level

    out = []
    cells = [c for c in cells if _middle(c) in c["layers"]]
    seqs = sorted({c["cell"]["seq_len"] for c in cells})
    for seq in seqs:
        runs = [_run_at(c, _middle(c)) for c in cells if c["cell"]["seq_len"] == seq]
        for claim in across(runs):
            key = f"{claim.key}, sequences of {seq}"
            out.append((key, claim.this_run, claim.verdict, claim.reason))
    for c in cells:
        if c["cell"]["seq_len"] == max(seqs) and c["cell"]["corpus"] != "builtin":
            name, results = _run_at(c, _middle(c))
            shown, verdict, why = level(results, HEADLINE)
            out.append((f"kappa_level (0.86 d), {name}", shown, verdict, why))
    return out
