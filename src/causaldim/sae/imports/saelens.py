"""A SAELens folder (cfg.json + sae_weights.safetensors) as SAELens 6's `SAE.load_from_disk`
reads it: a pre-6.0 config translated as its `handle_pre_6_0_config` does, then the
fields its inference class reads, each understood or refused.

SAELens' forward: pre = (x - b_dec [apply_b_dec_to_input]) W_enc + b_enc; standard
f = relu(pre); jumprelu f = relu(pre) [pre > threshold]; topk keeps the k largest of
pre (times the decoder row norms with rescale_acts_by_decoder_norm), relu'd, and decodes
f (divided by those norms) W_dec + b_dec. SAELens ignores config keys its class does not
have, so other keys are ignored here too.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...errors import UsageError
from ..base import SAEConfig
from . import Reading, check_k, check_tensors, files

WEIGHTS, CONFIG = "sae_weights.safetensors", "cfg.json"
ARCHITECTURES = {"standard": "relu", "topk": "topk", "jumprelu": "jumprelu"}
DTYPES = {
    name: dtype
    for short, dtype in (
        ("float32", torch.float32),
        ("float64", torch.float64),
        ("float16", torch.float16),
        ("bfloat16", torch.bfloat16),
    )
    for name in (short, f"torch.{short}")
}
# Why each architecture SAELens registers is not read (the rest: "not read").
_REFUSED = {
    "batchtopk": "a BatchTopK training checkpoint; save it with SAELens' save_inference_model "
    "(which writes it as jumprelu) and pass that folder",
    "matryoshka_batchtopk": "a Matryoshka BatchTopK training checkpoint; save it with SAELens' "
    "save_inference_model (which writes it as jumprelu) and pass that folder",
    "gated": "a gated SAE (its gate and magnitude paths have no place in causaldim's SAEs)",
    "abstopk": "an AbsTopK SAE (it keeps negative activations, which causaldim's SAEs do not)",
    "transcoder": "a transcoder, not an SAE of the residual stream",
    "skip_transcoder": "a transcoder, not an SAE of the residual stream",
    "jumprelu_transcoder": "a transcoder, not an SAE of the residual stream",
    "jumprelu_skip_transcoder": "a transcoder, not an SAE of the residual stream",
}


def _pre_6(cfg: dict) -> dict:
    """A config written before SAELens 6.0 as SAELens 6 translates it."""
    renames = {
        "hook_point": "hook_name",
        "hook_point_head_index": "hook_head_index",
        "activation_fn_str": "activation_fn",
    }
    new = {renames.get(k, k): v for k, v in cfg.items()}
    new.setdefault("apply_b_dec_to_input", True)
    new.setdefault("architecture", "standard")
    hook = given if isinstance(given := new.get("hook_name"), str) else ""
    new.setdefault("reshape_activations", "hook_z" if "hook_z" in hook else "none")
    kwargs = new.get("activation_fn_kwargs") or {}
    if new.get("activation_fn") == "topk" and kwargs.get("k") is not None:
        new["architecture"] = "topk"
    if new["architecture"] == "topk" and "activation_fn_kwargs" in new:
        new["k"] = kwargs.get("k")
    norm = new.get("normalize_activations")
    if isinstance(norm, bool):
        new["normalize_activations"] = "expected_average_only_in" if norm else "none"
    elif norm is None:
        new["normalize_activations"] = "none"
    # SAELens keeps only these top-level keys as the metadata (a `metadata` written
    # without sae_lens_version is dropped).
    meta = {k: new[k] for k in ("hook_name", "hook_head_index", "model_name") if k in new}
    return {**new, "metadata": meta}


def _is_pre_6(path: Path, cfg: dict) -> bool:
    meta = given if isinstance(given := cfg.get("metadata"), dict) else {}
    version = cfg.get("sae_lens_version") or meta.get("sae_lens_version")
    if not version:
        return True
    try:
        return int(str(version).split(".")[0]) < 6
    except ValueError:
        raise UsageError(f"{path}: sae_lens_version {version!r} is no version") from None


def config(folder: Path) -> dict:
    """cfg.json as SAELens 6 reads it."""
    path = Path(folder) / CONFIG
    cfg = files.read_json(path)
    return _pre_6(cfg) if _is_pre_6(path, cfg) else cfg


def hook_name_of(cfg: dict) -> str | None:
    """The hook a SAELens cfg.json names: `hook_name`, `metadata.hook_name` (SAELens 6) or
    `hook_point` (before 6.0); None if none."""
    meta = given if isinstance(given := cfg.get("metadata"), dict) else {}
    for name in (cfg.get("hook_name"), meta.get("hook_name"), cfg.get("hook_point")):
        if isinstance(name, str) and name.strip():
            return name.strip()
    return None


def _size(path: Path, cfg: dict, field: str) -> int:
    value = cfg.get(field)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UsageError(f"{path}: {field} = {value!r}; SAELens needs a positive integer")
    return value


def inspect(folder: Path) -> Reading:
    """The folder's Reading, from cfg.json and the weights' header; a one-line UsageError
    naming the field for every variant causaldim cannot represent."""
    folder = Path(folder)
    path = folder / CONFIG
    cfg = config(folder)
    arch = cfg.get("architecture", "standard")
    if arch not in ARCHITECTURES:
        why = _REFUSED.get(arch, "not read")
        raise UsageError(
            f"{path}: SAELens architecture {arch!r} is {why}; causaldim reads "
            f"{', '.join(ARCHITECTURES)}"
        )
    d, m = _size(path, cfg, "d_in"), _size(path, cfg, "d_sae")
    apply_b_dec = cfg.get("apply_b_dec_to_input", True)
    if not isinstance(apply_b_dec, bool):
        raise UsageError(f"{path}: apply_b_dec_to_input = {apply_b_dec!r} is not true or false")
    norm = cfg.get("normalize_activations", "none")
    if norm != "none":
        raise UsageError(
            f"{path}: normalize_activations: {norm!r} rescales inputs at run time, which "
            "causaldim does not; fold the normalisation into the weights and set it to 'none'"
        )
    if (reshape := cfg.get("reshape_activations", "none")) != "none":
        raise UsageError(
            f"{path}: reshape_activations: {reshape!r} reads attention heads, not the residual "
            "stream"
        )
    meta = given if isinstance(given := cfg.get("metadata"), dict) else {}
    if meta.get("hook_head_index") is not None:
        raise UsageError(
            f"{path}: hook_head_index: {meta['hook_head_index']!r} reads one attention head, "
            "not the residual stream"
        )
    dtype = cfg.get("dtype", "float32")
    if dtype not in DTYPES:
        raise UsageError(f"{path}: dtype {dtype!r} is none of SAELens' {', '.join(DTYPES)}")
    k, rescale = None, False
    if arch == "topk":
        k = check_k(path, cfg.get("k", 100), m)  # 100: TopKSAEConfig's default
        rescale = cfg.get("rescale_acts_by_decoder_norm", False)
        if not isinstance(rescale, bool):
            raise UsageError(
                f"{path}: rescale_acts_by_decoder_norm = {rescale!r} is not true or false"
            )
    expected = {"W_enc": (d, m), "b_enc": (m,), "W_dec": (m, d), "b_dec": (d,)}
    if arch == "jumprelu":
        expected["threshold"] = (m,)
    weights = folder / WEIGHTS
    header = files.safetensors_header(weights)
    check_tensors(weights, header, expected, f"SAELens' {arch}", droppable=("scaling_factor",))
    return Reading(
        "saelens",
        SAEConfig(ARCHITECTURES[arch], d, m, k=k),
        weights,
        {name: name for name in expected},
        site=hook_name_of(cfg),
        b_dec_in_input=apply_b_dec,
        rescale_by_decoder_norm=rescale,
        held_as=DTYPES[dtype],
    )
