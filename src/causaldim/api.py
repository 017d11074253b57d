"""The Python API: `measure(...)` runs what `causaldim run` runs and returns a Results;
`load(OUT)` reads a finished run. Results hold results.json and read it as numbers,
tables (pandas DataFrames where pandas is installed), figures and an HTML display."""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

from .errors import UsageError
from .measures.sigma import HEADLINE
from .report.direct import below_floor
from .report.results import load_results
from .report.tables import TABLES, Row, write_csvs


class Estimate(NamedTuple):
    value: float | None  # None below the report's floor (see plug_in)
    low: float | None  # the 95% interval
    high: float | None
    reading: str | None = None  # a direct estimate's reading (loss, logits, ...)
    converged: bool | None = None  # a direct estimate's: enough independent samples
    eval_tokens_needed: int | None = None  # about, where it has not converged
    # Below REPORT_FLOOR independent equivalents per dimension no corrected value is given
    # (the correction moves it by half or more); the plug-in erank, which reads low, is.
    plug_in: float | None = None

    def __repr__(self) -> str:
        if self.value is None:
            text = f"n/a (plug-in {self.plug_in:.1f}, which reads low"
            text += ", too few independent samples per dimension to correct it)"
        else:
            interval = "" if self.low is None else f" [{self.low:.1f}, {self.high:.1f}]"
            text = f"{self.value:.1f}{interval}"
        if self.reading:
            text = f"{self.reading}: {text}"
        if self.converged is False:
            more = self.eval_tokens_needed
            text += " (not converged" + (f"; about {more:,} eval tokens would do)" if more else ")")
        return f"Estimate({text})"


class Results:
    """A finished run, read from its results.json (the single source of every number)."""

    def __init__(self, path: Path | str):
        path = Path(path)
        self.path = path / "results.json" if path.is_dir() else path
        self.data: dict = load_results(self.path)
        self.folder = self.path.parent

    @property
    def model(self) -> str:
        return self.data["inputs"]["model"]["name"]

    @property
    def layer(self) -> int:
        return self.data["store"]["layer"]

    @property
    def kappa(self) -> Estimate | None:
        """The direct kappa: erank(E[J^T (I - 11^T/V) J]), the gauge-invariant logits
        reading, corrected for finite samples, with its 95% interval and whether it
        converged (value None below the report's floor of independent samples per
        dimension, as the report prints n/a); None where the run had no logit probes."""
        return self.direct(HEADLINE) if HEADLINE in self.data["sigma"] else None

    @property
    def kappa_act(self) -> Estimate | None:
        """The direct kappa in the activations' metric: erank(C^1/2 Sigma C^1/2), C the
        activations' covariance, which no invertible linear map of the residual changes
        (None where the run had no logit probes, or predates it)."""
        e = self.data["sigma"].get(HEADLINE) or {}
        return self.direct(HEADLINE, "act") if e.get("activation_weighted") else None

    def direct(self, reading: str, metric: str = "raw") -> Estimate:
        """One reading's erank: corrected for finite samples (loss, logits,
        logits_uncentred, fisher), or the plug-in of the activations' reference line;
        metric "act": the output reading weighted by the activations (kappa_act)."""
        if reading not in self.data["sigma"]:
            raise KeyError(f"no {reading!r} reading; this run has {', '.join(self.data['sigma'])}")
        if metric not in ("raw", "act"):
            raise ValueError(f"metric must be 'raw' or 'act', not {metric!r}")
        e = self.data["sigma"][reading]
        if metric == "act":
            if not e.get("activation_weighted"):
                raise KeyError(f"the {reading!r} reading has no activation-weighted twin")
            e = e["activation_weighted"]
        needed = e.get("eval_tokens_needed")
        if below_floor(e):  # as the report: no value, the plug-in and the tokens that would do
            return Estimate(None, None, None, reading, False, needed, e["erank"])
        if e.get("erank_corrected") is None:  # activations: a plug-in, no interval
            return Estimate(e["erank"], None, None, reading)
        lo, hi = e.get("erank_corrected_95") or (None, None)
        return Estimate(e["erank_corrected"], lo, hi, reading, e.get("converged"), needed)

    @property
    def kappa_hat(self) -> Estimate | None:
        """The SAE-sweep estimate of the headline architecture (free fit), or None when it
        is not estimable (`not_estimable` says why)."""
        a = self.data["sweep"][self.data["headline"]["architecture"]]
        if not a["estimable"]:
            return None
        free = a["kappa"]["free"]
        return Estimate(free["kappa"], *free["interval_95"])

    @property
    def warnings(self) -> list[dict]:
        """Every warning the run raised: code, severity ("caution" where it touches the
        headline's numbers, else "note") and message, as results.json's `warnings`."""
        return list(self.data.get("warnings") or [])

    @property
    def not_estimable(self) -> str | None:
        return self.data["sweep"][self.data["headline"]["architecture"]].get("not_estimable")

    @property
    def headline(self) -> str:
        """The lines a run prints at its end: the wedge, kappa_hat (or why not), warnings."""
        from .report.direct import direct_kappa
        from .report.sections import summary

        d = self.data["store"]["model"]["d_model"]
        return "\n".join([*direct_kappa(self.data["sigma"], d)[:1], summary(self.data)])

    def table(self, name: str) -> list[Row]:
        """A table as rows (dicts): sigma, widths, fits, profile or saes."""
        if name not in TABLES:
            raise KeyError(f"no table {name!r}; choose one of {', '.join(TABLES)}")
        return TABLES[name](self.data)

    def to_dataframe(self, name: str = "sigma"):
        """A table as a pandas DataFrame (pip install pandas, or causaldim[hub])."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError(
                "to_dataframe needs pandas: pip install pandas (or use .table(name))"
            ) from None
        return pd.DataFrame(self.table(name))

    def to_csv(self, folder: Path | str | None = None) -> list[Path]:
        """Every table as NAME.csv in folder (default: OUT/tables, as a run writes them)."""
        return write_csvs(self.data, Path(folder) if folder else self.folder / "tables")

    @property
    def figures(self) -> dict[str, Path]:
        """The run's figures by name (sigma, wedge_topk, atp_topk, ...), as drawn."""
        folder = self.folder / "figures"
        return {p.stem: p for p in sorted(folder.glob("*.png"))} if folder.is_dir() else {}

    def _repr_html_(self) -> str:
        from .report.doc import Doc
        from .report.sections import headline, title

        doc = Doc()
        title(doc, self.data)
        headline(doc, self.data)
        rows = self.table("sigma")
        keys = ("reading", "erank", "erank_low", "erank_high", "participation_ratio", "n_eff")
        doc.table(list(keys), [[_cell(r[k]) for k in keys] for r in rows])
        for name in ("sigma", f"wedge_{self.data['headline']['architecture']}"):
            if name in self.figures:
                doc.img(self.figures[name], name)
        return doc.html_body()

    def __repr__(self) -> str:
        k = self.kappa
        hat = self.kappa_hat
        said = "not estimable" if hat is None else f"{hat.value:.0f}"
        flag = ""
        if k is not None and k.converged is False:
            more = k.eval_tokens_needed
            flag = " (not converged" + (f"; about {more:,} eval tokens would do)" if more else ")")
        if k is None or k.value is None:
            shown = "n/a" + flag
        else:
            shown = f"{k.value:.0f} [{k.low:.0f}, {k.high:.0f}]{flag}"
        warned = len(self.warnings)
        return (
            f"Results({self.model}, layer {self.layer}: kappa {shown}, kappa_hat {said}; "
            f"{warned} warning(s); {self.path})"
        )


def _cell(value) -> str:
    return f"{value:,.1f}" if isinstance(value, float) else str(value)


def load(path: Path | str) -> Results:
    """A finished run: its folder OUT or its results.json."""
    return Results(path)


def measure(
    model: str | None = None,
    layer: int | None = None,
    *,
    preset: str = "default",
    progress: bool = True,
    threads: int | None = None,
    **settings,
) -> Results:
    """Measure one layer, as `causaldim run --preset PRESET --model MODEL --layer LAYER
    --SETTING VALUE ...` does (settings by their field names: out, tokens, widths,
    controls, ...). Finished stages of an earlier run in the same out are reused.
    `threads`: how many to compute with (default: one per core this process may use);
    torch's and BLAS's thread counts are put back afterwards."""
    from .pipeline import run
    from .presets import preset_configs

    if model is not None:
        settings["model"] = model
    if layer is not None:
        settings["layer"] = layer
    try:
        harvest_cfg, sweep_cfg, analysis_cfg = preset_configs(preset, **settings)
        result = run(
            harvest_cfg, sweep_cfg, analysis_cfg, progress=progress, preset=preset, threads=threads
        )
    except UsageError as e:  # the checks speak in flags; a Python caller passed arguments
        raise UsageError(python_names(str(e))) from None
    return Results(result.path)


def python_names(message: str) -> str:
    """A usage message with its command-line flags named as measure()'s arguments:
    "--reference-width 4096 is not among --widths" -> "reference_width 4096 is not among
    widths"."""
    return re.sub(r"(?<![\w-])--([a-z][a-z0-9-]*)", lambda m: m.group(1).replace("-", "_"), message)
