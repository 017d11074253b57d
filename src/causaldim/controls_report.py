"""The controls' part of the report: a figure where one helps, a table, and an
interpretation written from the numbers in results.json["controls"] (what the result
says and what it does not), never from expectations about the outcome."""

from __future__ import annotations

import math
from pathlib import Path

from .report import Doc, _ci, _num, _pct, _pyplot, _save

PAPER_TASK_RECOVERY = 0.982  # the paper's share of task ground truth in the AtP top 5%

TITLES = {
    "thresholds": "Threshold robustness",
    "architectures": "Architecture invariance",
    "l0": "Matched L0",
    "four_cell": "Four-cell encoder/decoder ablation",
    "geometry": "Geometric privilege",
    "ablation": "AtP against real ablation",
    "synthetic": "Synthetic ground truth",
    "task": "Task-specific recovery",
    "depth": "Depth",
    "scale": "Scale",
}


# ----------------------------------------------------------------------------- figures


def _finish(fig, ax, path: Path, xlabel, ylabel, title, log_x: bool, log_y: bool) -> Path:
    if log_x:
        ax.set_xscale("log")
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path)


def plot_thresholds(c: dict, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    for i, r in enumerate(c["rows"]):
        ax.plot(
            c["widths"],
            [max(v, 0.5) for v in r["n_causal"]],
            "o-",
            color=plt.cm.plasma(i / max(len(c["rows"]) - 1, 1)),
            label=f"{r['percentile']:g}th pct: kappa_hat {_num(r['kappa_hat'])} "
            f"{_ci(r['kappa_95'])}",
        )
    return _finish(
        fig,
        ax,
        path,
        "SAE width m",
        "N_causal (0 drawn at 0.5)",
        f"N_causal at four calibrations of epsilon ({c['architecture']})",
        log_x=True,
        log_y=True,
    )


def plot_architectures(c: dict, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    for i, r in enumerate(c["rows"]):
        ax.plot(
            c["widths"],
            [max(v, 0.5) for v in r["n_causal"]],
            "o-",
            color=f"C{i}",
            label=f"{r['architecture']} N_causal",
        )
        ax.plot(
            c["widths"],
            r["n_repr"],
            "s:",
            color=f"C{i}",
            alpha=0.6,
            label=f"{r['architecture']} N_repr",
        )
    return _finish(
        fig,
        ax,
        path,
        "SAE width m",
        "features (0 drawn at 0.5)",
        "The wedge per architecture, at matched L0",
        log_x=True,
        log_y=True,
    )


def plot_four_cell(c: dict, path: Path) -> Path:
    plt = _pyplot()
    rows = c["rows"]
    fig, ax = plt.subplots(figsize=(8, 4.4))
    n = len(c["cells"])
    for j, cell in enumerate(c["cells"]):
        xs = [i + (j - (n - 1) / 2) * 0.2 for i in range(len(rows))]
        ax.bar(
            xs,
            [max(r["cells"][cell]["n_causal"], 0.5) for r in rows],
            0.2,
            label=f"encoder/decoder: {cell}",
            color=f"C{j}",
        )
    ax.set_xticks(range(len(rows)), [str(r["width"]) for r in rows])
    return _finish(
        fig,
        ax,
        path,
        "SAE width m",
        "N_causal at the headline epsilon (0 drawn at 0.5)",
        f"Trained vs random encoder and decoder ({c['architecture']})",
        log_x=False,
        log_y=True,
    )


def plot_geometry(c: dict, path: Path) -> Path:
    """Per width: the non-causal features' nearest-neighbour cosine as a band (5-95th
    percentiles and median) and each causal feature's value as a dot."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    for i, r in enumerate(c["rows"]):
        g = r["nn_cosine"]
        if g.get("other_quantiles"):
            q = g["other_quantiles"]
            ax.plot(
                [i, i],
                [q[1], q[19]],
                color="grey",
                lw=6,
                alpha=0.4,
                label="non-causal: 5-95th pct" if i == 0 else None,
            )
            ax.plot(
                i, q[10], "_", color="black", ms=14, label="non-causal median" if i == 0 else None
            )
        if g.get("causal_values"):
            ax.plot(
                [i + 0.15] * len(g["causal_values"]),
                g["causal_values"],
                "o",
                color="C3",
                ms=4,
                label="causal features" if i == 0 else None,
            )
    ax.set_xticks(range(len(c["rows"])), [str(r["width"]) for r in c["rows"]])
    return _finish(
        fig,
        ax,
        path,
        "SAE width m",
        "cosine to nearest decoder neighbour",
        f"Geometry of causal vs non-causal features ({c['architecture']})",
        log_x=False,
        log_y=False,
    )


def plot_ablation(c: dict, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    floor = 1e-12  # zero effects drawn on the axis floor of a log plot
    for i, r in enumerate(c["rows"]):
        ax.plot(
            [max(v, floor) for v in r["atp"]],
            [max(v, floor) for v in r["real"]],
            "o",
            color=plt.cm.viridis(i / max(len(c["rows"]) - 1, 1)),
            ms=4,
            label=f"m = {r['width']}",
        )
    ax.axvline(c["epsilon"], color="C3", ls="--", lw=1, label="epsilon (AtP)")
    if c.get("epsilon_sequence_level"):
        ax.axhline(
            c["epsilon_sequence_level"],
            color="C1",
            ls="--",
            lw=1,
            label="epsilon's equivalent (real)",
        )
    return _finish(
        fig,
        ax,
        path,
        "AtP (first order, mean |f (g . d)| per token)",
        "real ablation: mean |change in loss| per token",
        f"AtP vs zeroing the feature ({c['architecture']})",
        log_x=True,
        log_y=True,
    )


def plot_task(c: dict, path: Path) -> Path:
    """Each evaluated feature: its generic-text AtP rank against how far its real ablation
    moves the task metric; ground truth is what lies above the bar, recovery what lies
    left of the top-5% line as well."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    floor = 1e-9  # zero effects drawn on the axis floor of a log plot
    for truth, colour, label in ((False, "grey", "other candidates"), (True, "C3", "ground truth")):
        pts = [
            (rank + 1, max(abs(e), floor))
            for rank, e, t in zip(c["atp_rank"], c["effects"], c["ground_truth"], strict=True)
            if t == truth
        ]
        if pts:
            ax.plot(*zip(*pts, strict=True), "o", color=colour, ms=4, alpha=0.8, label=label)
    ax.axvline(c["top_k"] + 0.5, color="C0", ls="--", lw=1, label=f"top {100 * c['top']:g}% of AtP")
    ax.axhline(
        c["ground_truth_bar"],
        color="C1",
        ls="--",
        lw=1,
        label=f"{100 * c['fraction']:g}% of the clean metric",
    )
    where = ", ".join(
        str(x)
        for x in (c.get("architecture"), c.get("width") and f"m = {c['width']}")
        if x is not None
    )
    return _finish(
        fig,
        ax,
        path,
        "generic-text AtP rank (1 = highest)",
        "|change in mean logit difference| on ablation",
        f"Agreement task: real ablation vs AtP rank{f' ({where})' if where else ''}",
        log_x=True,
        log_y=True,
    )


def plot_synthetic(c: dict, path: Path) -> Path:
    """Per width, the share of the k planted directions recovered three ways, and the share
    of AtP-selected features that lie mostly outside the planted subspace."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    widths = [r["width"] for r in c["rows"]]
    lines = (
        ("recall", "o-", f"recall: AtP-selected row with |cos| >= {c['cosine_threshold']:g}"),
        ("recall_dictionary", "s:", "recall: any feature (did the SAE learn them)"),
        ("subspace_capture", "^-", "subspace capture ||P_S U||^2 / k (AtP-selected)"),
    )
    for i, (key, style, label) in enumerate(lines):
        ax.plot(widths, [r[key] for r in c["rows"]], style, color=f"C{i}", label=label)
    noncausal = [r["selected_noncausal_fraction"] for r in c["rows"]]
    ax.plot(
        [w for w, v in zip(widths, noncausal, strict=True) if v is not None],
        [v for v in noncausal if v is not None],
        "x--",
        color="C3",
        label="AtP-selected features mostly outside U",
    )
    ax.set_ylim(-0.05, 1.05)
    d = c["direct"]
    return _finish(
        fig,
        ax,
        path,
        "SAE width m",
        "fraction",
        f"Planted k = {c['k']} (d = {c['d_model']}): direct erank {d['erank']:.2f}, "
        f"kappa_hat {_num(c['kappa_hat'], 2)} ({c['architecture']})",
        log_x=True,
        log_y=False,
    )


def plot_depth(c: dict, path: Path) -> Path:
    plt = _pyplot()
    fig, (left, ax) = plt.subplots(1, 2, figsize=(10, 4.2))
    layers = c["layers"]
    left.plot(layers, [r["epsilon"] for r in c["rows"]], "o-", color="C3", label="epsilon")
    left.set_yscale("log")
    left.set_xlabel("layer")
    left.set_ylabel("epsilon (AtP calibration)")
    left.set_title("epsilon by layer")
    left.legend(fontsize=7)
    for reading, color in (("loss", "C0"), ("logits", "C1"), ("fisher", "C2")):
        values = [r["erank"].get(reading) for r in c["rows"]]
        if any(v is not None for v in values):
            ax.plot(layers, values, "o-", color=color, label=f"direct erank ({reading})")
    ax.plot(
        layers, [max(r["kappa_hat"], 0.5) for r in c["rows"]], "s--", color="k", label="kappa_hat"
    )
    return _finish(
        fig,
        ax,
        path,
        "layer",
        "dimensions",
        f"Direct eranks and kappa_hat by layer ({c['architecture']})",
        log_x=False,
        log_y=True,
    )


def plot_scale(c: dict, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    r = c["rows"][-1]  # the widest pair
    qs = [i / (len(r["quantiles"][0]) - 1) for i in range(len(r["quantiles"][0]))]
    for model, quantiles, style in zip(c["models"], r["quantiles"], ("-", "--"), strict=True):
        ax.plot(quantiles, qs, style, label=f"{model} (layer of {r['widths'][0]:,} features)")
    ax.axvline(0.0, color="grey", lw=0.8, label="epsilon")
    return _finish(
        fig,
        ax,
        path,
        "log10(AtP / epsilon), firing features",
        "cumulative fraction",
        f"AtP distributions after normalising by epsilon: KS {r['ks']:.3f}, p {r['p_value']:.3g}",
        log_x=False,
        log_y=False,
    )


PLOTS = {
    "thresholds": plot_thresholds,
    "architectures": plot_architectures,
    "four_cell": plot_four_cell,
    "geometry": plot_geometry,
    "ablation": plot_ablation,
    "synthetic": plot_synthetic,
    "task": plot_task,
    "depth": plot_depth,
    "scale": plot_scale,
}


def figure_paths(results: dict, folder: Path) -> dict[str, Path]:
    return {
        f"control_{name}": folder / "figures" / f"control_{name}.png"
        for name, c in results.get("controls", {}).items()
        if name in PLOTS and "skipped" not in c
    }


def plot(results: dict, paths: dict[str, Path]) -> None:
    for key, path in paths.items():
        name = key.removeprefix("control_")
        PLOTS[name](results["controls"][name], path)


# ----------------------------------------------------------------------------- text


def _growth(x) -> str:
    return "n/a" if x is None else f"x{x:.2f}"


def thresholds_section(doc: Doc, c: dict) -> None:
    doc.table(
        [
            "percentile",
            "epsilon",
            "N_causal per width",
            "growth",
            "kappa_hat [95%]",
            "kappa_hat <= d",
        ],
        [
            [
                f"{r['percentile']:g}",
                f"{r['epsilon']:.3g}",
                " / ".join(map(str, r["n_causal"])),
                _growth(r["n_causal_growth"]),
                f"{_num(r['kappa_hat'])} {_ci(r['kappa_95'])}",
                _num(r["kappa_at_most_d"]),
            ]
            for r in c["rows"]
        ],
    )
    growths = [r["n_causal_growth"] for r in c["rows"] if r["n_causal_growth"] is not None]
    kappas = [r["kappa_hat"] for r in c["rows"] if r["kappa_hat"] > 0]
    grows = [g > 1 for g in growths]
    text = []
    if growths and all(grows):
        text.append("N_causal grows with width at every calibration")
    elif growths and not any(grows):
        text.append("N_causal does not grow with width at any calibration")
    elif growths:
        text.append(
            f"N_causal grows at {sum(grows)} of {len(growths)} calibrations only, so the "
            "wedge depends on where epsilon is set"
        )
    if len(kappas) > 1:
        text.append(
            f"kappa_hat moves by a factor {max(kappas) / min(kappas):.2f} between the "
            "calibrations: epsilon is a free parameter of the SAE estimate, unlike the "
            "direct eranks"
        )
    doc.p(
        ". ".join(text) + "." if text else "No growth ratios (N_causal is 0 at the smallest width)."
    )


def architectures_section(doc: Doc, c: dict) -> None:
    doc.table(
        [
            "architecture",
            "epsilon",
            "N_causal per width",
            "N_causal growth",
            "N_repr growth",
            "kappa_hat [95%]",
        ],
        [
            [
                r["architecture"],
                f"{r['epsilon']:.3g}",
                " / ".join(map(str, r["n_causal"])),
                _growth(r["n_causal_growth"]),
                _growth(r["n_repr_growth"]),
                f"{_num(r['kappa_hat'])} {_ci(r['kappa_95'])}",
            ]
            for r in c["rows"]
        ],
    )
    spread = c.get("kappa_spread")
    grows = {r["architecture"]: (r["n_causal_growth"] or 0) > 1 for r in c["rows"]}
    text = (
        f"N_causal grows with width for {', '.join(a for a, g in grows.items() if g) or 'none'}"
        f" of {len(grows)} architectures"
    )
    if spread is not None:
        text += (
            f"; kappa_hat differs by a factor {spread:.2f} across them (each calibrated on its "
            "own smallest width). A property of the layer should not depend on the dictionary "
            "that reads it; a large factor says the estimate does"
        )
    doc.p(text + ".")


def l0_section(doc: Doc, c: dict) -> None:
    doc.table(
        ["architecture", "width", "L0 (eval)", "off target", "flag"],
        [
            [
                r["architecture"],
                r["width"],
                f"{r['l0']:.2f}",
                _pct(r["relative_error"]),
                "outside tolerance" if r["flagged"] else "",
            ]
            for r in c["rows"]
        ],
    )
    doc.p(
        f"Target L0 {c['target']:g}, tolerance {100 * c['tolerance']:.0f}%: "
        + (
            "every SAE is within it, so sparsity drift across widths cannot make the wedge."
            if not c["n_flagged"]
            else f"{c['n_flagged']} SAE(s) outside it; their rows of the wedge compare "
            "different sparsities and should be read with that in mind."
        )
    )


def four_cell_section(doc: Doc, c: dict) -> None:
    doc.table(
        ["width", *[f"N_causal {cell}" for cell in c["cells"]], "random-encoder inflation"],
        [
            [
                r["width"],
                *[r["cells"][cell]["n_causal"] for cell in c["cells"]],
                _growth(r["random_encoder_inflation"]),
            ]
            for r in c["rows"]
        ],
    )
    infl = [
        r["random_encoder_inflation"]
        for r in c["rows"]
        if r["random_encoder_inflation"] is not None
    ]
    trained = [r["cells"]["trained/trained"]["n_causal"] for r in c["rows"]]
    rand_dec = [r["cells"]["trained/random"]["n_causal"] for r in c["rows"]]
    if infl:
        first = (
            f"At the headline epsilon ({c['epsilon']:.3g}), a random orthonormal encoder with "
            f"the trained decoder gives x{min(infl):.2f} to x{max(infl):.2f} the trained "
            "count (paper: x9.27)."
        )
    else:
        first = (
            f"At the headline epsilon ({c['epsilon']:.3g}), the trained SAEs count no causal "
            "feature at any width where a random encoder could be compared, so there is no "
            "inflation factor."
        )
    more = sum(r > t for r, t in zip(rand_dec, trained, strict=True))
    doc.p(
        f"{first} A random decoder counts more causal features than the trained one at "
        f"{more} of {len(trained)} widths. Counts that random dictionaries match or exceed "
        "measure how AtP and epsilon treat any dictionary, not structure the SAE found."
    )


def geometry_section(doc: Doc, c: dict) -> None:
    rows = []
    for r in c["rows"]:
        n, g = r["decoder_norm"], r["nn_cosine"]
        rows.append(
            [
                r["width"],
                n["n_causal"],
                n["n_other"],
                _num(n.get("median_causal"), 3),
                _num(n.get("median_other"), 3),
                _auc(n),
                _num(g.get("median_causal"), 3),
                _num(g.get("median_other"), 3),
                _auc(g),
            ]
        )
    doc.table(
        [
            "width",
            "causal",
            "non-causal",
            "norm, causal",
            "norm, other",
            "AUC norm [95%]",
            "NN cos, causal",
            "NN cos, other",
            "AUC NN cos [95%]",
        ],
        rows,
    )
    text = []
    for label, key in (("decoder norm", "decoder_norm"), ("nearest-neighbour cosine", "nn_cosine")):
        clear = [r["width"] for r in c["rows"] if _excludes_half(r[key])]
        text.append(
            f"{label}: the AUC interval excludes 0.5 at widths {', '.join(map(str, clear))}"
            if clear
            else f"{label}: no width shows a difference whose interval excludes 0.5"
        )
    spreads = [r["decoder_norm_spread"] for r in c["rows"]]
    if max(spreads) < 1e-3:
        text.append(
            "the decoder rows all have one norm (training keeps them on a sphere), so the "
            "norm comparison cannot discriminate for these SAEs"
        )
    few = min(r["decoder_norm"]["n_causal"] for r in c["rows"])
    if few == 0:
        text.append("some widths have no causal feature: nothing to compare there")
    elif few < 10:
        text.append(f"with as few as {few} causal feature(s) at a width, intervals are wide")
    doc.p(
        "AUC = P(a causal feature's value exceeds a non-causal one's); 0.5 is no "
        "difference. " + "; ".join(text) + "."
    )


def _auc(g: dict) -> str:
    if g.get("auc") is None:
        return "n/a"
    lo, hi = g["auc_95"]
    return f"{g['auc']:.2f} [{lo:.2f}, {hi:.2f}]"


def _excludes_half(g: dict) -> bool:
    return g.get("auc") is not None and not g["auc_95"][0] <= 0.5 <= g["auc_95"][1]


def ablation_section(doc: Doc, c: dict) -> None:
    doc.table(
        [
            "width",
            "features",
            "Spearman real vs AtP",
            "real vs first order",
            "truly causal",
            "missed by AtP",
            "false alarms",
        ],
        [
            [
                r["width"],
                len(r["features"]),
                _num(r["spearman_real_atp"], 2),
                _num(r["spearman_real_first_order"], 2),
                r["n_truly_causal"],
                r["n_missed_by_atp"],
                r["n_false_alarms"],
            ]
            for r in c["rows"]
        ],
    )
    rho = c.get("spearman_real_atp_pooled")
    text = [
        f"{sum(len(r['features']) for r in c['rows'])} features, stratified by AtP, zeroed on "
        f"{c['n_sequences']} eval sequences ({c['n_tokens']:,} predictions)"
    ]
    if rho is not None:
        text.append(f"pooled Spearman correlation of the real effect with AtP: {rho:.2f}")
    missed = c.get("missed_fraction")
    if missed is None:
        text.append(
            "no sampled feature's real effect clears epsilon's sequence-level equivalent, so "
            "AtP's misses cannot be counted here"
        )
    else:
        text.append(
            f"AtP misses {_pct(missed)} of the sampled features whose real effect clears "
            "epsilon's equivalent; this is a fraction of the sample, which over-represents "
            "the top of the AtP ranking, not of all features"
        )
    doc.p("; ".join(text) + ".")


def _wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson interval of a proportion k/n (n > 0): honest at small n and at 0 or n."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(centre - half, 0.0), min(centre + half, 1.0)


def _recovered_at(c: dict, scale: float) -> float | None:
    """The recovery fraction with the ground-truth bar scaled, from the stored effects."""
    bar = scale * c["ground_truth_bar"]
    truth = [r for r, e in zip(c["atp_rank"], c["effects"], strict=True) if abs(e) > bar]
    return sum(r < c["top_k"] for r in truth) / len(truth) if truth else None


def _undefined_pct(x: float | None) -> str:
    return "undefined (no ground truth)" if x is None else _pct(x)


def task_section(doc: Doc, c: dict) -> None:
    top = f"top {100 * c['top']:g}%"
    frac = c["recovered_fraction"]
    if frac is None:
        recovered = "n/a"
    else:
        lo, hi = _wilson(c["n_ground_truth_in_top"], c["n_ground_truth"])
        recovered = f"{_pct(frac)} [{_pct(lo)}, {_pct(hi)}]"
    doc.table(
        [
            "prompts (verbs)",
            "clean logit diff",
            "clean accuracy",
            "firing / ablated",
            "ground truth",
            f"in {top} of AtP",
            "recovered [95%]",
            f"ablated features in {top}",
        ],
        [
            [
                f"{c['n_prompts']} ({', '.join(c['verb_pairs'])})",
                _num(c["clean_metric"], 3),
                _pct(c["clean_accuracy"]),
                f"{c['n_candidates']} / {c['n_evaluated']}",
                c["n_ground_truth"],
                c["n_ground_truth_in_top"],
                recovered,
                _pct(c["evaluated_in_top_fraction"]),
            ]
        ],
    )
    text = [
        f"Subject-verb agreement across a distractor of the other number, {c['n_prompts']} "
        f"generated prompts; metric: mean logit(correct) - logit(wrong) at the verb, "
        f"{c['clean_metric']:.3g} clean, correct verb preferred on "
        f"{_pct(c['clean_accuracy'])} of prompts"
    ]
    if c["clean_metric"] <= 0 or c["clean_accuracy"] < 0.6:
        text.append(
            "the model barely does this task, so the features that move the metric are not "
            "a circuit for agreement and the recovery figure says little about one"
        )
    bar = f"{100 * c['fraction']:g}% of the clean metric ({c['ground_truth_bar']:.3g})"
    if frac is None:
        text.append(
            f"no ablated feature moves the metric by more than {bar}, so there is no ground "
            "truth and the recovery fraction is undefined: this is not evidence either way"
        )
    else:
        text.append(
            f"{c['n_ground_truth']} feature(s) move it by more than {bar}; "
            f"{c['n_ground_truth_in_top']} of them ({_pct(frac)}, 95% interval "
            f"{_pct(lo)}-{_pct(hi)}) rank in the {top} of the width by generic-text AtP "
            f"(the {c['top_k']} highest); the paper's {_pct(PAPER_TASK_RECOVERY)} is "
            + ("inside" if lo <= PAPER_TASK_RECOVERY <= hi else "outside")
            + " that interval"
        )
        chance = c["evaluated_in_top_fraction"]
        text.append(
            f"of all ablated candidates, {_pct(chance)} rank there, which is what a ranking "
            "blind to the task would recover; "
            + (
                f"ground truth is enriched there x{frac / chance:.1f}"
                if chance and frac > chance
                else "ground truth is there as often as the candidates are"
                if frac == chance
                else "ground truth is there less often than the candidates are"
            )
        )
        half, double = _recovered_at(c, 0.5), _recovered_at(c, 2.0)
        text.append(
            f"with the bar at half or twice {100 * c['fraction']:g}%, the fraction is "
            f"{_undefined_pct(half)} or {_undefined_pct(double)}"
        )
    if c["n_dropped"]:
        dropped = c["largest_dropped_first_order"]
        text.append(
            f"{c['n_dropped']} of the {c['n_candidates']} firing features were not ablated "
            f"(cap {c['max_features']}, smallest first-order effects dropped); the largest "
            f"first-order effect among them is {dropped:.3g}, "
            + (
                "well under the bar, so, as far as first order predicts the real effect, "
                "they are unlikely to hold ground truth"
                if dropped < 0.5 * c["ground_truth_bar"]
                else "not far under the bar or above it, so ground truth may have been "
                "dropped and the fraction covers the ablated features only"
            )
        )
    doc.p(
        "; ".join(text) + ". Ground truth here is one generated task at one width, judged by "
        "single-feature ablations (features that matter only together are missed); it "
        "checks that AtP's top finds what this task uses, not how many features matter on "
        "generic text."
    )


def synthetic_section(doc: Doc, c: dict) -> None:
    spec, d = c["spec"], c["direct"]
    doc.p(
        f"A toy layer (d = {c['d_model']}) whose output reads a planted {c['k']}-dimensional "
        f"subspace U: {c['k']} causal features along U's columns (each firing on "
        f"{_pct(spec['causal_density'])} of tokens) and {spec['n_features']} non-causal "
        f"features in superposition in the other {c['d_model'] - c['k']} dimensions (each "
        f"firing on {_pct(spec['feature_density'])}); g = U t with t ~ N(0, I_k) per token, so "
        f"Sigma = U U^T and its erank is {c['k']} by construction. SAE sweep: "
        f"{c['sweep']['architecture']}, k = {c['sweep']['k']}, {c['sweep']['epochs']} epoch(s) "
        f"over {spec['train_tokens']:,} train tokens; AtP on {spec['eval_tokens']:,} eval tokens."
    )
    doc.table(
        [
            "width",
            "N_causal",
            "N_repr",
            "FVE",
            "recall (AtP-selected)",
            "recall (any feature)",
            "subspace capture",
            "selected, mostly outside U",
        ],
        [
            [
                r["width"],
                r["n_causal"],
                r["n_repr"],
                _num(r["fraction_variance_explained"], 3),
                _pct(r["recall"]),
                _pct(r["recall_dictionary"]),
                _pct(r["subspace_capture"]),
                f"{r['n_selected_noncausal']} of {r['n_causal']}",
            ]
            for r in c["rows"]
        ],
    )
    rows = c["rows"]
    err = d["relative_error"]
    text = [
        f"The direct erank of Sigma (loss reading) is {d['erank']:.3f} against k = {c['k']} "
        f"({100 * err:+.2f}%, {'within' if abs(err) <= 0.02 else 'outside'} 2%); the "
        f"activations' own erank is {d['activations_erank']:.1f}, the directions h uses "
        "rather than those that move the output"
    ]
    kappa = c["kappa_hat"]
    text.append(
        f"the SAE estimate kappa_hat is {_num(kappa, 2)} "
        f"[{', '.join(_num(v, 2) for v in c['kappa_95']) or 'n/a'}], "
        f"x{c['kappa_over_k']:.2f} the planted k"
        if kappa == kappa  # not NaN
        else "the SAE fit gave no kappa_hat"
    )
    best = max(rows, key=lambda r: r["recall"])
    where = f" (at width {best['width']})" if best["recall"] > 0 else ""
    text.append(
        f"AtP-selected features recover at most {_pct(best['recall'])} of the planted "
        f"directions{where} (paper: 0) and capture at most "
        f"{_pct(max(r['subspace_capture'] for r in rows))} of the planted subspace"
    )
    learned = max(r["recall_dictionary"] for r in rows)
    if learned < 0.5:
        text.append(
            f"but no SAE of the sweep has a feature within cosine {c['cosine_threshold']:g} "
            f"of more than {_pct(learned)} of them, so a low recall here reflects what the "
            "SAEs learned under this training budget before it reflects AtP's selection"
        )
    elif best["recall"] < learned:
        text.append(
            f"while the SAEs do hold features for up to {_pct(learned)} of them: AtP and "
            "epsilon leave out planted directions that the dictionaries contain"
        )
    expected = (1 - c["percentile"] / 100) * rows[0]["width"]
    text.append(
        f"epsilon, the {c['percentile']:g}th percentile of the smallest width's AtP, puts "
        f"about {expected:.0f} features above it at that width whatever k is "
        f"({rows[0]['n_causal']} here), so N_causal there is set by the calibration, not by "
        "the planted dimension"
    )
    doc.p("; ".join(text) + ".")


def depth_section(doc: Doc, c: dict) -> None:
    doc.table(
        [
            "layer",
            "epsilon",
            "N_causal per width",
            "growth",
            "kappa_hat",
            "erank loss / logits / fisher",
        ],
        [
            [
                r["layer"],
                f"{r['epsilon']:.3g}",
                " ".join(map(str, r["n_causal"])),
                _growth(r["n_causal_growth"]),
                f"{_num(r['kappa_hat'])} {_ci(r['kappa_95'])}",
                " / ".join(_num(r["erank"].get(k)) for k in ("loss", "logits", "fisher")),
            ]
            for r in c["rows"]
        ],
    )
    ratio, first, last = c["epsilon_first_over_last"], c["layers"][0], c["layers"][-1]
    kappas = [r["kappa_hat"] for r in c["rows"]]
    losses = [r["erank"].get("loss") for r in c["rows"] if r["erank"].get("loss") is not None]
    text = [
        f"epsilon at layer {first} is x{ratio:.2f} that at layer {last} (paper: a 20x fall "
        "from layer 1 to 23 of Gemma-2-2B)"
        if ratio is not None
        else f"epsilon at layer {last} is 0, so no ratio is defined"
    ]
    text.append(
        f"kappa_hat ranges from {_num(min(kappas))} to {_num(max(kappas))} over layers "
        f"{', '.join(map(str, c['layers']))}"
    )
    if losses:
        text.append(
            f"the direct loss-gradient erank from {_num(min(losses))} to {_num(max(losses))}"
        )
    doc.p(
        "; ".join(text) + ". Each layer has its own epsilon (its smallest SAE's percentile), "
        "so N_causal compares across layers only through that calibration; the direct "
        "eranks need no SAE and compare across layers as they are."
    )


def scale_section(doc: Doc, c: dict) -> None:
    doc.table(
        ["widths", "KS (log AtP / epsilon)", "permutation p", "features", "N_causal"],
        [
            [
                f"{r['widths'][0]:,}",
                f"{r['ks']:.3f}",
                f"{r['p_value']:.3g}",
                f"{r['n'][0]:,} / {r['n'][1]:,}",
                f"{r['n_causal'][0]} / {r['n_causal'][1]}",
            ]
            for r in c["rows"]
        ],
    )
    differ = [r for r in c["rows"] if r["p_value"] < 0.05]
    doc.p(
        f"{c['models'][0]} (layer {c['layers'][0]} of {c['n_layers'][0]}, d={c['d_model'][0]}) "
        f"against {c['models'][1]} (layer {c['layers'][1]} of {c['n_layers'][1]}, "
        f"d={c['d_model'][1]}), the same widths: the normalised AtP distributions differ in "
        f"shape (permutation p < 0.05) at {len(differ)} of {len(c['rows'])} widths; kappa_hat "
        f"{_num(c['kappa_hat'][0])} against {_num(c['kappa_hat'][1])}. Normalising by each "
        "model's own epsilon removes any pure rescaling of the scores, so a difference here "
        "is one of shape; with equal widths for models of different d the SAEs are not "
        "equally wide relative to their layers."
    )


SECTIONS = {
    "thresholds": thresholds_section,
    "architectures": architectures_section,
    "l0": l0_section,
    "four_cell": four_cell_section,
    "geometry": geometry_section,
    "ablation": ablation_section,
    "synthetic": synthetic_section,
    "task": task_section,
    "depth": depth_section,
    "scale": scale_section,
}


def add_sections(doc: Doc, results: dict, figures: dict[str, Path]) -> None:
    controls = results.get("controls") or {}
    if not controls:
        return
    doc.h(2, "Controls")
    for name, c in controls.items():
        doc.h(3, TITLES[name] + (f" ({c['architecture']})" if "architecture" in c else ""))
        if "skipped" in c:
            doc.p(f"Not run: {c['skipped']}.")
            continue
        if f"control_{name}" in figures:
            doc.img(figures[f"control_{name}"], TITLES[name])
        SECTIONS[name](doc, c)
