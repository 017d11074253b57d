"""Figures, report.md and report.html, rendered from results.json alone, so that a report
can be re-rendered without recomputing anything."""

from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path

import numpy as np

from .errors import UsageError
from .fileio import atomic_write_bytes, read_sealed_json

SCHEMA = "causaldim.results/2"

READING_LABELS = {
    "loss": "loss  (E[g g^T])",
    "logits": "logits (E[J^T J], Gaussian probes)",
    "fisher": "fisher (output Fisher, sampled y)",
    "activations": "activations (covariance of h, reference)",
}
DIRECT = ("loss", "logits", "fisher")


def load_results(path: Path | str) -> dict:
    """A results.json of this schema, or a one-line UsageError naming the fix."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{path} does not exist; pass the results.json of a run")
    results = read_sealed_json(path, "results (causaldim run with the same --out)")
    schema = results.get("schema") if isinstance(results, dict) else None
    if schema != SCHEMA:
        raise UsageError(
            f"{path} has schema {schema or 'none (an older causaldim)'}, this causaldim "
            f"reads {SCHEMA}: re-run `causaldim run` with the same --out to rebuild it"
        )
    return results


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    """The figure as a PNG, written atomically like every other artifact."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=130)
    _pyplot().close(fig)
    atomic_write_bytes(path, buffer.getvalue())
    return path


def plot_sigma(results: dict, path: Path) -> Path:
    """Normalised spectra of every Sigma reading, and erank against sample count."""
    plt = _pyplot()
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
            [c["n_samples"] for c in conv], [c["erank"] for c in conv], style + "o", label=reading
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
    from matplotlib.ticker import NullFormatter

    ax_conv.xaxis.set_minor_formatter(NullFormatter())  # minor labels collide on a log axis
    ax_conv.set_xlabel("rank-1 samples")
    ax_conv.set_ylabel("erank")
    ax_conv.set_title("convergence (95% bootstrap interval at the end)")
    ax_conv.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path)


def _curve(form: str, fit: dict, widths: list[float]) -> list[float]:
    from .fit import FORMS

    return list(FORMS[form].curve(np.asarray(widths, float), fit["kappa"], *fit["params"].values()))


def plot_wedge(results: dict, arch: str, path: Path) -> Path:
    """N_repr and N_causal against width with intervals, the fitted curves with kappa_hat
    and its interval, d, and the direct eranks beside them."""
    plt = _pyplot()
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
    grid = [widths[0] * (widths[-1] * 8 / widths[0]) ** (i / 200) for i in range(201)]
    for name, style in (("free", "-"), ("at_most_d", "--")):
        k = a["kappa"][name]
        fit = k["fits"][k["form"]]
        lo, hi = k["interval_95"]
        bound = "" if name == "free" else " (kappa <= d)"
        ax.plot(
            grid,
            _curve(k["form"], fit, grid),
            style,
            color="C3",
            lw=1.2,
            label=f"{k['form']} fit{bound}: kappa_hat {k['kappa']:.0f} [{lo:.0f}, {hi:.0f}]",
        )
        if name == "free" and not math.isnan(lo):
            ax.axhspan(lo, hi, color="C3", alpha=0.08)
    ax.axhline(d, color="black", lw=0.8, ls=":", label=f"d = {d}")
    for i, reading in enumerate(r for r in DIRECT if r in results.get("sigma", {})):
        est = results["sigma"][reading]
        ax.axhline(
            est["erank"],
            color=f"C{4 + i}",
            lw=1,
            ls="-.",
            label=f"direct erank, {reading}: {est['erank']:.0f}",
        )
    ax.axvline(widths[-1], color="grey", lw=0.6)
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
    return _save(fig, path)


def plot_atp(results: dict, arch: str, path: Path) -> Path:
    """Per width: the distribution of log10(AtP / epsilon) over features."""
    plt = _pyplot()
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
    ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path)


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


def _hardware(config: dict) -> str:
    h, sweep = config["harvest"], config["sweep"]
    return (
        f"ran on {h.get('device', 'cpu')}: model pass in {h['dtype']}, batches of "
        f"{h['batch_size']} sequences; SAE encoder product in {sweep['sae_dtype']}; SAE jobs "
        + ("on Ray" if sweep.get("executor") == "ray" else "in process")
    )


def summary(results: dict) -> str:
    """The few lines printed at the end of a run."""
    arch = results["headline"]
    a = results["sweep"][arch]
    free, bounded = a["kappa"]["free"], a["kappa"]["at_most_d"]
    w = a["wedge"]
    lines = [
        f"{arch} sweep {a['per_width'][0]['width']}..{a['per_width'][-1]['width']}: "
        f"N_repr x{_num(w['n_repr_growth'], 2)}, N_causal x{_num(w['n_causal_growth'], 2)} "
        f"over x{w['width_ratio']:g} in width; epsilon {a['epsilon']:.3g}",
        f"kappa_hat {free['kappa']:.0f} {_ci(free['interval_95'])} ({free['form']}), "
        f"kappa_hat/d {free['kappa_over_d']:.2f}, coverage {_pct(free['coverage'])}; "
        f"constrained to d: {bounded['kappa']:.0f} {_ci(bounded['interval_95'])}",
    ]
    lines += [f"warning: {x}" for x in a["warnings"]]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- report text


def _num(x, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if isinstance(x, int) or (abs(x) >= 100 and digits <= 1):
        return f"{x:,.0f}"
    return f"{x:,.{digits}f}"


def _pct(x) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{100 * x:.1f}%"


def _ci(iv) -> str:
    if not iv or any(math.isnan(v) for v in iv):
        return "[n/a]"
    return f"[{iv[0]:,.0f}, {iv[1]:,.0f}]"


class Doc:
    """A report as a list of blocks, written out both as Markdown and as HTML."""

    def __init__(self):
        self.blocks: list[tuple] = []

    def h(self, level: int, text: str):
        self.blocks.append(("h", level, text))

    def p(self, text: str):
        self.blocks.append(("p", text))

    def ul(self, items: list[str]):
        if items:
            self.blocks.append(("ul", items))

    def table(self, header: list[str], rows: list[list]):
        self.blocks.append(("table", header, [[str(c) for c in r] for r in rows]))

    def img(self, path: Path, alt: str):
        self.blocks.append(("img", path, alt))

    def markdown(self, base: Path) -> str:
        out = []
        for b in self.blocks:
            if b[0] == "h":
                out.append("#" * b[1] + " " + b[2])
            elif b[0] == "p":
                out.append(b[1])
            elif b[0] == "ul":
                out.append("\n".join(f"- {x}" for x in b[1]))
            elif b[0] == "table":
                out.append(
                    "\n".join(
                        "| " + " | ".join(r) + " |" for r in [b[1], ["---"] * len(b[1]), *b[2]]
                    )
                )
            elif b[0] == "img":
                out.append(f"![{b[2]}]({b[1].relative_to(base).as_posix()})")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        e = html.escape
        out = [
            "<!doctype html><html><head><meta charset='utf-8'>",
            f"<title>{e(title)}</title><style>body{{font-family:sans-serif;max-width:980px;"
            "margin:2em auto;line-height:1.45}table{border-collapse:collapse;margin:1em 0}"
            "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
            "th{background:#f3f3f3}td:first-child{text-align:left}img{max-width:100%}"
            "</style></head><body>",
        ]
        for b in self.blocks:
            if b[0] == "h":
                out.append(f"<h{b[1]}>{e(b[2])}</h{b[1]}>")
            elif b[0] == "p":
                out.append(f"<p>{e(b[1])}</p>")
            elif b[0] == "ul":
                out.append("<ul>" + "".join(f"<li>{e(x)}</li>" for x in b[1]) + "</ul>")
            elif b[0] == "table":
                head = "".join(f"<th>{e(c)}</th>" for c in b[1])
                body = "".join(
                    "<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in b[2]
                )
                out.append(f"<table><tr>{head}</tr>{body}</table>")
            elif b[0] == "img":  # inlined, so that the file travels alone
                data = base64.b64encode(b[1].read_bytes()).decode()
                out.append(f"<img alt='{e(b[2])}' src='data:image/png;base64,{data}'>")
        return "\n".join(out + ["</body></html>\n"])


def build_report(results: dict, figures: dict[str, Path]) -> Doc:
    s = results["store"]
    d = s["model"]["d_model"]
    arch = results["headline"]
    a = results["sweep"][arch]
    free, bounded = a["kappa"]["free"], a["kappa"]["at_most_d"]
    sigma = results.get("sigma", {})
    paper = results["paper"]
    doc = Doc()
    name = results["inputs"]["model"]["name"]
    doc.h(1, f"Causal dimensionality of {name}, layer {s['layer']}")
    doc.p(
        f"Residual stream at the {s['site']}, d = {d}; corpus "
        f"{results['inputs']['corpus']['id']}; "
        f"{s['tokens']['train']:,} train and {s['tokens']['eval']:,} eval tokens in sequences "
        f"of {s['seq_len']}; outliers left out: {s['outliers']['n_outliers']:,} tokens "
        f"carrying {_pct(s['outliers']['variance_share'])} of the residual variance. "
        f"Preset {results['preset']}, seed {results['seed']}, causaldim "
        f"{results['causaldim_version']}, {results['seconds']['total']:.0f} s in all."
    )

    doc.h(2, "Headline")
    items = [
        f"SAE estimate ({arch}, {free['form']} fit chosen by AIC): kappa_hat = "
        f"{free['kappa']:,.0f}, 95% bootstrap interval {_ci(free['interval_95'])}; "
        f"kappa_hat / d = {free['kappa_over_d']:.2f}; coverage at the widest SAE "
        f"N_causal(m_max) / kappa_hat = {_pct(free['coverage'])}; 95% of kappa_hat is "
        f"reached at width {_num(free['width_95'])}.",
        f"Constrained to kappa <= d: kappa_hat = {bounded['kappa']:,.0f} "
        f"{_ci(bounded['interval_95'])} ({bounded['form']}).",
    ]
    for reading in DIRECT:
        if reading in sigma:
            est = sigma[reading]
            iv = (est.get("bootstrap") or {}).get("erank_95")
            items.append(
                f"Direct estimate, {reading}: erank(Sigma) = {est['erank']:.0f} {_ci(iv)}, "
                f"erank/d = {est['erank_over_d']:.2f}, PR = {est['participation_ratio']:.0f}."
            )
    w = a["wedge"]
    items.append(
        f"The wedge over x{w['width_ratio']:g} in width: N_repr grows "
        f"x{_num(w['n_repr_growth'], 2)} (log-log slope {_num(w['n_repr_loglog_slope'], 2)}), "
        f"N_causal x{_num(w['n_causal_growth'], 2)} (slope "
        f"{_num(w['n_causal_loglog_slope'], 2)}); at the widest SAE "
        f"{_pct(a['per_width'][-1]['inert_fraction'])} of firing features fall below epsilon."
    )
    doc.ul(items)
    if a["warnings"]:
        doc.h(3, "Read with care")
        doc.ul(a["warnings"])

    doc.h(2, "Beside the paper")
    doc.p(
        f"The paper: {paper['source']} (d = {paper['d_model']:,}, x{paper['width_ratio']} "
        "in width). Counts are forced by calibration at the reference width; compare "
        "growth and shapes, not levels."
    )
    pr = sigma.get("loss", {}).get("participation_ratio")
    last = a["per_width"][-1]
    doc.table(
        ["quantity", "this run", "paper"],
        [
            ["width ratio of the sweep", f"x{w['width_ratio']:g}", f"x{paper['width_ratio']}"],
            ["N_repr growth", f"x{_num(w['n_repr_growth'], 2)}", f"x{paper['n_repr_growth']}"],
            [
                "N_causal growth",
                f"x{_num(w['n_causal_growth'], 2)}",
                f"x{paper['n_causal_growth']}",
            ],
            [
                "firing features below epsilon (widest SAE)",
                _pct(last["inert_fraction"]),
                _pct(paper["inert_fraction"]),
            ],
            [
                "kappa_hat [95% CI]",
                f"{free['kappa']:,.0f} {_ci(free['interval_95'])}",
                f"{paper['kappa_hat']:,} {_ci(paper['kappa_hat_95'])}",
            ],
            ["kappa_hat / d", f"{free['kappa_over_d']:.2f}", f"{paper['kappa_over_d']}"],
            ["kappa_PR (direct, loss)", _num(pr), f"{paper['kappa_pr']}"],
            ["coverage at the widest SAE", _pct(free["coverage"]), _pct(paper["coverage"])],
            [
                "width for (95%) recovery",
                _num(free["width_95"]),
                f"{paper['width_full_recovery']:,}",
            ],
        ],
    )

    for arch_name, arch_results in results["sweep"].items():
        doc.h(2, f"The sweep: {arch_name} SAEs")
        doc.p(
            f"epsilon = {arch_results['epsilon']:.4g} (the {arch_results['percentile']:g}th "
            f"percentile of AtP at width {arch_results['reference_width']}; 95% interval "
            f"{_sci(arch_results['epsilon_95'])}); {arch_results['n_eval_tokens']:,} eval "
            f"tokens in {arch_results['blocks']} blocks, {arch_results['bootstrap']} "
            "bootstrap resamples (re-scored, re-calibrated, re-counted, re-fitted)."
        )
        doc.table(
            [
                "width",
                "N_repr",
                "N_repr 95%",
                "N_causal",
                "N_causal 95%",
                "inert",
                "L0",
                "FVE",
                "dead",
                "CE rec.",
            ],
            [
                [
                    f"{r['width']:,}",
                    f"{r['n_repr']:,}",
                    _ci(r.get("n_repr_95")),
                    f"{r['n_causal']:,}",
                    _ci(r.get("n_causal_95")),
                    _pct(r["inert_fraction"]),
                    _num(r["l0"]),
                    _num(r["fraction_variance_explained"], 3),
                    _pct(r["dead_fraction"]),
                    _num(r["ce_loss_recovered"], 3),
                ]
                for r in arch_results["per_width"]
            ],
        )
        kappas = arch_results["kappa"]
        binds = any(
            kappas["free"]["fits"][f]["kappa"] != kappas["at_most_d"]["fits"][f]["kappa"]
            for f in kappas["free"]["fits"]
        )
        for bound_name, label in (("free", "free"), ("at_most_d", "kappa <= d")):
            k = kappas[bound_name]
            if bound_name == "at_most_d" and not binds:
                doc.p(f"The constraint kappa <= d = {d} binds no fit: the same table holds.")
                continue
            doc.p(f"Saturating fits ({label}); chosen by AIC: {k['form']}.")
            doc.table(
                ["form", "kappa_hat", "95% CI", "AIC", "width for 95%", "won in resamples", "note"],
                [
                    [
                        form,
                        f"{fit['kappa']:,.0f}",
                        _ci(fit["interval_95"]),
                        f"{fit['aic']:.2f}",
                        _num(fit["width_95"]),
                        _pct(k["form_frequency"].get(form, math.nan)),
                        f"{fit['at_bound']} at its bound" if fit["at_bound"] else "",
                    ]
                    for form, fit in k["fits"].items()
                ],
            )
        for key in (f"wedge_{arch_name}", f"atp_{arch_name}"):
            if key in figures:
                doc.img(figures[key], key)

    if sigma:
        doc.h(2, "Direct Sigma")
        rows = []
        for reading, est in sigma.items():
            iv = (est.get("bootstrap") or {}).get("erank_95")
            rows.append(
                [
                    reading,
                    f"{est['erank']:.1f}",
                    _ci(iv),
                    f"{est['erank_over_d']:.3f}",
                    f"{est['participation_ratio']:.1f}",
                    f"{est['n_samples']:,}",
                    est.get("warning") or "",
                ]
            )
        doc.table(["reading", "erank", "95% CI", "erank/d", "PR", "samples", "warning"], rows)
        if "sigma" in figures:
            doc.img(figures["sigma"], "sigma")

    from .controls_report import add_sections  # it builds on this module's helpers

    add_sections(doc, results, figures)
    doc.h(2, "Provenance")
    ce = results.get("ce")
    identity = results["inputs"]["model"]
    files = identity.get("files") or {}
    items = [
        f"model {name} ({identity.get('family')}): "
        + (
            ", ".join(f"{f} {digest}" for f, digest in files.items())
            or f"hub {identity.get('hub_id')} revision {identity.get('revision')}"
        ),
        f"corpus {results['inputs']['corpus']['id']}, sha256 "
        f"{results['inputs']['corpus'].get('sha256', 'n/a')}",
        f"store {results['inputs']['store']['path']} "
        f"({'reused' if s['reused'] else 'written by this run'}), manifest sha256 "
        f"{results['inputs']['store']['manifest_sha256']}",
        _hardware(results["config"]),
        "versions: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items()),
        "seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in results["seconds"].items()),
    ]
    if ce:
        items.append(
            f"CE loss recovered on {ce['n_predictions']:,} predictions: clean loss "
            f"{ce['clean_loss']:.3f}, mean-ablated {ce['mean_ablated_loss']:.3f}"
        )
    doc.ul(items)
    return doc


def _sci(iv) -> str:
    return f"[{iv[0]:.3g}, {iv[1]:.3g}]" if iv else "[n/a]"


def render(results_path: Path | str, figures: bool = True, text: bool = True) -> list[Path]:
    """The figures and the text reports (report.md, report.html) beside results.json, or
    either alone; returns the paths written."""
    results_path = Path(results_path)
    results = load_results(results_path)
    folder = results_path.parent
    paths = {}
    if results.get("sigma"):
        paths["sigma"] = folder / "figures" / "sigma.png"
    for arch in results.get("sweep", {}):
        paths[f"wedge_{arch}"] = folder / "figures" / f"wedge_{arch}.png"
        paths[f"atp_{arch}"] = folder / "figures" / f"atp_{arch}.png"
    from . import controls_report

    control_paths = controls_report.figure_paths(results, folder)
    if figures:
        controls_report.plot(results, control_paths)
        for key, path in paths.items():
            kind, _, arch = key.partition("_")
            if kind == "sigma":
                plot_sigma(results, path)
            elif kind == "wedge":
                plot_wedge(results, arch, path)
            else:
                plot_atp(results, arch, path)
    paths.update(control_paths)
    written = list(paths.values()) if figures else []
    if text:
        doc = build_report(results, {k: p for k, p in paths.items() if p.is_file()})
        md, page = folder / "report.md", folder / "report.html"
        atomic_write_bytes(md, doc.markdown(folder).encode())
        name = results["inputs"]["model"]["name"]
        atomic_write_bytes(page, doc.html(f"causaldim: {name}").encode())
        written += [md, page]
    return written
