"""The comparison's figures, drawn from compare.json alone (report/compare.py builds it)."""

from __future__ import annotations

import math
from pathlib import Path

from ..fmt import growth
from ..measures.sigma import HEADLINE
from .figures import legend_below, pyplot, save


def _color(i: int) -> str:
    return f"C{i % 10}"


def plot_kappa(data: dict, path: Path) -> Path:
    """Per run: the corrected erank of each direct reading with its 95% interval, one
    marker per reading; kappa_hat with its interval where estimable; d as a grey dash."""
    plt = pyplot()
    runs, readings = data["runs"], data["readings"]
    fig, ax = plt.subplots(figsize=(max(8.5, 1.3 * len(runs) + 5), 4.6))
    markers = {"loss": "o", "logits": "s", "fisher": "^"}
    slots = len(readings) + 1
    offsets = [(j - (slots - 1) / 2) * 0.7 / slots for j in range(slots)]
    open_marker = False
    for j, reading in enumerate(readings):
        # a reading its run gives as n/a is not drawn; one not converged, an open marker
        name = "direct kappa (logits, gauge-invariant)" if reading == HEADLINE else reading
        labelled = False
        for converged in (True, False):
            xs, ys, lo, hi = [], [], [], []
            for i, run in enumerate(runs):
                est = run["sigma"].get(reading)
                if not est or est["erank_corrected"] is None:
                    continue
                if (est.get("converged") is not False) != converged:
                    continue
                value, iv = est["erank_corrected"], est["erank_corrected_95"]
                xs.append(i + offsets[j])
                ys.append(value)
                lo.append(value - iv[0] if iv else 0.0)
                hi.append(iv[1] - value if iv else 0.0)
            if not xs:
                continue
            open_marker |= not converged
            ax.errorbar(
                xs,
                ys,
                [lo, hi],
                fmt=markers.get(reading, "D"),
                mfc=None if converged else "none",
                color=f"C{j}",
                capsize=3,
                label=None if labelled else f"{name}: corrected erank, 95%",
            )
            labelled = True
    if open_marker:
        ax.plot([], [], "s", mfc="none", color="grey", label="open: not converged")
    xs, ys, lo, hi = [], [], [], []
    for i, run in enumerate(runs):
        k = run["kappa_hat"]
        if k["estimable"] and k["kappa"] is not None and not math.isnan(k["kappa"]):
            iv = k["interval_95"]
            ok = iv and not any(v is None or math.isnan(v) for v in iv)
            xs.append(i + offsets[-1])
            ys.append(k["kappa"])
            lo.append(max(k["kappa"] - iv[0], 0) if ok else 0.0)
            hi.append(max(iv[1] - k["kappa"], 0) if ok else 0.0)
    if xs:
        ax.errorbar(
            xs, ys, [lo, hi], fmt="D", mfc="none", color="C3", capsize=3, label="kappa_hat (SAEs)"
        )
    for i, run in enumerate(runs):
        ax.hlines(run["d_model"], i - 0.42, i + 0.42, color="grey", lw=1, ls=":")
    ax.plot([], [], color="grey", lw=1, ls=":", label="d of the run")
    ax.set_xticks(range(len(runs)), [run["label"] for run in runs], rotation=20, ha="right")
    ax.set_xlim(-0.6, len(runs) - 0.4)
    ax.set_ylim(bottom=0)
    missing = sum(not r["kappa_hat"]["estimable"] for r in runs)
    title = "Corrected eranks per reading and run, kappa_hat beside it"
    if missing:
        title += f" (not estimable in {missing} of {len(runs)} runs)"
    ax.set_xlabel("run")
    ax.set_ylabel("kappa (erank)")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save(fig, path)


def plot_wedges(data: dict, path: Path) -> Path:
    """N_repr (dashed, open) and N_causal (solid, with 95% intervals) against width, one
    colour per run."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 5))
    top = 1
    for i, run in enumerate(data["runs"]):
        ms = max(8 - 1.5 * i, 3)  # smaller markers on top: runs that coincide still show
        pts = run["wedge"]["points"]
        widths = [p["width"] for p in pts]
        ax.plot(
            widths,
            [p["n_repr"] for p in pts],
            "o--",
            mfc="none",
            ms=ms,
            color=_color(i),
            label=f"{run['label']}: N_repr {growth(run['wedge']['n_repr_growth'])}",
        )
        y = [p["n_causal"] for p in pts]
        err = None
        if all(p.get("n_causal_95") for p in pts):
            err = [
                [max(v - p["n_causal_95"][0], 0) for v, p in zip(y, pts, strict=True)],
                [max(p["n_causal_95"][1] - v, 0) for v, p in zip(y, pts, strict=True)],
            ]
        ax.errorbar(
            widths,
            y,
            yerr=err,
            fmt="s-",
            ms=ms,
            color=_color(i),
            capsize=3,
            label=f"{run['label']}: N_causal {growth(run['wedge']['n_causal_growth'])}",
        )
        top = max([top, *(p["n_repr"] for p in pts)])
    ax.set_xscale("log")
    ax.set_yscale("symlog", linthresh=1)  # zero counts still show
    ax.set_ylim(0, top * 2)
    ax.set_xlabel("SAE width m")
    ax.set_ylabel("features (log above 1)")
    ax.set_title("The wedges: N_repr (dashed) and N_causal (solid) of each run's headline sweep")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save(fig, path)


def plot_atp_overlaid(data: dict, path: Path) -> Path:
    """log10(AtP / epsilon) over features, each run at its reference width (where its
    epsilon is set) and at its widest, normalised as in the run's own AtP figure."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4), sharey=True)
    for ax, which in zip(axes, ("reference", "widest"), strict=True):
        for i, run in enumerate(data["runs"]):
            hists = run["atp_histograms"]
            if which == "reference":
                h = next((x for x in hists if x["width"] == run["reference_width"]), hists[0])
            else:
                h = hists[-1]
            counts = h["counts"]
            total = sum(counts) + h["zero"] or 1
            ax.stairs(
                [c / total for c in counts],
                h["log10_edges"],
                color=_color(i),
                label=f"{run['label']}: m = {h['width']}, epsilon {run['epsilon']:.3g}",
            )
        ax.axvline(0, color="C3", lw=1, ls="--", label="epsilon")
        ax.set_yscale("log")
        ax.set_xlabel("log10(AtP / epsilon)")
        ax.set_title(f"at each run's {which} width")
        legend_below(ax)
    axes[0].set_ylabel("fraction of features (log)")
    fig.suptitle("AtP distributions, each normalised by its run's epsilon (right: causal)")
    return save(fig, path)


def plot_profiles(data: dict, path: Path) -> Path:
    """Every layer's corrected erank (95% bands) for the runs that have a profile, one
    panel per direct reading; x is the layer, or layer / (n_layers - 1) where the models
    differ. Each run's own layer is circled."""
    plt = pyplot()
    runs = [(i, r) for i, r in enumerate(data["runs"]) if r["profile"]]
    readings = [
        r
        for r in data["readings"]
        if any(r in row["readings"] for _, x in runs for row in x["profile"]["layers"])
    ]
    fig, axes = plt.subplots(1, len(readings), figsize=(4.6 * len(readings), 4.2), squeeze=False)
    key = data["profile_x"]
    for ax, reading in zip(axes[0], readings, strict=True):
        for i, run in runs:
            rows = [row for row in run["profile"]["layers"] if reading in row["readings"]]
            x = [row[key] for row in rows]
            est = [row["readings"][reading] for row in rows]
            ax.plot(
                x,
                [e["erank_corrected"] for e in est],
                "-o",
                ms=3,
                color=_color(i),
                label=run["label"],
            )
            if all(e["erank_corrected_95"] for e in est):
                ax.fill_between(
                    x,
                    [e["erank_corrected_95"][0] for e in est],
                    [e["erank_corrected_95"][1] for e in est],
                    color=_color(i),
                    alpha=0.15,
                )
            here = [
                (row[key], row["readings"][reading]["erank_corrected"])
                for row in rows
                if row["layer"] == run["profile"]["run_layer"]
            ]
            if here:
                ax.plot(*here[0], "o", ms=9, mfc="none", color=_color(i))
        ax.set_xlabel("layer" if key == "layer" else "relative depth, layer / (n_layers - 1)")
        ax.set_ylabel("erank (corrected)")
        ax.set_title(f"{reading}: kappa against depth")
        legend_below(ax)
    fig.suptitle("Profiles over depth (circled: each run's own layer)")
    return save(fig, path)


def figure_plan(data: dict) -> dict:
    plan = {"kappa": plot_kappa, "wedge": plot_wedges, "atp": plot_atp_overlaid}
    if any(r["profile"] for r in data["runs"]):
        plan["profile"] = plot_profiles
    return plan
