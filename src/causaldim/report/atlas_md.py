"""atlas.md: the cells, what moves kappa in each metric (medians of matched ratios), what
the weights predict, which directions matter at the middle layer, and the claims the
atlas answers, every number from the cells (atlas.json) and their rows (atlas.csv)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from ..claims.atlas import atlas_claims
from ..claims.conditions import kappa_intervals
from ..measures.sigma import HEADLINE
from .atlas import METRICS, short
from .metric import log_correlation

WHICH_METRIC = (
    "The paper's definition of kappa is the raw one: an erank in the residual's own "
    "coordinates, directions per unit of Euclidean change. Beside it, the "
    "activation-weighted kappa_act = erank(C^1/2 Sigma C^1/2), C the activations' "
    "covariance: directions of the representation's own fluctuation that move the output, "
    "which no linear map of the residual changes. Each is measured at every layer from "
    "the same samples; a model name ending :permuted or :init is a null (an untrained "
    "network of the same shape: every parameter shuffled within itself, or freshly "
    "initialised)."
)


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _ratio_line(table: list[dict], what: str, a, b, **fixed) -> str | None:
    """The median over matching layers of kappa(what = b) / kappa(what = a)."""
    axes = ("model", "corpus", "seq_len", "layer", "outliers", "reading", "metric")

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


def _headline(table: list[dict], metric: str = "raw") -> list[dict]:
    return [
        r
        for r in table
        if r["reading"] == HEADLINE
        and r["metric"] == metric
        and r["outliers"] == "left out"
        and r["kappa_over_d"]
    ]


def _model_line(table: list[dict], metric: str) -> str | None:
    """kappa / d of each model, the median over its layers and cells."""
    mine = _headline(table, metric)
    models = sorted({r["model"] for r in mine})
    if len(models) < 2:
        return None
    parts = [
        f"{short(m)} {_median(r['kappa_over_d'] for r in mine if r['model'] == m):.2f}"
        for m in models
    ]
    return (
        f"model: kappa / d, the median over layers and cells, {', '.join(parts)} (layers "
        "below the floor left out)"
    )


def _depth_lines(table: list[dict], metric: str) -> list[str]:
    """Per model, kappa / d in each third of the depth (medians over layers and cells)."""
    mine = _headline(table, metric)
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
                f"depth, {short(model)}: kappa / d {', '.join(thirds)} (medians over the "
                "layers and cells of each third)"
            )
    return out


def _gains_lines(table: list[dict]) -> list[str]:
    """Per cell, how well the later norm gains (weights alone) follow kappa / d over
    depth, in each metric."""
    out = []
    cells = sorted({(r["model"], r["corpus"], r["seq_len"]) for r in table})
    for cell in cells:
        by_layer: dict[int, dict] = {}
        for r in table:
            if (r["model"], r["corpus"], r["seq_len"]) != cell or r["reading"] != HEADLINE:
                continue
            if r["outliers"] != "left out":
                continue
            row = by_layer.setdefault(r["layer"], {"raw": None, "act": None})
            row[r["metric"]] = r["kappa_over_d"]
            row["later_gains"] = r.get("later_gains_over_d")
        rows = list(by_layer.values())
        raw, act = log_correlation(rows, "raw"), log_correlation(rows, "act")
        if raw is None:
            continue
        out.append(
            f"gains, {short(cell[0])} on {short(cell[1])}, seq {cell[2]}: log(kappa / d) "
            f"against log(later gains' erank / d) over {len(rows)} layers, correlation "
            f"{raw:.2f} raw" + (f", {act:.2f} activation-weighted" if act is not None else "")
        )
    return out


def _cells_table(cells: list[dict], table: list[dict]) -> list[str]:
    lines = [
        "| model | corpus | seq | eval tokens | kappa / d raw, median over layers (range) | "
        "kappa_act / d, median (range) | layers converged (raw, act) | minutes: planned, "
        "measured | memory GiB: planned, peak |",
        "| --- | --- | ---: | ---: | --- | --- | ---: | ---: | ---: |",
    ]
    for c in cells:
        cell = c["cell"]
        said, converged = [], []
        for metric in METRICS:
            mine = [
                r
                for r in table
                if (r["model"], r["corpus"], r["seq_len"]) == tuple(cell.values())
                and r["reading"] == HEADLINE
                and r["outliers"] == "left out"
                and r["metric"] == metric
            ]
            values = [r["kappa_over_d"] for r in mine if r["kappa_over_d"] is not None]
            said.append(
                f"{statistics.median(values):.2f} ({min(values):.2f} to {max(values):.2f})"
                if values
                else ("n/a (not measured)" if not mine else "n/a (below the floor)")
            )
            converged.append(f"{sum(1 for r in mine if r['converged'])} of {len(mine)}")
        lines.append(
            f"| {cell['model']} | {cell['corpus']} | {cell['seq_len']} | {c['eval_tokens']:,} | "
            f"{said[0]} | {said[1]} | {', '.join(converged)} | {_cost(c)} |"
        )
    return lines


def _ladder_lines(cells: list[dict]) -> list[str]:
    laddered = [c for c in cells if c.get("ladder")]
    if not laddered:
        return []
    bars = [str(b) for b in laddered[0]["ladder"]["bars"]]
    lines = [
        "",
        "## Which directions matter at the middle layer, by intervention",
        "",
        "Keep the top k directions of each ranking, mean-ablate the rest at the cell's middle "
        "layer, and measure KL(clean || edited) of the next-token distribution on held-out "
        "sequences (the cell's planned train half). The smallest k of the ladder from which on "
        f"KL stays within {' and '.join(bars)} nats, beside the eranks:",
        "",
        "| model | corpus | seq | layer | raw kappa | kappa_act | "
        + " | ".join(
            f"k: {name} (KL <= {b})" for name in ("raw", "act", "pca", "random") for b in bars
        )
        + " |",
        "| --- | --- | ---: | ---: | ---: | ---: | "
        + " | ".join("---:" for _ in range(4 * len(bars)))
        + " |",
    ]
    for c in laddered:
        lad, cell = c["ladder"], c["cell"]

        def k(name: str, bar: str, lad=lad) -> str:
            v = lad["within"][name][bar]
            return "none" if v is None else f"{v:,}"

        e = lad["eranks"]
        lines.append(
            f"| {cell['model']} | {cell['corpus']} | {cell['seq_len']} | {lad['layer']} | "
            f"{_num(e.get('raw'))} | {_num(e.get('act'))} | "
            + " | ".join(k(name, b) for name in ("raw", "act", "pca", "random") for b in bars)
            + " |"
        )
    return lines


def _num(x) -> str:
    return "n/a" if x is None else f"{x:,.0f}"


def markdown(
    cfg: dict,
    cells: list[dict],
    table: list[dict],
    command: str,
    missing: Sequence[str] = (),
) -> str:
    lines = [
        "# The atlas: the direct kappa across models, text, context and depth",
        "",
        WHICH_METRIC,
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
        *_cells_table(cells, table),
    ]
    if missing:
        lines += [
            "",
            f"Not yet measured ({len(missing)} of the grid's {len(cells) + len(missing)} "
            f"cells; --max-minutes ended the run before them): {', '.join(missing)}. The "
            "same command without --max-minutes measures them and keeps the rest.",
        ]
    for metric, name in METRICS.items():
        if not _headline(table, metric):
            continue
        head, out = {"reading": HEADLINE, "metric": metric}, {"outliers": "left out"}
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
                _ratio_line(table, "reading", HEADLINE, other, metric=metric, **out)
                for other in ("logits_uncentred", "loss", "fisher")
            ),
            _model_line(table, metric),
            *_depth_lines(table, metric),
        ]
        lines += [
            "",
            f"## What moves kappa, {name} (the headline reading, medians of matched ratios)",
            "",
        ]
        lines += [f"- {line}." for line in found if line]
    gains = _gains_lines(table)
    if gains:
        lines += [
            "",
            "## What the weights predict",
            "",
            "The later gains' erank: of the summed squared gains of the final norm and of the "
            "norms that read the residual in the blocks after each layer, from the weights "
            "alone. Where it follows the raw kappa / d over depth, the model's scaling of its "
            "coordinates sets the raw kappa.",
            "",
            *[f"- {line}." for line in gains],
        ]
    lines += _ladder_lines(cells)
    lines += [
        "",
        "## The claims it answers (the middle layer, by the claims tables' rules)",
        "",
        "| claim | compared | verdict | why |",
        "| --- | --- | --- | --- |",
        *(
            f"| {claim} | {shown} | {verdict} | {why} |".replace("\n", " ")
            for claim, shown, verdict, why in atlas_claims(cells)
        ),
        "",
        kappa_intervals(),
    ]
    lines += [
        "",
        "Planned: the dry run's figures, made as the cell began (`causaldim atlas --dry-run` "
        "prints them). Peak: the process's resident memory above what it held before the "
        "cell, the model's weights included (n/a: a cell measured before peaks were kept).",
    ]
    unconverged = [r for r in table if r["reading"] == HEADLINE and r["converged"] is False]
    needs = sorted(r["eval_tokens_needed"] for r in unconverged if r["eval_tokens_needed"])
    if needs:
        # a linear extrapolation from each reading's count: the median says what most
        # layers need; the largest is one layer's, and the extrapolation can undershoot
        lines += [
            "",
            f"Not converged: {len(unconverged)} of the headline's layer readings (both "
            f"metrics). Each reading's count, extrapolated linearly, gives the eval tokens it "
            f"would need: a median of about {statistics.median(needs):,.0f} over these "
            f"readings, {needs[-1]:,} for the one that needs most; an extrapolation, which "
            "has undershot (`--eval-tokens`).",
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
