"""SAE files: our own folder (safetensors + JSON) in and out, SAELens folders out, and
every format causaldim reads told apart (the other tools' readers are sae/imports/).
Nothing is unpickled: safetensors, JSON, and npz with allow_pickle=False only.

Our folder: `sae.safetensors` (W_enc [d, m], b_enc [m], W_dec [m, d], b_dec [d], and
`threshold` [m] for JumpReLU) and `cfg.json` ({"format": ..., "sae": SAEConfig, ...}).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import cast

import torch
from safetensors.torch import load_file, save_file
from safetensors.torch import save as save_bytes

from ..errors import IntegrityError, UsageError
from ..fileio import UMASK, atomic_write_bytes, read_sealed_json, sha256_file, write_sealed_json
from ..model.sites import equivalents, site_of
from . import SAE, JumpReLUSAE, SAEConfig, build, imports
from .imports import Reading, files, gemma_scope, saelens, sparsify

FORMAT = "causaldim-sae/1"
WEIGHTS, CONFIG = "sae.safetensors", "cfg.json"
# The saved matrices' precision (--save-dtype); biases and thresholds stay float32: they
# are a d + 2m sliver of the bytes, and a threshold decides every firing.
SAVE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MATRICES = ("W_enc", "W_dec")
_SAELENS_ARCH = {"topk": "topk", "jumprelu": "jumprelu", "relu": "standard"}


def round_weights(sae: SAE, save_dtype: str) -> SAE:
    """The SAE's matrices rounded, in place, to the precision they will be saved in: what
    is evaluated and scored is then what a load gives back."""
    with torch.no_grad():
        for name in MATRICES:
            w = getattr(sae, name)
            w.copy_(w.to(SAVE_DTYPES[save_dtype]).to(w.dtype))
    return sae


def _tensors(sae: SAE, save_dtype: str = "float32") -> dict[str, torch.Tensor]:
    out = {n: getattr(sae, n).detach().contiguous() for n in ("W_enc", "b_enc", "W_dec", "b_dec")}
    for name in MATRICES:
        out[name] = out[name].to(SAVE_DTYPES[save_dtype])
    if sae.architecture == "jumprelu":
        out["threshold"] = cast(JumpReLUSAE, sae).threshold.detach().contiguous()
    return out


def _from_tensors(
    cfg: SAEConfig, t: dict[str, torch.Tensor], device: str | torch.device = "cpu"
) -> SAE:
    with torch.device(device):
        sae = build(cfg)
    with torch.no_grad():
        for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
            getattr(sae, name).copy_(t[name].float())
        if cfg.architecture == "jumprelu":
            cast(JumpReLUSAE, sae).log_threshold.copy_(
                t["threshold"].float().clamp_min(1e-12).log()
            )
    return sae.requires_grad_(False)


def _write_folder(folder: Path, files: dict[str, Callable[[Path], object]]) -> Path:
    """Write a folder atomically: fill a temp sibling, then rename it into place."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    os.chmod(tmp, 0o777 & ~UMASK)  # mkdtemp makes 0700; a plain folder gets 0755
    try:
        for name, write in files.items():
            write(tmp / name)
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def save(sae: SAE, folder: Path, extra: dict | None = None, save_dtype: str = "float32") -> Path:
    """Weights (the matrices in save_dtype) and cfg.json, which records the weights'
    sha256 (checked on load); a load reads them back as float32."""
    data = save_bytes(_tensors(sae, save_dtype))
    meta = {
        "format": FORMAT,
        "sae": sae.cfg.to_dict(),
        "weights_sha256": hashlib.sha256(data).hexdigest(),
        **(extra or {}),
    }
    return _write_folder(
        folder,
        {
            WEIGHTS: lambda p: atomic_write_bytes(p, data),
            CONFIG: lambda p: write_sealed_json(p, meta),
        },
    )


def read_meta(folder: Path) -> dict:
    meta = read_sealed_json(Path(folder) / CONFIG, "SAE")
    if meta.get("format") != FORMAT:
        raise UsageError(f"{folder} is not a causaldim SAE folder ({CONFIG} has no {FORMAT})")
    return meta


def verify(folder: Path) -> dict:
    """cfg.json, once the weights file is found whole and matching its recorded sha256."""
    folder = Path(folder)
    meta = read_meta(folder)
    expected = meta.get("weights_sha256")
    path = folder / WEIGHTS
    if "dropped" in meta:
        raise UsageError(
            f"{folder}: its weights were dropped once it was scored (--drop-weights); "
            "rerun without --drop-weights to train it again"
        )
    if not path.is_file():
        raise IntegrityError(f"{path} is missing; rerun with --repair to train that SAE again")
    if expected is not None and sha256_file(path) != expected:
        raise IntegrityError(
            f"{path} does not match the sha256 in its {CONFIG} (damaged or truncated); "
            "rerun with --repair to train that SAE again"
        )
    return meta


def load(folder: str | Path, device: str | torch.device = "cpu") -> SAE:
    """A saved SAE, its weights checked against their recorded hash, onto device."""
    folder = Path(folder)
    meta = verify(folder)
    return _from_tensors(SAEConfig(**meta["sae"]), load_file(folder / WEIGHTS), device)


# ------------------------------------------------------------------------------- SAELens


SAELENS_LAYOUT = "6.0.0"  # the SAELens config layout export_saelens writes


def _provenance(written: str) -> dict:
    from .. import __version__

    installed = _saelens_version()
    return {
        "written_by": f"causaldim {__version__}",
        "sae_lens_version": written,
        "sae_lens_version_is": "the installed SAELens"
        if installed
        else f"the SAELens config layout followed ({SAELENS_LAYOUT}); SAELens was not installed",
    }


def _saelens_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sae-lens")
    except PackageNotFoundError:
        return None


def export_saelens(
    sae: SAE, folder: Path, hook_name: str = "", model_name: str = "", layer: int | None = None
) -> Path:
    """A folder SAELens' `SAE.load_from_disk` reads: cfg.json + sae_weights.safetensors.
    With the layer known and no hook_name given, the hook is `blocks.{layer}.hook_resid_post`
    (the output of block `layer`), so that the folder, imported again, is checked against
    the run's layer."""
    if not hook_name and layer is not None:
        hook_name = equivalents(layer)["saelens"]
    cfg = {
        "architecture": _SAELENS_ARCH[sae.architecture],
        "d_in": sae.cfg.d_in,
        "d_sae": sae.cfg.width,
        "dtype": "float32",
        "device": "cpu",
        "apply_b_dec_to_input": True,
        "normalize_activations": "none",
        "reshape_activations": "none",
        # sae_lens_version: the installed SAELens where there is one; else 6.0.0, the
        # version whose config layout this follows (without one SAELens reads the folder
        # as a pre-6.0 one and drops this metadata, the hook, on loading). written_by says
        # which it is.
        "metadata": {
            "model_name": model_name,
            "hook_name": hook_name,
            "sae_lens_version": _saelens_version() or SAELENS_LAYOUT,
        },
    }
    if sae.architecture == "topk":
        cfg["k"] = sae.cfg.k
    return _write_folder(
        folder,
        {
            "sae_weights.safetensors": lambda p: save_file(_tensors(sae), p),
            "cfg.json": lambda p: p.write_text(json.dumps(cfg, indent=2) + "\n"),
            "causaldim_export.json": lambda p: p.write_text(
                json.dumps(_provenance(cfg["metadata"]["sae_lens_version"]), indent=2) + "\n"
            ),
        },
    )


# ------------------------------------------------------------------- files of other tools


def _layout(path: Path) -> str:
    """Which format a path holds, from its file names (and our cfg.json's format key)."""
    path = Path(path)
    if path.suffix == ".npz":
        return "gemma-scope"
    if (path / WEIGHTS).is_file() and (path / CONFIG).is_file():
        own = files.read_json(path / CONFIG).get("format") == FORMAT
        return "causaldim" if own else "sparsify"
    if (path / saelens.WEIGHTS).is_file():
        return "saelens"
    raise UsageError(
        f"{path} is no SAE this tool reads: expected a causaldim, SAELens or sparsify "
        "folder, or a Gemma Scope params.npz"
    )


def inspect(path: Path) -> Reading:
    """How a SAELens, sparsify or Gemma Scope file reads as our SAE, from its metadata
    alone; a one-line UsageError for every variant or damage causaldim cannot read."""
    readers = {"gemma-scope": gemma_scope, "saelens": saelens, "sparsify": sparsify}
    layout = _layout(path)
    if layout not in readers:
        raise UsageError(f"{path} is a causaldim SAE folder, not another tool's")
    return readers[layout].inspect(Path(path))


def load_any(path: Path) -> SAE:
    """Our folder, a SAELens or sparsify folder, or a Gemma Scope params.npz, encoding and
    decoding as the library that wrote it does."""
    if _layout(path) == "causaldim":
        return load(path)
    reading = inspect(path)
    return _from_tensors(reading.cfg, imports.weights(reading))


def peek_d_in(path: Path) -> int:
    """The residual width an SAE file reads, from its metadata only (no weights loaded),
    once everything its metadata can refuse is refused: for checking --sae-paths against
    the model before any work."""
    if _layout(path) == "causaldim":
        return files.safetensors_header(Path(path) / WEIGHTS)["W_dec"][1][1]
    return inspect(path).cfg.d_in


def check_weights(path: Path) -> None:
    """Every weight of an SAE file finite (and, where SAELens divides by decoder norms, none
    zero), read one tensor at a time; a UsageError naming the tensor otherwise (before any
    model work, not when the sweep reaches it)."""
    if _layout(path) == "causaldim":
        files.check_finite(Path(path) / WEIGHTS)
    else:
        imports.check_weights(inspect(path))


def peek_source(path: Path) -> dict:
    """What an SAE file says of itself, from its metadata only (no weights read): its
    format, and the site it names (`site`: a hook name, a Gemma Scope `layer_N` component
    of its path, a sparsify folder name `layers.N`; None if it names none). Read
    with causaldim.model.sites.site_of. What causaldim cannot read is refused here."""
    if _layout(path) == "causaldim":
        return {"format": "causaldim", "site": read_meta(path).get("hook_name")}
    reading = inspect(path)
    return {"format": reading.format, "site": reading.site}


def describe_source(path: Path, sae_id: str | None = None) -> dict:
    """An imported SAE's format and the site its metadata names (`site`: the name, or
    "unknown"; `block`: the block whose output it is, or None), from metadata only. A hub
    id (`sae_id`) counts as metadata where the files name nothing. NotABlockOutput (a
    UsageError) where the metadata names another site than a block's output."""
    own = peek_source(path)
    for name in (own["site"], sae_id):
        if name and (block := site_of(name)) is not None:
            return {"format": own["format"], "site": name, "block": block}
    return {"format": own["format"], "site": "unknown", "block": None}
