"""Control 'l0': the eval-split L0 of every SAE against the target (exact for TopK, a
controller's target for JumpReLU and ReLU), so that sparsity drift across widths cannot
fake the wedge."""

from __future__ import annotations

from ..fmt import pct
from ..measures.diagnose import L0_TOLERANCE
from ..report.doc import Doc
from . import Control


def matched_l0(evals: dict[str, dict[int, dict]], target: float) -> dict:
    """Eval-split L0 per architecture and width against the target; rows further than
    L0_TOLERANCE from it are flagged (sparsity drift could then fake a wedge)."""
    rows = []
    for arch, by_width in evals.items():
        for width, ev in sorted(by_width.items()):
            rel = ev["l0"] / target - 1
            rows.append(
                {
                    "architecture": arch,
                    "width": width,
                    "l0": ev["l0"],
                    "relative_error": rel,
                    "flagged": abs(rel) > L0_TOLERANCE,
                }
            )
    return {
        "target": target,
        "tolerance": L0_TOLERANCE,
        "rows": rows,
        "n_flagged": sum(r["flagged"] for r in rows),
    }


def l0_section(doc: Doc, c: dict) -> None:
    doc.table(
        ["architecture", "width", "L0 (eval)", "off target", "flag"],
        [
            [
                r["architecture"],
                r["width"],
                f"{r['l0']:.2f}",
                pct(r["relative_error"]),
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


CONTROL = Control(
    "l0",
    "Matched L0",
    lambda ctx: matched_l0(ctx.here.evals, float(ctx.sweep_cfg.k)),
    l0_section,
    per_architecture=False,
)
