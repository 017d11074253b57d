"""The paper's controls (METHOD.md section 4), computed from the same store and sweep as
the headline numbers: what kappa_hat measures, and what it does not.

A control is one module of this package that defines CONTROL = Control(...): how it is
computed from a Context, its report section and, where one helps, its figure. NAMES
registers it (and orders the report). Its result is plain data in
results.json["controls"][name], holding every number the section shows.

This module imports no control at import time; config holds the registry's names.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import CONTROLS

if TYPE_CHECKING:
    from ..config import AnalysisConfig, HarvestConfig
    from ..executors import Executor
    from ..harvest import Plan, Store
    from ..measures.layer import Measurement
    from ..model.load import LoadedModel
    from ..report.doc import Doc
    from ..sae import SAE
    from ..sweep_config import SweepConfig

NAMES = CONTROLS  # registered in config, which must not import the controls


@dataclass(frozen=True)
class Control:
    name: str
    title: str
    compute: Callable[[Context], dict]
    section: Callable[[Doc, dict], None]  # the report's text, from the result alone
    plot: Callable[[dict, Path], Path] | None = None
    per_architecture: bool = True  # runs on the headline architecture, and says so
    trains_own_saes: bool = False  # measures SAEs of its own: not with --sae-paths
    uses_control_sweep: bool = False  # its own SAEs follow --control-epochs/--control-widths
    reads_weights: bool = False  # reads the sweep's SAE weights: not with --drop-weights
    # What the control asks of the run before it starts (None: nothing): the SAEs it
    # needs trained; layers harvested in the same pass, from (cfg, n_layers, layer); and
    # another model's harvest, planned beside the run's.
    widen_sweep: Callable[[SweepConfig, AnalysisConfig], SweepConfig] | None = None
    extra_layers: Callable[[AnalysisConfig, int, int], list[int]] | None = None
    side_plan: Callable[[HarvestConfig, AnalysisConfig, Plan], Plan | None] | None = None


def get(name: str) -> Control:
    return importlib.import_module(f"{__name__}.{name}").CONTROL


@dataclass
class Context:
    """What a control computes from: the headline layer's store and measurement, the
    settings, and the means to measure beyond them (the model, other layers' stores,
    another model's plan)."""

    store: Store
    here: Measurement  # every architecture's SAEs, scores, evals and analysis
    headline: str  # the architecture the controls run on
    sweep_cfg: SweepConfig  # as run
    analysis_cfg: AnalysisConfig
    seed: int
    out: Path
    load_lm: Callable[[], LoadedModel]  # loads the model on first use
    executor: Executor
    stores: dict[int, Store]  # every layer of the pass, the headline's included
    plan: Plan
    side_plans: dict[str, Plan | None]
    progress: bool = False  # bars for the control's own long loops
    # each layer's eval split with its --headline-tokens extension (what its logits
    # readings read); a layer absent reads its store alone
    eval_stores: dict[int, list[Store]] = field(default_factory=dict)
    # what measure_other measured, by (store, folder): the architectures and four-cell
    # controls share OUT/architectures, measured (Sigma, scores, analysis) once
    measured: dict = field(default_factory=dict, repr=False)

    @cached_property
    def saes(self) -> dict[int, SAE]:
        """The headline architecture's SAEs by width, loaded on first use."""
        return self.here.saes_of(self.headline)

    @property
    def scores(self):
        return self.here.scores[self.headline]

    @property
    def analysis(self) -> dict:
        return self.here.analysis[self.headline]

    @property
    def epsilon(self) -> float:
        return self.analysis["epsilon"]

    @cached_property
    def one_architecture(self) -> SweepConfig:
        """The sweep for measurements beyond this store: the headline architecture only."""
        return replace(self.sweep_cfg, architectures=[self.headline])

    @cached_property
    def control_sweep(self) -> SweepConfig:
        """The sweep of the controls' own SAEs: the headline architecture, with
        --control-epochs and --control-widths where given."""
        a = self.analysis_cfg
        return replace(
            self.one_architecture,
            epochs=a.control_epochs or self.sweep_cfg.epochs,
            widths=sorted(a.control_widths) or self.sweep_cfg.widths,
        )

    @cached_property
    def without_controls(self) -> AnalysisConfig:
        return replace(self.analysis_cfg, controls=[])

    def measure_other(
        self, store: Store, folder: Path, architectures: list[str] | None = None
    ) -> Measurement:
        """A store measured with the controls' sweep (the headline architecture, or those
        given), no controls of its own, SAEs and scores under folder."""
        from ..measures.layer import measure_layer

        sweep = self.control_sweep
        if architectures is not None:
            sweep = replace(sweep, architectures=architectures)
        key = (store.root, folder)
        done = self.measured.get(key)
        if done is not None and set(sweep.architectures) <= set(done.scores):
            return done
        self.measured[key] = measure_layer(
            store,
            folder,
            sweep,
            self.without_controls,
            self.seed,
            progress=self.progress,
            seconds={},
            executor=self.executor,
            eval_stores=self.eval_stores.get(store.manifest["layer"])
            if store in self.stores.values()
            else None,
        )
        return self.measured[key]


def run_controls(
    names: list[str], ctx: Context, progress=None, seconds: dict | None = None
) -> dict:
    """The selected controls, in the order given; progress(name) before each, and each
    one's seconds into `seconds` (as control.NAME)."""
    import time

    from ..faults import fault_point

    out = {}
    for name in names:
        if progress:
            progress(name)
        fault_point(f"control.{name}")
        control = get(name)
        start = time.perf_counter()
        result = control.compute(ctx)
        if control.uses_control_sweep and ctx.analysis_cfg.lighter_controls:
            sweep = ctx.control_sweep
            result["control_sweep"] = {"widths": sweep.widths, "epochs": sweep.epochs}
        if seconds is not None:
            seconds[f"control.{name}"] = time.perf_counter() - start
        out[name] = {"architecture": ctx.headline, **result} if control.per_architecture else result
    return out


def control_figures(results: dict, folder: Path) -> dict[str, tuple[Path, Callable]]:
    """The figures of the controls in results.json that ran and have one: key, path and
    how to draw it."""
    figures = {}
    for name, c in results.get("controls", {}).items():
        control = get(name)
        if control.plot is not None and "skipped" not in c:
            figures[f"control_{name}"] = (
                folder / "figures" / f"control_{name}.png",
                lambda p, plot=control.plot, c=c: plot(c, p),
            )
    return figures


def report_controls(doc: Doc, results: dict, figures: dict[str, Path]) -> None:
    """The controls' sections of the report."""
    controls = results.get("controls") or {}
    if not controls:
        return
    doc.h(2, "Controls")
    for name, c in controls.items():
        control = get(name)
        doc.h(3, control.title + (f" ({c['architecture']})" if "architecture" in c else ""))
        if "skipped" in c:
            doc.p(f"Not run: {c['skipped']}.")
            continue
        if c.get("control_sweep"):
            own = c["control_sweep"]
            doc.p(
                f"A lighter sweep than the headline's: this control's own SAEs trained "
                f"{own['epochs']} epoch(s) at widths {' '.join(f'{w:,}' for w in own['widths'])}."
            )
        if f"control_{name}" in figures:
            doc.img(figures[f"control_{name}"], control.title)
        control.section(doc, c)
