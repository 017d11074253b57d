"""The run's figures, rendered from results.json alone (the controls' own figures live in
their modules), and the helpers every figure uses."""

from __future__ import annotations

import io
import math
from pathlib import Path

from ..fileio import atomic_write_bytes
from ..measures.fit import curve
from ..measures.sigma import DIRECT, HEADLINE
from .direct import below_floor

READING_LABELS = {
    "loss": "loss (E[g g^T])",
    "logits": "logits, direct kappa (E[J^T P J], P removes the logit shift)",
    "logits_uncentred": "logits uncentred (E[J^T J], the paper's literal)",
    "fisher": "fisher (output Fisher, sampled y)",
    "activations": "activations (covariance of h, reference)",
}


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> Path:
    """The figure as a PNG, written atomically like every other artifact."""
    for ax in fig.axes:  # a long title wrapped, never cut at the canvas's edge
        if len(ax.get_title()) > 60 and "\n" not in ax.get_title():
            ax.set_title(title_of(ax.get_title()))
    buffer = io.BytesIO()
    # "tight" keeps every title, label and outside legend inside the canvas
    fig.savefig(buffer, format="png", dpi=130, bbox_inches="tight")
    pyplot().close(fig)
    atomic_write_bytes(path, buffer.getvalue())
    return path


def title_of(text: str, width: int = 60) -> str:
    """A title wrapped so that it never runs past its axes."""
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


def legend_below(ax, ncol: int = 2) -> None:
    """The legend under the axes, off the data."""
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=ncol)


def finish(fig, ax, path: Path, xlabel, ylabel, title, log_x: bool, log_y: bool) -> Path:
    if log_x:
        ax.set_xscale("log")
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title_of(title))
    legend_below(ax)
    fig.tight_layout()
    return save(fig, path)


def plot_sigma(results: dict, path: Path) -> Path:
    """Normalised spectra of every Sigma reading, and erank against sample count."""
    plt = pyplot()
    sigma = results["sigma"]
    d = results["store"]["model"]["d_model"]
    fig, (ax_spec, ax_conv) = plt.subplots(1, 2, figsize=(11, 5.2))
    for reading, est in sigma.items():
        lam = [max(x, 0.0) for x in est["eigenvalues"]]
        total = sum(lam) or 1.0
        style = "--" if reading == "activations" else "-"
        (line,) = ax_spec.loglog(
            range(1, len(lam) + 1),
            [x / total for x in lam],
            style,
            lw=0.8,
            label=f"{READING_LABELS.get(reading, reading)}: plug-in erank {est['erank']:.0f}",
        )
        # no corrected value where too few samples back it (report/direct.below_floor)
        corrected = None if below_floor(est) else est.get("erank_corrected")
        if corrected is not None:  # the deconvolved spectrum, bold, in the same colour
            lam_c = est["eigenvalues_corrected"]
            ax_spec.loglog(
                range(1, len(lam_c) + 1),
                lam_c,
                "-",
                lw=2,
                alpha=0.6,
                color=line.get_color(),
                label=f"{reading}, corrected: erank {corrected:.0f}",
            )
        conv = est["convergence"]
        ax_conv.semilogx(
            [c["n_samples"] for c in conv],
            [c["erank"] for c in conv],
            style + "o",
            color=line.get_color(),
            label=f"{reading}, plug-in",
        )
        half = est.get("erank_corrected_half")
        # the corrected erank's own convergence
        if half is not None and corrected is not None and len(conv) > 1:
            ax_conv.semilogx(
                [conv[-2]["n_samples"], conv[-1]["n_samples"]],
                [half, corrected],
                "s:",
                color=line.get_color(),
                alpha=0.6,
            )
        if corrected is not None and est.get("erank_corrected_95"):
            lo, hi = est["erank_corrected_95"]
            n = conv[-1]["n_samples"]
            ax_conv.errorbar(
                [n],
                [corrected],
                [[corrected - lo], [hi - corrected]],
                fmt="s",
                color=line.get_color(),
                capsize=3,
                label=f"{reading}, corrected [95%]",
            )
    ax_spec.set_xlabel("eigenvalue index")
    ax_spec.set_ylabel("eigenvalue / trace")
    ax_spec.set_title(f"Sigma spectra, layer {results['store']['layer']} (d = {d})")
    legend_below(ax_spec, ncol=1)
    ax_conv.axhline(d, color="grey", lw=0.8, ls=":", label=f"d = {d}, the largest erank")
    from matplotlib.ticker import NullFormatter

    ax_conv.xaxis.set_minor_formatter(NullFormatter())  # minor labels collide on a log axis
    ax_conv.set_xlabel("rank-1 samples")
    ax_conv.set_ylabel("erank")
    ax_conv.set_title(title_of("erank by sample count: plug-in (dots), corrected (squares)"))
    legend_below(ax_conv)
    fig.tight_layout()
    return save(fig, path)


def plot_wedge(results: dict, arch: str, path: Path) -> Path:
    """N_repr and N_causal against width with intervals, the fitted curves with kappa_hat
    and its interval, d, and the direct eranks beside them."""
    plt = pyplot()
    a = results["sweep"][arch]
    rows = a["per_width"]
    widths = [r["width"] for r in rows]
    d = results["store"]["model"]["d_model"]
    fig, ax = plt.subplots(figsize=(10.5, 5.2))
    for key, label, color in (("n_repr", "N_repr (fire)", "C0"), ("n_causal", "N_causal", "C3")):
        y = [r[key] for r in rows]
        err = None
        if all(r.get(f"{key}_95") for r in rows):
            err = [
                [max(v - r[f"{key}_95"][0], 0) for v, r in zip(y, rows, strict=True)],
                [max(r[f"{key}_95"][1] - v, 0) for v, r in zip(y, rows, strict=True)],
            ]
        ax.errorbar(widths, y, yerr=err, fmt="o", color=color, capsize=3, label=label)
    # an estimable fit is drawn past the widest SAE (x8, its extrapolation); a level is not
    reach = widths[-1] * (8 if a["estimable"] else 1)
    grid = [widths[0] * (reach / widths[0]) ** (i / 200) for i in range(201)]
    for name, style in (("free", "-"), ("at_most_d", "--")):
        k = a["kappa"][name]
        fit = k["fits"][k["form"]]
        lo, hi = k["interval_95"]
        bound = "" if name == "free" else " (kappa <= d)"
        label = f"{k['form']} fit{bound}: kappa_hat {k['kappa']:.0f} [{lo:.0f}, {hi:.0f}]"
        if not a["estimable"]:
            label = f"{k['form']} fit{bound}: a level, not an asymptote (not estimable)"
        ax.plot(
            grid,
            curve(k["form"], fit["kappa"], fit["params"], grid),
            style,
            color="C3",
            lw=1.2,
            alpha=1.0 if a["estimable"] else 0.4,
            label=label,
        )
        if name == "free" and a["estimable"] and not math.isnan(lo):
            ax.axhspan(lo, hi, color="C3", alpha=0.08)
    ax.axhline(d, color="black", lw=0.8, ls=":", label=f"d = {d}")
    for i, reading in enumerate(r for r in DIRECT if r in results.get("sigma", {})):
        est = results["sigma"][reading]
        value = est["erank_corrected"]
        if value is None or below_floor(est):  # no value to draw (report/direct.below_floor)
            continue
        unconverged = " (not converged)" if est.get("converged") is False else ""
        ax.axhline(
            value,
            color=f"C{4 + i}",
            lw=1,
            ls="-.",
            label=f"direct erank (corrected), {reading}: {value:.0f}{unconverged}",
        )
    ax.axvline(
        widths[-1],
        color="grey",
        lw=0.6,
        label=f"widest SAE ({widths[-1]:,})"
        + (": the fit beyond it extrapolates" if a["estimable"] else ""),
    )
    ax.set_xscale("log")
    ax.set_yscale("symlog", linthresh=1)  # logarithmic above 1, and zero counts still show
    top = max([r["n_repr"] for r in rows] + [d])
    ax.set_ylim(0, top * 2)
    ax.set_xlabel("SAE width m")
    ax.set_ylabel("features (log above 1)")
    ax.set_title(
        f"{arch} SAEs, layer {results['store']['layer']}: epsilon = "
        f"{a['percentile']:g}th pct of AtP at width {a['reference_width']}"
    )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return save(fig, path)


def plot_atp(results: dict, arch: str, path: Path) -> Path:
    """Per width: the distribution of log10(AtP / epsilon) over features."""
    plt = pyplot()
    a = results["sweep"][arch]
    fig, ax = plt.subplots(figsize=(8, 4.4))
    for i, r in enumerate(a["per_width"]):
        h = r["atp_histogram"]
        edges, counts = h["log10_edges"], h["counts"]
        total = sum(counts) + h["zero"] or 1
        ax.stairs(
            [c / total for c in counts],
            edges,
            color=plt.cm.viridis(i / max(len(a["per_width"]) - 1, 1)),
            label=f"m = {r['width']} ({h['zero']} never fired)",
        )
    ax.axvline(0, color="C3", lw=1, ls="--", label="epsilon")
    ax.set_yscale("log")  # the few causal features sit in the right tail
    ax.set_xlabel("log10(AtP / epsilon)")
    ax.set_ylabel("fraction of features (log)")
    ax.set_title(f"AtP score distributions, {arch} SAEs (right of the line: causal)")
    legend_below(ax)
    fig.tight_layout()
    return save(fig, path)


def plot_subspace(results: dict, path: Path) -> Path:
    """Per SAE width of the headline architecture: each firing feature's AtP against the
    share of its decoder direction inside the causal subspace."""
    plt = pyplot()
    sub = results["subspace"]
    arch = results["headline"]["architecture"]
    rows = sub["saes"][arch]
    eps = results["sweep"][arch]["epsilon"]
    fig, ax = plt.subplots(figsize=(8, 4.6))
    for i, r in enumerate(rows):
        pts = [(a, sh) for a, sh in zip(r["points"]["atp"], r["points"]["share"], strict=True)]
        pts = [(a, sh) for a, sh in pts if a > 0]
        if pts:
            ax.plot(
                *zip(*pts, strict=True),
                ".",
                ms=2,
                alpha=0.5,
                color=plt.cm.viridis(i / max(len(rows) - 1, 1)),
                label=f"m = {r['width']:,}",
            )
    ax.axhline(sub["k"] / sub["d"], color="grey", lw=1, ls=":", label="chance (k / d)")
    ax.axvline(eps, color="C3", lw=1, ls="--", label="epsilon")
    ax.set_xscale("log")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("AtP")
    ax.set_ylabel(f"share of the decoder direction in S (k = {sub['k']})")
    ax.set_title(
        f"Do high-AtP features lie in the causal subspace? ({arch}, Sigma_{sub['reading']})"
    )
    ax.legend(fontsize=7, markerscale=4, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    fig.tight_layout()
    return save(fig, path)


def plot_profile(results: dict, path: Path) -> Path:
    """Every layer from one pass: the corrected erank of each direct reading (bands: 95%
    intervals) and the activations' plug-in erank against depth, then the unbiased PR."""
    plt = pyplot()
    prof = results["profile"]
    layers = sorted(prof["layers"], key=int)
    x = [int(i) for i in layers]
    d = results["store"]["model"]["d_model"]
    fig, (ax_erank, ax_pr) = plt.subplots(1, 2, figsize=(11, 4.2))
    readings = list(prof["layers"][layers[0]])
    for reading in readings:
        rows = [prof["layers"][i][reading] for i in layers]
        corrected = rows[0]["erank_corrected"] is not None
        key = "erank_corrected" if corrected else "erank"
        style = "-o" if corrected else "--"
        (line,) = ax_erank.plot(
            x,
            [r[key] for r in rows],
            style,
            ms=3,
            label=(READING_LABELS.get(reading) or reading) + ("" if corrected else " (plug-in)"),
        )
        if corrected and all(r["erank_corrected_95"] for r in rows):
            ax_erank.fill_between(
                x,
                [r["erank_corrected_95"][0] for r in rows],
                [r["erank_corrected_95"][1] for r in rows],
                color=line.get_color(),
                alpha=0.15,
            )
        if corrected:
            ax_pr.plot(
                x,
                [r["participation_ratio_unbiased"] for r in rows],
                style,
                ms=3,
                color=line.get_color(),
                label=reading,
            )
            if all(r["participation_ratio_unbiased_95"] for r in rows):
                ax_pr.fill_between(
                    x,
                    [r["participation_ratio_unbiased_95"][0] for r in rows],
                    [r["participation_ratio_unbiased_95"][1] for r in rows],
                    color=line.get_color(),
                    alpha=0.15,
                )
    twins = [prof["layers"][i].get(HEADLINE, {}).get("activation_weighted") for i in layers]
    if all(t and t.get("erank_corrected") is not None for t in twins):
        ax_erank.plot(
            x,
            [t["erank_corrected"] for t in twins],
            "-s",
            ms=3,
            color="black",
            label=f"{READING_LABELS.get(HEADLINE, HEADLINE)}, activation-weighted",
        )
    for ax in (ax_erank, ax_pr):
        ax.axvline(prof["run_layer"], color="grey", lw=0.8, ls=":", label="the run's layer")
        ax.set_xlabel("layer (output of block)")
    ax_erank.axhline(d, color="black", lw=0.8, ls=":", label=f"d = {d}")
    ax_erank.set_ylabel("erank")
    ax_erank.set_title("kappa against depth: corrected erank of Sigma")
    legend_below(ax_erank)
    ax_pr.set_ylabel("participation ratio")
    ax_pr.set_title("unbiased participation ratio")
    legend_below(ax_pr)
    fig.tight_layout()
    return save(fig, path)
