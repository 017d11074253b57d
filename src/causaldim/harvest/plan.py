"""Everything decided and checked before any weights are loaded or anything written: the
model and layer, the corpus and its split, device, dtype and batch size, and each
layer's store key and folder."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import torch

from ..config import HarvestConfig
from ..devices import resolve_device, resolve_dtype
from ..errors import UsageError
from ..memory import ModelPassMemory, model_batch_size, model_pass_memory
from ..model.corpus import Corpus, Splits, leading_bos, load_corpus, split
from ..model.hub_corpus import corpus_for, is_hub_name
from ..model.load import (
    ModelSource,
    decoder_layers,
    fingerprint,
    layers_path_for,
    load_tokenizer,
    resolve_model,
    skeleton,
)
from .store import MANIFEST, key_digest


class Plan(NamedTuple):
    config: HarvestConfig
    source: ModelSource
    layer: int
    layers_path: str
    corpus: Corpus
    splits: Splits
    model_identity: dict
    key: dict  # of the headline layer's store
    store_dir: Path
    # Every layer the one pass harvests (the headline's and others), with its store's key
    # and folder; a layer's store does not depend on which others share its pass.
    keys: dict[int, dict]
    store_dirs: dict[int, Path]
    pass_memory: ModelPassMemory  # the estimate the batch size came from


def plan(
    cfg: HarvestConfig,
    extra_layers: tuple[int, ...] = (),
    profile: bool = False,
    dry_run: bool = False,
) -> Plan:
    """Validate the request cheaply (config files and the corpus only); UsageError if bad.
    extra_layers are harvested in the same pass as cfg.layer, each into its own store;
    with profile, the eval pass taps every block (its batch sized for that). A dry run
    plans a known hub model it cannot reach from its shape, and its corpus's tokens from
    its characters."""
    cfg.check()
    device = resolve_device(cfg.device)
    source = resolve_model(cfg.model, cfg.trust_remote_code, shape_only=dry_run)
    layer = source.n_layers // 2 if cfg.layer is None else cfg.layer
    for i in (layer, *extra_layers):
        if not 0 <= i < source.n_layers:
            raise UsageError(
                f"layer {i} is out of range: {cfg.model} has {source.n_layers} layers "
                f"(0..{source.n_layers - 1}); choose --layer or --depth-layers within it"
            )
    layers_path = layers_path_for(source, cfg.layers_path)
    model = skeleton(source)  # on the meta device: no memory, no weights
    decoder_layers(model, layers_path)  # checks the path
    if source.context_length and cfg.seq_len > source.context_length:
        raise UsageError(
            f"--seq-len {cfg.seq_len} exceeds the context of {cfg.model} "
            f"({source.context_length} tokens)"
        )
    identity = {"name": cfg.model, "family": source.family, **fingerprint(source)}
    out = Path(cfg.out)
    check_out_folder(out, identity)  # before a hub corpus streams
    bos = None
    if source.kind == "known-shape":  # no tokenizer to be had: the sequences' count will do
        if is_hub_name(cfg.corpus):
            raise UsageError(
                f"a dry run of {cfg.model} without the hub has no tokenizer to count "
                f"{cfg.corpus}'s tokens with; plan it with a local --corpus"
            )
        corpus = load_corpus(cfg.corpus, cfg.text_field)
        sequences = estimated_sequences(corpus, cfg.seq_len)
    else:
        # A hub corpus is streamed only up to the tokens the run needs, counted by this
        # model's tokenizer; a local one is read whole.
        tokenizer = load_tokenizer(source)
        bos = leading_bos(tokenizer)
        corpus, sequences = corpus_for(
            cfg.corpus,
            tokenizer,
            cfg.seq_len,
            # the --headline-tokens extension's sequences come after --tokens
            cfg.tokens + (cfg.headline_tokens if cfg.logit_probes else 0),
            text_field=cfg.text_field,
            hub_config=cfg.corpus_config,
            hub_split=cfg.corpus_split,
            hub_revision=cfg.corpus_revision,
        )
    splits = split(sequences, cfg.tokens, cfg.eval_fraction, cfg.seed)
    n_params = sum(p.numel() for p in model.parameters())
    tapped = range(source.n_layers) if profile else {layer, *extra_layers}
    cfg, pass_memory = _resolve_hardware(cfg, device, source, n_params, min(tapped), len(tapped))
    common = {
        "model": identity,
        "layers_path": layers_path,
        "corpus_sha256": corpus.sha256,
        "seq_len": cfg.seq_len,
        "n_train": len(splits.train),
        "n_eval": len(splits.eval),
        "seed": cfg.seed,
        "dtype": cfg.dtype,
        "store_dtype": cfg.store_dtype,
        "outlier_factor": cfg.outlier_factor,
        "logit_probes": cfg.logit_probes,
        # the probes' products as stored: centred and shift parts apart (since results/4)
        "logit_probe_parts": ["centred", "shift"],
        "fisher_probes": cfg.fisher_probes,
        # each sequence opens with the tokenizer's BOS (Gemma's); absent where it has none,
        # so the keys of such models' stores are as before
        **({"bos_each_sequence": bos} if bos is not None else {}),
    }
    keys, dirs = {}, {}
    for i in sorted({layer, *extra_layers}):
        keys[i] = {**common, "layer": i}
        dirs[i] = out / "stores" / f"L{i}-{key_digest(keys[i])[:12]}"
    check_earlier_run(out, keys[layer])
    return Plan(
        cfg,
        source,
        layer,
        layers_path,
        corpus,
        splits,
        identity,
        keys[layer],
        dirs[layer],
        keys,
        dirs,
        pass_memory,
    )


def extension_sequences(the_plan: Plan) -> int:
    """The sequences beyond --tokens that --headline-tokens asks for (the headline pass's),
    as many as the corpus has; none without logit probes (nothing to measure on them)."""
    cfg = the_plan.config
    if not cfg.logit_probes:
        return 0
    return min(cfg.headline_tokens // cfg.seq_len, the_plan.splits.n_rest)


CHARS_PER_TOKEN = 4  # English text under the BPE tokenizers of today's LMs, roughly


def estimated_sequences(corpus: Corpus, seq_len: int) -> torch.Tensor:
    """Placeholder sequences, as many as the corpus would give at CHARS_PER_TOKEN (for a
    plan whose model's tokenizer cannot be had): a view of one row, no memory."""
    n = max(2, corpus.n_chars // CHARS_PER_TOKEN // seq_len)
    return torch.zeros(1, seq_len, dtype=torch.int64).expand(n, seq_len)


def _resolve_hardware(
    cfg: HarvestConfig,
    device: torch.device,
    source: ModelSource,
    n_params: int,
    lowest_layer: int,
    tapped: int,
) -> tuple[HarvestConfig, ModelPassMemory]:
    """cfg on device with a concrete dtype and batch size (the largest that fits, when
    not given), and the memory estimate behind it."""
    dtype = resolve_dtype(cfg.dtype, device)
    need = model_pass_memory(
        source.config,
        n_params,
        lowest_layer,
        cfg.seq_len,
        dtype,
        cfg.logit_probes,
        cfg.fisher_probes,
        device,
        tapped,
    )
    batch = cfg.batch_size or model_batch_size(need, device, max(1, cfg.tokens // cfg.seq_len))
    return replace(cfg, device=str(device), dtype=dtype, batch_size=batch), need


# What a run writes under --out; "depth", "scale" and "controls" hold the controls' own.
RUN_ENTRIES = {
    *("results.json", "stores", "saes", "scores", "subspace", "figures"),
    *("report.md", "report.html", "tables"),
}
CONTROL_ENTRIES = {"depth", "scale", "controls", "architectures"}


def check_out_folder(out: Path, identity: dict) -> None:
    """A run writes into an empty folder or its own earlier output, nothing else: the
    folder holds no files foreign to a run and no store of other weights (the same
    weights under another name pass)."""
    if not out.is_dir():
        return
    entries = {p.name for p in out.iterdir() if not p.name.startswith(".")}
    foreign = sorted(entries - RUN_ENTRIES - CONTROL_ENTRIES)
    if foreign:
        raise UsageError(
            f"--out {out} holds files that are not a causaldim run ({', '.join(foreign[:3])}"
            f"{', ...' if len(foreign) > 3 else ''}); choose an empty or new folder"
        )
    for manifest in sorted(out.glob(f"stores/*/{MANIFEST}")):
        try:
            other = json.loads(manifest.read_text())["model"]["identity"]
        except (ValueError, KeyError):
            continue
        if _weights(other) != _weights(identity):
            raise UsageError(
                f"--out {out} holds a store of another model ({other.get('name')}); "
                "choose another --out folder"
            )


def check_earlier_run(out: Path, key: dict) -> None:
    """A finished run in out must be of the same harvest (the headline store's key): the
    new run resumes or adds to it."""
    try:
        earlier = json.loads((out / "results.json").read_text())["inputs"]["store"]["key"]
    except (OSError, ValueError, KeyError, TypeError):
        return  # no finished run here (a damaged results.json is rewritten by this one)
    changed = sorted(k for k in set(key) | set(earlier) if key.get(k) != earlier.get(k))
    if changed:
        raise UsageError(
            f"--out {out} holds a run of another harvest ({', '.join(changed)} differ); "
            "choose another --out folder"
        )


def _weights(identity: dict) -> dict:
    return {k: v for k, v in identity.items() if k != "name"}
