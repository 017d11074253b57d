"""Figures and text rendered from results.json alone, so a report can be re-rendered
without recomputing anything."""

from __future__ import annotations

import json
from pathlib import Path

READING_LABELS = {
    "loss": "loss  (E[g g^T])",
    "logits": "logits (E[J^T J], Gaussian probes)",
    "fisher": "fisher (output Fisher, sampled y)",
    "activations": "activations (covariance of h, reference)",
}


def load_results(path: Path | str) -> dict:
    return json.loads(Path(path).read_text())


def plot_sigma(results: dict, path: Path) -> Path:
    """Normalised spectra of every Sigma reading, and erank against sample count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sigma = results["sigma"]
    d = results["store"]["model"]["d_model"]
    fig, (ax_spec, ax_conv) = plt.subplots(1, 2, figsize=(11, 4.2))
    for reading, est in sigma.items():
        lam = [max(x, 0.0) for x in est["eigenvalues"]]
        total = sum(lam) or 1.0
        style = "--" if reading == "activations" else "-"
        ax_spec.loglog(
            range(1, len(lam) + 1),
            [x / total for x in lam],
            style,
            label=f"{READING_LABELS.get(reading, reading)}: erank {est['erank']:.0f}, "
            f"PR {est['participation_ratio']:.0f}",
        )
        conv = est["convergence"]
        ax_conv.semilogx(
            [c["n_samples"] for c in conv],
            [c["erank"] for c in conv],
            style + "o",
            label=reading,
        )
        if est.get("bootstrap"):  # the interval need not contain the (biased) estimate
            lo, hi = est["bootstrap"]["erank_95"]
            ax_conv.vlines(
                conv[-1]["n_samples"], lo, hi, lw=3, alpha=0.6, color=ax_conv.lines[-1].get_color()
            )
    ax_spec.set_xlabel("eigenvalue index")
    ax_spec.set_ylabel("eigenvalue / trace")
    ax_spec.set_title(f"Sigma spectra, layer {results['store']['layer']} (d = {d})")
    ax_spec.legend(fontsize=7)
    ax_conv.axhline(d, color="grey", lw=0.8, ls=":")
    ax_conv.set_xlabel("rank-1 samples")
    ax_conv.set_ylabel("erank")
    ax_conv.set_title("convergence (95% bootstrap interval at the end)")
    ax_conv.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def sigma_table(results: dict) -> str:
    """A plain-text table of the direct estimates."""
    d = results["store"]["model"]["d_model"]
    rows = [
        f"{'reading':<12} {'erank':>8} {'95% interval':>17} {'erank/d':>8} {'PR':>7} "
        f"{'samples':>9} {'per dim':>8}"
    ]
    for reading, est in results["sigma"].items():
        lo, hi = (est.get("bootstrap") or {}).get("erank_95", [float("nan")] * 2)
        rows.append(
            f"{reading:<12} {est['erank']:8.1f} [{lo:7.1f}, {hi:7.1f}] "
            f"{est['erank'] / d:8.3f} {est['participation_ratio']:7.1f} "
            f"{est['n_samples']:9d} {est['samples_per_dim']:8.1f}"
        )
        if est.get("warning"):
            rows.append(f"  warning: {est['warning']}")
    return "\n".join(rows)


def render(results_path: Path | str) -> list[Path]:
    """Every figure of a results file, written beside it under figures/."""
    results_path = Path(results_path)
    results = load_results(results_path)
    figures = []
    if results.get("sigma"):
        figures.append(plot_sigma(results, results_path.parent / "figures" / "sigma.png"))
    return figures
