"""Rendering a results.json into figures, report.md and report.html, without recomputing
anything."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..controls import control_figures
from ..fileio import atomic_write_bytes
from .figures import plot_atp, plot_profile, plot_sigma, plot_subspace, plot_wedge
from .metric import plot_ladder, plot_weights
from .results import load_results
from .sections import build_report
from .tables import write_csvs


def figure_plan(results: dict, folder: Path) -> dict[str, tuple[Path, Callable[[Path], Path]]]:
    """Every figure of the report: its key, where it goes, and how it is drawn."""
    figures: dict[str, tuple[Path, Callable[[Path], Path]]] = {}
    if results.get("sigma"):
        figures["sigma"] = (folder / "figures" / "sigma.png", lambda p: plot_sigma(results, p))
    for arch in results.get("sweep", {}):
        figures[f"wedge_{arch}"] = (
            folder / "figures" / f"wedge_{arch}.png",
            lambda p, arch=arch: plot_wedge(results, arch, p),
        )
        figures[f"atp_{arch}"] = (
            folder / "figures" / f"atp_{arch}.png",
            lambda p, arch=arch: plot_atp(results, arch, p),
        )
    optional = (  # (key, whether results.json holds what it draws, how)
        ("subspace", (results.get("subspace") or {}).get("reading"), plot_subspace),
        ("profile", results.get("profile"), plot_profile),
        ("weights", results.get("profile") and results.get("weights"), plot_weights),
        ("ladder", results.get("ladder"), plot_ladder),
    )
    for key, present, plot in optional:
        if present:
            figures[key] = (
                folder / "figures" / f"{key}.png",
                lambda p, plot=plot: plot(results, p),
            )
    figures.update(control_figures(results, folder))
    return figures


def render(results_path: Path | str, figures: bool = True, text: bool = True) -> list[Path]:
    """The figures and the text reports (report.md, report.html, tables/*.csv) beside
    results.json, or either alone; returns the paths written."""
    results_path = Path(results_path)
    results = load_results(results_path)
    folder = results_path.parent
    planned = figure_plan(results, folder)
    written = [draw(path) for path, draw in planned.values()] if figures else []
    if text:
        drawn = {key: path for key, (path, _) in planned.items() if path.is_file()}
        doc = build_report(results, drawn)
        md, page = folder / "report.md", folder / "report.html"
        atomic_write_bytes(md, doc.markdown(folder).encode())
        name = results["inputs"]["model"]["name"]
        atomic_write_bytes(page, doc.html(f"causaldim: {name}").encode())
        written += [md, page, *write_csvs(results, folder / "tables")]
    return written


CLAIMS_MARK = "<!-- written by causaldim claims -->"


def write_claims(runs: list[Path], out: Path | None) -> str:
    """The claims tables of finished runs (each its folder or results.json), one section
    each, as Markdown; written to out if given: a new file, or one this wrote before
    (nothing else is overwritten)."""
    from ..errors import UsageError
    from ..presets import command_for
    from .claims_doc import across_section, atlas_section, claims_section, overview
    from .doc import Doc

    if out is not None and out.exists() and not out.read_text().startswith(CLAIMS_MARK):
        raise UsageError(
            f"{out} exists and was not written by `causaldim claims`; pass a new --out"
        )
    atlases = [p for p in runs if _is_atlas(p)]
    loaded = [
        (p, load_results(p / "results.json" if p.is_dir() else p)) for p in runs if p not in atlases
    ]
    if not loaded:
        raise UsageError("causaldim claims: pass at least one run's folder or results.json")
    doc = Doc()
    doc.h(1, "The paper's claims, tested")
    if len(loaded) > 1:
        overview(doc, [(str(p), r) for p, r in loaded])
    for path, results in loaded:
        s, model = results["store"], results["inputs"]["model"]["name"]
        doc.h(2, f"{model} layer {s['layer']}, preset {results['preset']}: {path}")
        doc.p(f"Run as `{command_for(results['preset'], results['config'])}`.")
        claims_section(doc, results, level=3)
    if len(loaded) > 1:
        across_section(doc, [(str(p), r) for p, r in loaded])
    for path in atlases:
        atlas_section(doc, path)
    text = CLAIMS_MARK + "\n\n" + doc.markdown(out.parent if out else Path.cwd())
    if out is not None:
        atomic_write_bytes(out, text.encode())
    return text


def _is_atlas(path: Path) -> bool:
    """An atlas's folder or its atlas.json (`causaldim atlas`), not a run's."""
    return path.name == "atlas.json" or (path.is_dir() and (path / "atlas.json").is_file())
