"""The one model pass: residuals (train split) and residuals with loss gradients (eval
split) at layer L, written to a store. Everything downstream reads the store only."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from . import __version__
from .config import HarvestConfig
from .corpus import Corpus, Splits, load_corpus, split, tokenize
from .devices import resolve_device, resolve_dtype
from .errors import IntegrityError, UsageError
from .faults import fault_point
from .fileio import write_sealed_json
from .memory import ModelPassMemory, model_batch_size, model_pass_memory
from .models import (
    LoadedModel,
    ModelSource,
    decoder_layers,
    fingerprint,
    layers_path_for,
    load_model,
    load_tokenizer,
    resolve_model,
    skeleton,
)
from .store import FORMAT, MANIFEST, ShardWriter, Store, UnfinishedStore

# ---------------------------------------------------------------------------- model pass


class _StopForward(Exception):
    """Raised by the hook on block L to end a forward that needs nothing above L."""


@contextmanager
def tap_blocks(blocks: dict[int, nn.Module], mode: str):
    """Hooks on the outputs of the given blocks, captured into {layer: tensor}.
    mode "stop": capture them and end the forward at the highest one.
    mode "leaf": at the lowest, swap in a detached copy that requires grad, so that
    backward stops there (with frozen weights nothing below records a graph at all);
    the higher ones are captured inside the graph, so that one backward reaches all."""
    captured: dict[int, torch.Tensor] = {}
    lowest, highest = min(blocks), max(blocks)

    def hook_for(layer: int):
        def hook(module, args, output):
            hidden = output[0] if isinstance(output, tuple) else output
            if mode == "stop":
                captured[layer] = hidden.detach()
                if layer == highest:
                    raise _StopForward
                return None
            if layer != lowest:
                captured[layer] = hidden
                return None
            leaf = hidden.detach().requires_grad_(True)
            captured[layer] = leaf
            return (leaf, *output[1:]) if isinstance(output, tuple) else leaf

        return hook

    handles = [block.register_forward_hook(hook_for(i)) for i, block in blocks.items()]
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


def _blocks(lm: LoadedModel, layers) -> dict[int, nn.Module]:
    return {i: lm.layers[i] for i in sorted(set(layers))}


def residuals_at(lm: LoadedModel, layers, ids: torch.Tensor) -> dict[int, torch.Tensor]:
    """h at the output of each of the blocks `layers`, [B, T, d]; the forward stops at the
    highest."""
    with torch.inference_mode(), tap_blocks(_blocks(lm, layers), "stop") as captured:
        try:
            lm.model(input_ids=ids.to(lm.device), use_cache=False)
        except _StopForward:
            pass
    return captured


def residuals(lm: LoadedModel, layer: int, ids: torch.Tensor) -> torch.Tensor:
    """h at the output of block `layer`, [B, T, d]; the forward stops there."""
    return residuals_at(lm, (layer,), ids)[layer]


class Gradients(NamedTuple):
    h: torch.Tensor  # [B, T, d]
    g: torch.Tensor  # [B, T, d], d(summed next-token loss)/dh
    u_logits: torch.Tensor | None  # [B, T, K, d], J^T v with v ~ N(0, I) at every position
    u_fisher: torch.Tensor | None  # [B, T, K, d], J^T (onehot(y) - p), y ~ softmax
    loss_sum: float
    n_predictions: int


def residuals_and_grads(
    lm: LoadedModel,
    layer: int,
    ids: torch.Tensor,
    logit_probes: int = 0,
    fisher_probes: int = 0,
    generator: torch.Generator | None = None,
) -> Gradients:
    """h and g = dLoss/dh at block `layer`, Loss = next-token cross-entropy summed over
    all positions; one forward and a backward from the loss down to L only. Each probe
    adds one more backward from the logits down to L (the forward is shared)."""
    return grads_at(lm, (layer,), ids, logit_probes, fisher_probes, generator)[layer]


def grads_at(
    lm: LoadedModel,
    layers,
    ids: torch.Tensor,
    logit_probes: int = 0,
    fisher_probes: int = 0,
    generator: torch.Generator | None = None,
) -> dict[int, Gradients]:
    """residuals_and_grads at several blocks from one forward: each backward runs down to
    the lowest of them and yields every block's gradient on the way (the probes are
    shared by all blocks)."""
    blocks = _blocks(lm, layers)
    ids = ids.to(lm.device)
    with torch.enable_grad(), tap_blocks(blocks, "leaf") as captured:
        logits = lm.model(input_ids=ids, use_cache=False).logits
        loss = F.cross_entropy(
            logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="sum"
        )
        hs = [captured[i] for i in blocks]
        backwards_left = logit_probes + fisher_probes
        gs = torch.autograd.grad(loss, hs, retain_graph=backwards_left > 0)

        def pull_back(probes: list[torch.Tensor]) -> list[torch.Tensor | None]:
            nonlocal backwards_left
            per_probe = []
            for v in probes:
                backwards_left -= 1
                per_probe.append(
                    torch.autograd.grad(logits, hs, v, retain_graph=backwards_left > 0)
                )
            if not per_probe:
                return [None] * len(hs)
            return [torch.stack(us, dim=2) for us in zip(*per_probe, strict=True)]

        u_logits = pull_back(gaussian_probes(logits, logit_probes, generator))
        u_fisher = pull_back(fisher_probes_for(logits, fisher_probes, generator))
    n_pred = ids[:, 1:].numel()
    return {
        i: Gradients(h.detach(), g, ul, uf, loss.item(), n_pred)
        for i, h, g, ul, uf in zip(blocks, hs, gs, u_logits, u_fisher, strict=True)
    }


def gaussian_probes(logits: torch.Tensor, k: int, generator=None) -> list[torch.Tensor]:
    """v ~ N(0, I) over the vocabulary at every position: E[J^T v v^T J] = J^T J. Drawn
    on the CPU (generator's device), so that every device gets the same probes."""
    return [
        torch.randn(logits.shape, generator=generator, dtype=torch.float32, device="cpu").to(
            logits.device, logits.dtype
        )
        for _ in range(k)
    ]


def fisher_probes_for(logits: torch.Tensor, k: int, generator=None) -> list[torch.Tensor]:
    """v = onehot(y) - p with y drawn from the model's own softmax p at every position:
    E[v v^T] = diag(p) - p p^T, so E[u u^T] is the output Fisher pulled back to L."""
    if k == 0:
        return []
    p = logits.detach().float().softmax(-1)
    flat = p.reshape(-1, p.shape[-1])
    # Inverse-CDF sampling: one cumsum shared by all probes (torch.multinomial is ~10x
    # slower than the whole cumsum at a 49k vocabulary).
    cdf = flat.cumsum(-1)
    probes = []
    for _ in range(k):
        u = torch.rand(len(flat), 1, generator=generator, dtype=cdf.dtype, device="cpu")
        r = u.to(cdf.device) * cdf[:, -1:]
        y = torch.searchsorted(cdf, r, right=True).clamp_max(flat.shape[-1] - 1)
        v = -flat.clone()
        v.scatter_add_(1, y, torch.ones_like(y, dtype=v.dtype))
        probes.append(v.view_as(p).to(logits.dtype))
    return probes


# ---------------------------------------------------------------------------- planning


class Plan(NamedTuple):
    """Everything decided and checked before any weights are loaded or anything written."""

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


def plan(cfg: HarvestConfig, extra_layers: tuple[int, ...] = ()) -> Plan:
    """Validate the request cheaply (config files and the corpus only); UsageError if bad.
    extra_layers are harvested in the same pass as cfg.layer, each into its own store."""
    cfg.check()
    device = resolve_device(cfg.device)
    source = resolve_model(cfg.model, cfg.trust_remote_code)
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
    corpus = load_corpus(cfg.corpus, cfg.text_field)
    identity = {"name": cfg.model, "family": source.family, **fingerprint(source)}
    out = Path(cfg.out)
    _check_out_folder(out, identity)
    splits = split(
        tokenize(corpus, load_tokenizer(source), cfg.seq_len),
        cfg.tokens,
        cfg.eval_fraction,
        cfg.seed,
    )
    n_params = sum(p.numel() for p in model.parameters())
    cfg, pass_memory = _resolve_hardware(cfg, device, source, n_params, min((layer, *extra_layers)))
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
        "fisher_probes": cfg.fisher_probes,
    }
    keys, dirs = {}, {}
    for i in sorted({layer, *extra_layers}):
        keys[i] = {**common, "layer": i}
        digest = hashlib.sha256(json.dumps(keys[i], sort_keys=True).encode()).hexdigest()[:12]
        dirs[i] = out / "stores" / f"L{i}-{digest}"
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


def _resolve_hardware(
    cfg: HarvestConfig, device: torch.device, source: ModelSource, n_params: int, lowest_layer: int
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
    )
    batch = cfg.batch_size or model_batch_size(need, device, max(1, cfg.tokens // cfg.seq_len))
    return replace(cfg, device=str(device), dtype=dtype, batch_size=batch), need


def _check_out_folder(out: Path, identity: dict) -> None:
    for manifest in sorted(out.glob(f"stores/*/{MANIFEST}")):
        try:
            other = json.loads(manifest.read_text())["model"]["identity"]
        except (ValueError, KeyError):
            continue
        if _weights(other) != _weights(identity):  # the same weights under another name pass
            raise UsageError(
                f"--out {out} holds a store of another model ({other.get('name')}); "
                "choose another --out folder"
            )


def _weights(identity: dict) -> dict:
    return {k: v for k, v in identity.items() if k != "name"}


# ---------------------------------------------------------------------------- harvesting


class HarvestResult(NamedTuple):
    store: Store  # the headline layer's
    reused: bool
    lm: LoadedModel | None = None  # the loaded model, when the pass ran (for reuse)
    stores: dict[int, Store] | None = None  # every planned layer's, the headline's included


class _OutlierStats:
    """Counts outliers and the share of the residual variance they carry."""

    def __init__(self, d: int):
        self.n = {"all": 0, "outlier": 0}
        self.sum = {k: torch.zeros(d, dtype=torch.float64) for k in self.n}
        self.sq = {k: 0.0 for k in self.n}

    def add(self, h: torch.Tensor, outlier: torch.Tensor) -> None:
        h = h.double()
        for k, rows in (("all", h), ("outlier", h[outlier])):
            self.n[k] += len(rows)
            self.sum[k] += rows.sum(0)
            self.sq[k] += float((rows * rows).sum())

    def variance_share(self) -> float:
        if not self.n["all"]:
            return 0.0
        mu = self.sum["all"] / self.n["all"]

        def spread(k):  # sum over rows of ||h - mu||^2
            return self.sq[k] - 2 * float(mu @ self.sum[k]) + self.n[k] * float(mu @ mu)

        total = spread("all")
        return spread("outlier") / total if total > 0 else 0.0


def _existing(root: Path, key: dict, repair: bool) -> Store | None:
    """The finished store of this key under root, or None (absent, unfinished, another
    key, or damaged with repair). A damaged store is named, never silently reused."""
    try:
        store = Store(root)
        if store.manifest.get("key") != key:
            return None
        store.verify()
    except UnfinishedStore:
        return None
    except IntegrityError:
        if repair:
            return None
        raise
    return store


class _LayerOutput:
    """What the pass collects for one layer: its outlier threshold, writers and counts."""

    def __init__(self, root: Path, threshold: float, median_norm: float, d: int):
        self.root, self.threshold, self.median_norm = root, threshold, median_norm
        self.stats = _OutlierStats(d)
        self.splits: dict[str, dict] = {}


def harvest(cfg: HarvestConfig, progress: bool = True, the_plan: Plan | None = None):
    """Run the model pass for cfg (or reuse finished, matching stores): one pass writes
    the store of every planned layer that has none yet."""
    p = the_plan or plan(cfg)
    cfg = p.config  # device, dtype and batch size resolved
    stores = {i: _existing(p.store_dirs[i], p.keys[i], cfg.repair) for i in p.store_dirs}
    missing = [i for i, s in stores.items() if s is None]
    if not missing:
        return HarvestResult(stores[p.layer], reused=True, stores=stores)
    for i in missing:
        if p.store_dirs[i].exists():  # an unfinished store of this same request: redo it
            print(
                f"causaldim: note: store {p.store_dirs[i].name} is unfinished (no manifest); "
                "harvesting it again",
                file=sys.stderr,
            )
            shutil.rmtree(p.store_dirs[i])
        p.store_dirs[i].mkdir(parents=True)

    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    lm = load_model(p.source, cfg.dtype, p.layers_path, cfg.device)
    seconds = {"load_model": time.perf_counter() - t0}

    # Each layer's outlier threshold comes from the median norm of a fixed calibration batch.
    calib = residuals_at(lm, missing, p.splits.train[: max(cfg.batch_size, 16)])
    outputs = {}
    for i in missing:
        median_norm = float(calib[i].float()[:, 1:].norm(dim=-1).median())
        outputs[i] = _LayerOutput(
            p.store_dirs[i], cfg.outlier_factor * median_norm, median_norm, p.source.d_model
        )

    for name, seqs in (("eval", p.splits.eval), ("train", p.splits.train)):
        t = time.perf_counter()
        _harvest_split(lm, p, name, seqs, outputs, progress)
        seconds[name] = time.perf_counter() - t
        for out in outputs.values():
            out.splits[name]["tokens_per_second"] = out.splits[name]["n_tokens"] / seconds[name]

    for i, out in outputs.items():
        manifest = _manifest(p, i, out, seconds, shared_with=missing)
        write_sealed_json(out.root / MANIFEST, manifest)
        stores[i] = Store(out.root)
    return HarvestResult(stores[p.layer], reused=p.layer not in missing, lm=lm, stores=stores)


def _manifest(p: Plan, layer: int, out: _LayerOutput, seconds: dict, shared_with) -> dict:
    cfg = p.config
    return {
        "format": FORMAT,
        "key": p.keys[layer],
        "model": {
            "identity": p.model_identity,
            "kind": p.source.kind,
            "n_layers": p.source.n_layers,
            "d_model": p.source.d_model,
            "vocab_size": int(p.source.config.vocab_size),
        },
        "layer": layer,
        "layers_path": p.layers_path,
        "site": f"output of block {layer} ({p.layers_path}[{layer}])",
        "loss": "next-token cross-entropy summed over positions; g = dLoss/dh",
        "probes": {
            "u_logits": f"{cfg.logit_probes} Gaussian probe(s) v ~ N(0, I_vocab) per "
            "position; u = J^T v",
            "u_fisher": f"{cfg.fisher_probes} probe(s) v = onehot(y) - p, y ~ softmax; u = J^T v",
        },
        "corpus": {**p.corpus.describe(), "sequences_available": p.splits.n_available},
        "seq_len": cfg.seq_len,
        "dtype": cfg.dtype,
        "store_dtype": cfg.store_dtype,
        "seed": cfg.seed,
        "outliers": {
            "rule": "position 0, or residual norm > factor x median norm (median over "
            "positions >= 1 of a calibration batch of train sequences)",
            "factor": cfg.outlier_factor,
            "median_norm": out.median_norm,
            "threshold": out.threshold,
            "n_outliers": sum(s["n_outliers"] for s in out.splits.values()),
            "n_tokens": sum(s["n_tokens"] for s in out.splits.values()),
            "variance_share": out.stats.variance_share(),
        },
        "splits": out.splits,
        "pass_layers": sorted(shared_with),  # the seconds are of the whole shared pass
        "versions": _versions(),
        "seconds": seconds,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _harvest_split(lm, p: Plan, name, seqs, outputs: dict[int, _LayerOutput], progress) -> None:
    cfg = p.config
    writers = {
        i: ShardWriter(out.root, name, cfg.store_dtype, cfg.shard_tokens)
        for i, out in outputs.items()
    }
    n_outliers = dict.fromkeys(outputs, 0)
    loss_sum, n_pred = 0.0, 0
    bar = tqdm(total=seqs.numel(), desc=f"{name} pass", unit="tok", disable=not progress)
    for start in range(0, len(seqs), cfg.batch_size):
        ids = seqs[start : start + cfg.batch_size]
        per_layer: dict[int, tuple[torch.Tensor, dict]] = {}
        if name == "eval":
            # One generator per batch, so that probes do not depend on batching history.
            gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + start)
            grads = grads_at(lm, outputs, ids, cfg.logit_probes, cfg.fisher_probes, gen)
            for i, out in grads.items():
                cols = {"g": out.g, "u_logits": out.u_logits, "u_fisher": out.u_fisher}
                per_layer[i] = (out.h, {k: v for k, v in cols.items() if v is not None})
            first = next(iter(grads.values()))
            loss_sum, n_pred = loss_sum + first.loss_sum, n_pred + first.n_predictions
        else:
            per_layer = {i: (h, {}) for i, h in residuals_at(lm, outputs, ids).items()}
        per_layer = {
            i: (h.cpu(), {k: v.cpu() for k, v in cols.items()})
            for i, (h, cols) in per_layer.items()
        }
        b, t = ids.shape
        pos = torch.arange(t, dtype=torch.int32).repeat(b)
        seq = torch.arange(start, start + b, dtype=torch.int32).repeat_interleave(t)
        for i, (h, cols) in per_layer.items():
            _check_finite(f"{name} pass at layer {i}", start, h, *cols.values())
            flat = h.flatten(0, 1)
            outlier = (pos == 0) | (flat.float().norm(dim=-1) > outputs[i].threshold)
            outputs[i].stats.add(flat.float(), outlier)
            n_outliers[i] += int(outlier.sum())
            writers[i].add(
                h=flat,
                **{k: v.flatten(0, 1) for k, v in cols.items()},
                token=ids.flatten().to(torch.int32),
                pos=pos,
                seq=seq,
                outlier=outlier,
            )
        bar.update(ids.numel())
        fault_point("harvest.batch")
    bar.close()
    for i, writer in writers.items():
        writer.flush()
        info = {
            "n_sequences": len(seqs),
            "n_tokens": seqs.numel(),
            "n_outliers": n_outliers[i],
            "fields": writer.fields,
            "shards": writer.shards,
        }
        if name == "eval":
            info["mean_loss"] = loss_sum / n_pred
        outputs[i].splits[name] = info


def _check_finite(stage: str, first_seq: int, *tensors: torch.Tensor) -> None:
    for x in tensors:
        bad = ~torch.isfinite(x).flatten(2).all(-1)  # [B, T]
        if bad.any():
            where = [(first_seq + int(i), int(j)) for i, j in bad.nonzero()[:5]]
            raise FloatingPointError(
                f"non-finite values in the {stage} at (sequence, position) {where}"
            )


def _versions() -> dict:
    import transformers

    return {
        "causaldim": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
