"""SAEs written by other tools (SAELens, sparsify, Gemma Scope), read as their own
library runs them, or refused in one line.

Each format's module turns a file's metadata alone (config, headers; no weights) into a
`Reading`: our architecture and sizes, and the exact changes that make the file's
weights encode and decode as its library does with causaldim's forward
f = act((x - b_dec) W_enc + b_enc), x_hat = f W_dec + b_dec. Whatever a library reads
that these changes cannot represent is refused there, naming the field, before any work.
`weights` then loads the tensors (each checked finite) and applies the changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ...errors import UsageError
from ..base import SAEConfig
from . import files


@dataclass(frozen=True)
class Reading:
    """How one foreign SAE file becomes ours, decided from its metadata alone."""

    format: str  # "saelens", "sparsify" or "gemma-scope"
    cfg: SAEConfig
    weights: Path  # the safetensors or npz file
    names: dict[str, str]  # our tensor name -> the file's
    site: str | None = None  # the site its metadata names, as written there
    encoder_rows: bool = False  # the file's encoder is [m, d] (nn.Linear's weight)
    b_dec_in_input: bool = True  # False: pre = x W_enc + b_enc, b_dec not subtracted
    rescale_by_decoder_norm: bool = False  # SAELens TopK: pre times |W_dec rows|, f / them
    held_as: torch.dtype = torch.float32  # the precision the library holds the weights in


def check_tensors(
    path: Path,
    header: files.Header,
    expected: dict[str, tuple[int, ...]],
    library: str,
    droppable: tuple[str, ...] = (),
) -> None:
    """The file holds exactly the tensors its library loads, of the shapes its config
    implies; `droppable` ones (a scaling factor of ones, which the library drops) pass."""
    missing = sorted(set(expected) - set(header))
    if missing:
        raise UsageError(f"{path} has no {', '.join(missing)}; {library} needs it")
    extra = sorted(set(header) - set(expected) - set(droppable))
    if extra:
        raise UsageError(
            f"{path} holds {', '.join(extra)}, which {library} does not load (a variant "
            "causaldim does not read)"
        )
    for name, shape in expected.items():
        if header[name][1] != shape:
            raise UsageError(
                f"{path}: {name} is {list(header[name][1])}, its config says {list(shape)}"
            )
    for name in droppable:
        if name in header and not torch.all(files.load(path, [name])[name] == 1):
            raise UsageError(
                f"{path}: {name} is not all ones (an input scaling causaldim does not read)"
            )


def check_k(path: Path, k, width: int, field: str = "k") -> int:
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= width:
        raise UsageError(f"{path}: {field} = {k!r} is outside 1..{width}, the SAE's width")
    return k


def _decoder_norms(reading: Reading, w_dec: torch.Tensor) -> torch.Tensor:
    norms = w_dec.norm(dim=1)
    if not (norms > 0).all():
        raise UsageError(
            f"{reading.weights}: rescale_acts_by_decoder_norm with a zero decoder row "
            "divides by zero; SAELens' own decode of it is NaN"
        )
    return norms


def check_weights(reading: Reading) -> None:
    """What only the weights can refuse (a NaN or infinite value, a zero decoder row to
    divide by), read one tensor at a time: the check before any model work."""
    files.check_finite(reading.weights)
    if reading.rescale_by_decoder_norm:
        w_dec = files.load(reading.weights, [reading.names["W_dec"]])
        _decoder_norms(reading, w_dec[reading.names["W_dec"]].double())


def weights(reading: Reading) -> dict[str, torch.Tensor]:
    """The file's tensors as our SAE holds them: W_enc [d, m], b_enc, W_dec [m, d], b_dec
    (and threshold), in float32, encoding and decoding as the file's library does."""
    raw = files.load(reading.weights, list(reading.names.values()))
    # The library's weights (in the precision it holds them), changed in float64 so that
    # only the final rounding to float32 separates ours from theirs.
    t = {ours: raw[theirs].to(reading.held_as).double() for ours, theirs in reading.names.items()}
    if reading.encoder_rows:
        t["W_enc"] = t["W_enc"].T.contiguous()
    if reading.rescale_by_decoder_norm:
        # pre n then TopK, decode (f / n) W_dec: the same as W_enc n, b_enc n, W_dec / n.
        norms = _decoder_norms(reading, t["W_dec"])
        t["W_enc"], t["b_enc"] = t["W_enc"] * norms, t["b_enc"] * norms
        t["W_dec"] = t["W_dec"] / norms[:, None]
    if not reading.b_dec_in_input:
        t["b_enc"] = t["b_enc"] + t["b_dec"] @ t["W_enc"]  # x W + b == (x - b_dec) W + b'
    return {name: v.float() for name, v in t.items()}
