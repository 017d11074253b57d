"""The controls' part of the report: a figure where one helps, a table, and an
interpretation written from the numbers in results.json["controls"] (what the result
says and what it does not), never from expectations about the outcome."""

from __future__ import annotations

from pathlib import Path

from .report import Doc, _ci, _num, _pct, _pyplot, _save

TITLES = {
    "thresholds": "Threshold robustness",
    "architectures": "Architecture invariance",
    "l0": "Matched L0",
    "four_cell": "Four-cell encoder/decoder ablation",
    "geometry": "Geometric privilege",
    "ablation": "AtP against real ablation",
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


PLOTS = {
    "thresholds": plot_thresholds,
    "architectures": plot_architectures,
    "four_cell": plot_four_cell,
    "geometry": plot_geometry,
    "ablation": plot_ablation,
}


def figure_paths(results: dict, folder: Path) -> dict[str, Path]:
    return {
        f"control_{name}": folder / "figures" / f"control_{name}.png"
        for name in results.get("controls", {})
        if name in PLOTS
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


SECTIONS = {
    "thresholds": thresholds_section,
    "architectures": architectures_section,
    "l0": l0_section,
    "four_cell": four_cell_section,
    "geometry": geometry_section,
    "ablation": ablation_section,
}


def add_sections(doc: Doc, results: dict, figures: dict[str, Path]) -> None:
    controls = results.get("controls") or {}
    if not controls:
        return
    doc.h(2, "Controls")
    for name, c in controls.items():
        doc.h(3, TITLES[name] + (f" ({c['architecture']})" if "architecture" in c else ""))
        if f"control_{name}" in figures:
            doc.img(figures[f"control_{name}"], TITLES[name])
        SECTIONS[name](doc, c)
