"""A Gemma Scope `params.npz` as SAELens' Gemma Scope loader reads it: W_enc [d, m],
W_dec [m, d], b_enc, b_dec, threshold (keys `w_*` read as `W_*`; a scaling_factor of
ones dropped), JumpReLU with pre = x W_enc + b_enc (no b_dec subtracted),
f = relu(pre) [pre > threshold], x_hat = f W_dec + b_dec."""

from __future__ import annotations

import re
from pathlib import Path

from ...errors import UsageError
from ..base import SAEConfig
from . import Reading, check_tensors, files


def inspect(path: Path) -> Reading:
    path = Path(path)
    header = files.npz_header(path)
    renamed = {("W_" + k[2:] if k.startswith("w_") else k): k for k in header}
    header = {ours: header[theirs] for ours, theirs in renamed.items()}
    if "W_enc" not in header or len(header["W_enc"][1]) != 2:
        raise UsageError(f"{path} has no 2-d W_enc; it is not a Gemma Scope params.npz")
    d, m = header["W_enc"][1]
    expected = {"W_enc": (d, m), "W_dec": (m, d), "b_enc": (m,), "b_dec": (d,), "threshold": (m,)}
    check_tensors(path, header, expected, "Gemma Scope", droppable=("scaling_factor",))
    parts = [p for p in path.parent.parts if re.fullmatch(r"layer_\d+|embedding", p)]
    return Reading(
        "gemma-scope",
        SAEConfig("jumprelu", d, m),
        path,
        {name: renamed[name] for name in expected},
        site=parts[-1] if parts else None,
        b_dec_in_input=False,
    )
