"""SAE files: our own folder (safetensors + JSON), SAELens folders both ways, Gemma Scope
`params.npz` and sparsify folders in. Nothing is unpickled: safetensors, JSON, and npz
with allow_pickle=False only.

Our folder: `sae.safetensors` (W_enc [d, m], b_enc [m], W_dec [m, d], b_dec [d], and
`threshold` [m] for JumpReLU) and `cfg.json` ({"format": ..., "sae": SAEConfig, ...}).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from safetensors.torch import save as save_bytes

from ..errors import IntegrityError, UsageError
from ..fileio import atomic_write_bytes, read_sealed_json, sha256_file, write_sealed_json
from ..model.sites import equivalents, site_of
from . import SAE, SAEConfig, build

FORMAT = "causaldim-sae/1"
WEIGHTS, CONFIG = "sae.safetensors", "cfg.json"
_SAELENS_ARCH = {"topk": "topk", "jumprelu": "jumprelu", "relu": "standard"}


def _tensors(sae: SAE) -> dict[str, torch.Tensor]:
    out = {n: getattr(sae, n).detach().contiguous() for n in ("W_enc", "b_enc", "W_dec", "b_dec")}
    if sae.architecture == "jumprelu":
        out["threshold"] = sae.threshold.detach().contiguous()
    return out


def _from_tensors(cfg: SAEConfig, t: dict[str, torch.Tensor], device="cpu") -> SAE:
    with torch.device(device):
        sae = build(cfg)
    with torch.no_grad():
        for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
            getattr(sae, name).copy_(t[name].float())
        if cfg.architecture == "jumprelu":
            sae.log_threshold.copy_(t["threshold"].float().clamp_min(1e-12).log())
    return sae.requires_grad_(False)


def _write_folder(folder: Path, files: dict[str, callable]) -> Path:
    """Write a folder atomically: fill a temp sibling, then rename it into place."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
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


def save(sae: SAE, folder: Path, extra: dict | None = None) -> Path:
    """Weights and cfg.json, which records the weights' sha256 (checked on load)."""
    data = save_bytes(_tensors(sae))
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
    if not path.is_file():
        raise IntegrityError(f"{path} is missing; rerun with --repair to train that SAE again")
    if expected is not None and sha256_file(path) != expected:
        raise IntegrityError(
            f"{path} does not match the sha256 in its {CONFIG} (damaged or truncated); "
            "rerun with --repair to train that SAE again"
        )
    return meta


def load(folder: Path, device: str | torch.device = "cpu") -> SAE:
    """A saved SAE, its weights checked against their recorded hash, onto device."""
    folder = Path(folder)
    meta = verify(folder)
    return _from_tensors(SAEConfig(**meta["sae"]), load_file(folder / WEIGHTS), device)


# ------------------------------------------------------------------------------- SAELens


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
        # sae_lens_version: the config follows SAELens 6's layout; without it SAELens reads
        # the folder as a pre-6.0 one and drops this metadata (the hook) on loading.
        "metadata": {"model_name": model_name, "hook_name": hook_name, "sae_lens_version": "6.0.0"},
    }
    if sae.architecture == "topk":
        cfg["k"] = sae.cfg.k
    return _write_folder(
        folder,
        {
            "sae_weights.safetensors": lambda p: save_file(_tensors(sae), p),
            "cfg.json": lambda p: p.write_text(json.dumps(cfg, indent=2) + "\n"),
        },
    )


def _saelens_cfg(folder: Path) -> tuple[str, dict]:
    """A SAELens cfg.json as SAELens reads it (keys before 6.0 too: TopK as activation_fn
    'topk', normalize_activations False), and our architecture for it; a UsageError for
    what causaldim does not read."""
    cfg = json.loads((folder / "cfg.json").read_text())
    if cfg.get("activation_fn_str", cfg.get("activation_fn")) == "topk" and "k" not in cfg:
        k = (cfg.get("activation_fn_kwargs") or {}).get("k")
        cfg = {**cfg, "architecture": "topk", "k": k}
    arch = {v: k for k, v in _SAELENS_ARCH.items()}.get(cfg.get("architecture", "standard"))
    if arch is None:
        raise UsageError(
            f"{folder}: SAELens architecture {cfg['architecture']!r} is not supported "
            f"(supported: {', '.join(_SAELENS_ARCH.values())})"
        )
    if cfg.get("normalize_activations", "none") not in ("none", None, False):  # False: pre-6.0
        raise UsageError(
            f"{folder}: normalize_activations={cfg['normalize_activations']!r} is not "
            "supported; export the SAE with normalisation folded into its weights"
        )
    return arch, cfg


def import_saelens(folder: Path) -> SAE:
    folder = Path(folder)
    arch, cfg = _saelens_cfg(folder)
    t = load_file(folder / "sae_weights.safetensors")
    if not cfg.get("apply_b_dec_to_input", True):
        t["b_enc"] = t["b_enc"] + t["b_dec"] @ t["W_enc"]  # x W + b == (x - b_dec) W + b'
    width = int(cfg.get("d_sae", t["W_enc"].shape[1]))
    return _from_tensors(SAEConfig(arch, int(cfg["d_in"]), width, k=cfg.get("k")), t)


# ----------------------------------------------------------------------------- Gemma Scope


def import_gemma_scope(path: Path) -> SAE:
    """A Gemma Scope `params.npz` (W_enc, W_dec, b_enc, b_dec, threshold): JumpReLU with
    pre = x W_enc + b_enc (no b_dec subtracted), f = pre * [pre > threshold]."""
    with np.load(path, allow_pickle=False) as z:
        t = {k: torch.from_numpy(np.asarray(z[k], dtype=np.float32)) for k in z.files}
    missing = {"W_enc", "W_dec", "b_enc", "b_dec", "threshold"} - set(t)
    if missing:
        raise UsageError(f"{path} is not a Gemma Scope params.npz (missing {sorted(missing)})")
    t["b_enc"] = t["b_enc"] + t["b_dec"] @ t["W_enc"]
    d, m = t["W_enc"].shape
    return _from_tensors(SAEConfig("jumprelu", d, m), t)


# -------------------------------------------------------------------------------- sparsify


def import_sparsify(folder: Path) -> SAE:
    """A sparsify folder (cfg.json + sae.safetensors with encoder.weight [m, d],
    encoder.bias, W_dec, b_dec): TopK on (x - b_dec) encoder^T + bias."""
    folder = Path(folder)
    cfg = json.loads((folder / "cfg.json").read_text())
    raw = load_file(folder / "sae.safetensors")
    t = {
        "W_enc": raw["encoder.weight"].T.contiguous(),
        "b_enc": raw["encoder.bias"],
        "W_dec": raw["W_dec"],
        "b_dec": raw["b_dec"],
    }
    d, m = t["W_enc"].shape
    return _from_tensors(SAEConfig("topk", int(cfg.get("d_in", d)), m, k=int(cfg["k"])), t)


def load_any(path: Path) -> SAE:
    """Our folder, a SAELens or sparsify folder, or a Gemma Scope params.npz."""
    path = Path(path)
    if path.suffix == ".npz":
        return import_gemma_scope(path)
    if (path / WEIGHTS).is_file() and (path / CONFIG).is_file():
        meta = json.loads((path / CONFIG).read_text())
        return load(path) if meta.get("format") == FORMAT else import_sparsify(path)
    if (path / "sae_weights.safetensors").is_file():
        return import_saelens(path)
    raise UsageError(
        f"{path} is no SAE this tool reads: expected a causaldim, SAELens or sparsify "
        "folder, or a Gemma Scope params.npz"
    )


def peek_d_in(path: Path) -> int:
    """The residual width an SAE file reads, from headers only (no weights loaded): for
    checking --sae-paths against the model before any work."""
    import zipfile

    from safetensors import safe_open

    path = Path(path)
    if path.suffix == ".npz":
        with zipfile.ZipFile(path) as z, z.open("W_dec.npy") as f:
            major, _ = np.lib.format.read_magic(f)
            read = (
                np.lib.format.read_array_header_1_0
                if major == 1
                else np.lib.format.read_array_header_2_0
            )
            shape = read(f)[0]
        return int(shape[1])
    for name, key in ((WEIGHTS, "W_dec"), ("sae_weights.safetensors", "W_dec")):
        if (path / name).is_file():
            with safe_open(path / name, framework="pt") as f:
                return int(f.get_slice(key).get_shape()[1])
    raise UsageError(
        f"{path} is no SAE this tool reads: expected a causaldim, SAELens or sparsify "
        "folder, or a Gemma Scope params.npz"
    )


def hook_name_of(cfg: dict) -> str | None:
    """The hook a SAELens cfg.json names: `hook_name`, `metadata.hook_name` (SAELens 6) or
    `hook_point` (before 6.0); None if none."""
    meta = cfg.get("metadata") if isinstance(cfg.get("metadata"), dict) else {}
    for name in (cfg.get("hook_name"), meta.get("hook_name"), cfg.get("hook_point")):
        if isinstance(name, str) and name.strip():
            return name.strip()
    return None


def peek_source(path: Path) -> dict:
    """What an SAE file says of itself, from its metadata only (no weights read): its
    format, and the site it names (`site`: a hook name, a Gemma Scope `layer_N` component
    of its path, a sparsify folder name `layers.N`; None if it names none). Read
    with causaldim.model.sites.site_of."""
    import re

    path = Path(path)
    if path.suffix == ".npz":
        parts = [p for p in path.parent.parts if re.fullmatch(r"layer_\d+|embedding", p)]
        return {"format": "gemma-scope", "site": parts[-1] if parts else None}
    if (path / CONFIG).is_file() and (path / WEIGHTS).is_file():
        meta = json.loads((path / CONFIG).read_text())
        if meta.get("format") == FORMAT:
            return {"format": "causaldim", "site": meta.get("hook_name")}
        named = re.fullmatch(r"layers\.\d+(\..+)?|embed_tokens", path.name)
        return {"format": "sparsify", "site": path.name if named else None}
    if (path / "sae_weights.safetensors").is_file() and (path / "cfg.json").is_file():
        _, cfg = _saelens_cfg(path)  # what causaldim cannot read is refused here, before work
        return {"format": "saelens", "site": hook_name_of(cfg)}
    raise UsageError(
        f"{path} is no SAE this tool reads: expected a causaldim, SAELens or sparsify "
        "folder, or a Gemma Scope params.npz"
    )


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
