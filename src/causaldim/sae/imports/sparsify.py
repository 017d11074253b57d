"""A sparsify folder (cfg.json + sae.safetensors) as eai-sparsify 1.3's
`SparseCoder.load_from_disk` reads it: encoder.weight [m, d], encoder.bias, W_dec [m, d],
b_dec, loaded strictly (no tensor more or less).

sparsify's forward: pre = relu((x - b_dec) encoder.weight^T + encoder.bias); the k largest
kept; x_hat = f W_dec + b_dec. A transcoder (no b_dec subtracted, another site's output
predicted), a skip connection (x W_skip^T added to x_hat) and the groupmax activation
(the largest of each of k groups) have no place in causaldim's SAEs and are refused;
normalize_decoder and multi_topk only change training. Other keys sparsify drops too.
"""

from __future__ import annotations

import re
from pathlib import Path

from ...errors import UsageError
from ..base import SAEConfig
from . import Reading, check_k, check_tensors, files

WEIGHTS, CONFIG = "sae.safetensors", "cfg.json"


def _flag(path: Path, cfg: dict, field: str) -> bool:
    value = cfg.get(field, False)
    if not isinstance(value, bool):
        raise UsageError(f"{path}: {field} = {value!r} is not true or false")
    return value


def _positive(path: Path, cfg: dict, field: str, default: int, zero_ok: bool = False) -> int:
    value = cfg.get(field, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < (0 if zero_ok else 1):
        raise UsageError(f"{path}: {field} = {value!r} is not a positive integer")
    return value


def inspect(folder: Path) -> Reading:
    folder = Path(folder)
    path = folder / CONFIG
    cfg = files.read_json(path)
    if "d_in" not in cfg:
        raise UsageError(f"{path} has no d_in; sparsify needs it")
    d = _positive(path, cfg, "d_in", 0)
    if _flag(path, cfg, "transcode"):
        raise UsageError(
            f"{path}: sparsify transcode: true is a transcoder, not an SAE of the residual stream"
        )
    if _flag(path, cfg, "skip_connection"):
        raise UsageError(
            f"{path}: sparsify skip_connection: true adds x W_skip to every reconstruction, "
            "which causaldim's SAEs do not have"
        )
    activation = cfg.get("activation", "topk")
    if activation == "groupmax":
        raise UsageError(
            f"{path}: sparsify activation: 'groupmax' (the largest latent of each of k groups) "
            "is not read; causaldim reads activation: 'topk'"
        )
    if activation != "topk":
        raise UsageError(f"{path}: sparsify activation {activation!r} is not read (only 'topk')")
    # sparsify's width: num_latents, or d_in times expansion_factor where it is 0.
    m = _positive(path, cfg, "num_latents", 0, zero_ok=True) or d * _positive(
        path, cfg, "expansion_factor", 32
    )
    k = check_k(path, cfg.get("k", 32), m)  # 32: SparseCoderConfig's default
    expected = {"encoder.weight": (m, d), "encoder.bias": (m,), "W_dec": (m, d), "b_dec": (d,)}
    weights = folder / WEIGHTS
    check_tensors(weights, files.safetensors_header(weights), expected, "sparsify")
    named = re.fullmatch(r"layers\.\d+(\..+)?|embed_tokens", folder.name)
    return Reading(
        "sparsify",
        SAEConfig("topk", d, m, k=k),
        weights,
        {"W_enc": "encoder.weight", "b_enc": "encoder.bias", "W_dec": "W_dec", "b_dec": "b_dec"},
        site=folder.name if named else None,
        encoder_rows=True,
    )
