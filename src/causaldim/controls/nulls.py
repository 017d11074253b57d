"""Control 'nulls': the direct kappa of untrained networks of the same shape, at the same
layer, on the same eval sequences and probes, beside the trained model's, in both metrics.

An untrained network already gives a raw kappa of most of d (0.83 d for SmolLM2 and
Gemma 3 freshly initialised, METHOD.md "A null"), so "kappa is most of d" says nothing of
training unless the nulls give less. Each null (model/nulls.py: MODEL:permuted, every
parameter shuffled within itself; MODEL:init, a fresh initialisation) is harvested by the
headline pass over the run's eval split and its --headline-tokens extension (probes drawn
as the run's were), its outlier rule calibrated on its own residuals, and measured as the
run's headline reading is: corrected erank with its interval, raw and activation-weighted.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from ..fmt import ci, num
from ..harvest import harvest, plan
from ..harvest.model_pass import residuals_at
from ..harvest.plan import extension_sequences
from ..harvest.store import key_digest
from ..measures.kappa import measure
from ..measures.sigma import HEADLINE
from ..model.corpus import Splits
from ..model.load import load_model
from ..model.nulls import KINDS
from ..report.doc import Doc
from . import Context, Control

CALIBRATION_SEQUENCES = 16  # as the run's outlier rule is calibrated


def brief(est: dict | None, d: int) -> dict | None:
    """What the control keeps of an estimate."""
    if not est:
        return None
    value = est.get("erank_corrected")
    return {
        "value": value,
        "interval_95": est.get("erank_corrected_95"),
        "over_d": None if value is None else value / d,
        "converged": est.get("converged"),
        "n_independent": est.get("n_independent"),
        "eval_tokens_needed": est.get("eval_tokens_needed"),
        "n_tokens": est.get("n_tokens"),
    }


def null_store(ctx: Context, kind: str):
    """The null's store of the run's eval sequences (and extension) at the run's layer."""
    cfg = ctx.plan.config
    name = f"{cfg.model}:{kind}@{ctx.seed}"
    p = plan(replace(cfg, model=name, out=str(Path(ctx.out) / "nulls" / kind)))
    n_ext = extension_sequences(p)
    seqs = torch.cat([p.splits.eval, p.splits.rest(0, n_ext)]) if n_ext else p.splits.eval
    key = {**p.key, "pass": "headline", "sequences": "eval split and extension"}
    folder = p.store_dir.parent / f"L{p.layer}-headline-{key_digest(key)[:12]}"
    eval_only = p._replace(
        splits=Splits(p.splits.train[:0], seqs, 0),
        key=key,
        keys={p.layer: key},
        store_dir=folder,
        store_dirs={p.layer: folder},
    )
    c = p.config
    lm = load_model(p.source, c.dtype, p.layers_path, c.device, progress=False)
    calib = residuals_at(lm, (p.layer,), p.splits.train[:CALIBRATION_SEQUENCES])[p.layer]
    median = float(calib.float()[:, 1:].norm(dim=-1).median())
    result = harvest(
        c, ctx.progress, eval_only, eval_round=0, lm=lm, median_norms={p.layer: median}
    )
    assert p.source.null is not None  # the name asks for one
    return name, p.source.null, result.store


def _compute(ctx: Context) -> dict:
    d = ctx.store.d_model
    trained = ctx.here.sigma.get(HEADLINE)
    if trained is None:
        return {"skipped": "needs the headline reading: --logit-probes of at least 1"}
    nulls = {}
    for kind in KINDS:
        name, null, store = null_store(ctx, kind)
        est = measure([store], ctx.without_controls, ctx.seed, readings=(HEADLINE, "activations"))
        e = est[HEADLINE]
        nulls[kind] = {
            "model": name,
            "null": null.to_dict(),
            "raw": brief(e.to_dict(), d),
            "act": brief(e.activation_weighted, d),
            "activations_erank": est["activations"].erank,
        }
    return {
        "layer": ctx.plan.layer,
        "d_model": d,
        "reading": HEADLINE,
        "trained": {
            "model": ctx.plan.config.model,
            "raw": brief(trained.to_dict(), d),
            "act": brief(trained.activation_weighted, d),
        },
        "nulls": nulls,
    }


def _cell(e: dict | None) -> str:
    if not e or e.get("value") is None:
        return "n/a"
    star = "" if e.get("converged") is not False else " (not converged)"
    return f"{num(e['value'])} {ci(e['interval_95'])}, {e['over_d']:.2f} d{star}"


def nulls_section(doc: Doc, c: dict) -> None:
    doc.p(
        f"The direct kappa ({c['reading']} reading) at layer {c['layer']} of the trained model "
        "and of untrained networks of the same shape, on the same eval sequences and probes. "
        "If a null gives the same kappa / d, that level says nothing of what the model learned."
    )
    rows = [
        [
            "trained: " + c["trained"]["model"],
            _cell(c["trained"]["raw"]),
            _cell(c["trained"]["act"]),
        ]
    ]
    rows += [
        [
            f"{kind}: {n['null']['what']} (seed {n['null']['seed']})",
            _cell(n["raw"]),
            _cell(n["act"]),
        ]
        for kind, n in c["nulls"].items()
    ]
    doc.table(["model", "kappa, raw [95%]", "kappa, activation-weighted [95%]"], rows)


CONTROL = Control(
    "nulls",
    "Nulls: untrained networks of the same shape",
    _compute,
    nulls_section,
    per_architecture=False,
)
