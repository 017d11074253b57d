"""The claims an atlas answers: each cell's layer read as a run's results.json, then the
claims tables' own rules (the level and the ladder at the middle layer, the depth over a
cell's converged layers, and the across-run claims between cells)."""

from __future__ import annotations

from ..measures.sigma import HEADLINE
from ..model.nulls import split_null
from ..paper import MIDDLE_DEPTH, PAPER, depth_layer
from .across import across
from .flags import current
from .kappa import ACT, depth, ladder_count, level, spectrum


def _sigma_at(cell: dict, layer: str) -> dict:
    """One layer's readings (outliers left out), as a run's results.json holds them."""
    d = cell["model"]["d_model"]
    sigma = {
        r: {**e, "samples_per_dim": e["n_samples"] / d}
        for r, e in cell["layers"][layer]["left out"].items()
        if r != "activations"
    }
    for e in sigma.values():  # the twin, likewise
        if e.get("activation_weighted"):
            twin = e["activation_weighted"]
            e["activation_weighted"] = {**twin, "samples_per_dim": twin["n_samples"] / d}
    return sigma


def _run_at(cell: dict, layer: str) -> tuple[str, dict]:
    """One cell's layer as the claims rules read a run, the cell's other layers as its
    profile."""
    c = cell["cell"]
    model = cell["model"]
    sigma = _sigma_at(cell, layer)
    _, null = split_null(c["model"])
    results = {
        "store": {
            "layer": int(layer),
            "model": {**model, "identity": {"name": c["model"], "family": model["family"]}},
        },
        "inputs": {
            "corpus": {"id": cell["corpus"]},
            "model": {"name": c["model"], "null": None if null is None else null.to_dict()},
        },
        "sigma": sigma,
        "profile": {"layers": {i: _sigma_at(cell, i) for i in cell["layers"]}},
        "paper": PAPER,
        "ladder": cell.get("ladder")
        if int(layer) == (cell.get("ladder") or {}).get("layer")
        else None,
    }
    return f"{c['model']} on {c['corpus']}, seq {c['seq_len']}", current(results)


def _middle(cell: dict) -> str:
    """The layer at about half the depth, where the paper measured (12 of 26)."""
    return str(depth_layer(MIDDLE_DEPTH, cell["model"]["n_layers"]))


def atlas_claims(cells: list[dict]) -> list[tuple[str, str, str, str]]:
    """The claims the atlas answers, each at the middle layer by the claims tables' own
    rules (cells that did not measure it left aside), in each metric: (claim, what was
    compared, verdict, why)."""
    out = []
    cells = [c for c in cells if _middle(c) in c["layers"]]
    seqs = sorted({c["cell"]["seq_len"] for c in cells})
    for seq in seqs:
        runs = [_run_at(c, _middle(c)) for c in cells if c["cell"]["seq_len"] == seq]
        for claim in across(runs):
            key = f"{claim.key}, sequences of {seq}"
            out.append((key, claim.this_run, claim.verdict, claim.reason))
            if claim.activation_weighted:
                out.append((f"{key}, activation-weighted", *claim.activation_weighted))
    for c in cells:  # each model's own: the level and spectrum there, the depth over layers
        if c["cell"]["seq_len"] == max(seqs) and c["cell"]["corpus"] != "builtin":
            name, results = _run_at(c, _middle(c))
            for reading, label in ((HEADLINE, ""), (ACT, ", activation-weighted")):
                shown, verdict, why = level(results, reading)
                out.append((f"kappa_level (0.86 d){label}, {name}", shown, verdict, why))
                out.append((f"kappa_spectrum{label}, {name}", *spectrum(results, reading)))
                out.append((f"kappa_depth{label}, {name}", *depth(results, reading)))
    for c in cells:  # kappa against the directions the output needs, where measured
        if c.get("ladder"):
            name, results = _run_at(c, _middle(c))
            for reading, label in ((HEADLINE, ""), (ACT, ", activation-weighted")):
                out.append((f"kappa_ladder{label}, {name}", *ladder_count(results, reading)))
    return out
