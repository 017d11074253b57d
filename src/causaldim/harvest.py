"""The one model pass: residuals (train split) and residuals with loss gradients (eval
split) at layer L, written to a store. Everything downstream reads the store only."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from . import __version__
from .config import HarvestConfig
from .corpus import Corpus, Splits, load_corpus, split, tokenize
from .errors import UsageError
from .fileio import atomic_write_json
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
from .store import FORMAT, MANIFEST, ShardWriter, Store, StoreError

# ---------------------------------------------------------------------------- model pass


class _StopForward(Exception):
    """Raised by the hook on block L to end a forward that needs nothing above L."""


@contextmanager
def _tap(block: nn.Module, mode: str):
    """Hook on block L's output. mode "stop": capture it and end the forward there.
    mode "leaf": swap in a detached copy that requires grad, so that backward stops at L
    (with frozen weights nothing below L records a graph at all)."""
    captured: list[torch.Tensor] = []

    def hook(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        if mode == "stop":
            captured.append(hidden.detach())
            raise _StopForward
        leaf = hidden.detach().requires_grad_(True)
        captured.append(leaf)
        return (leaf, *output[1:]) if isinstance(output, tuple) else leaf

    handle = block.register_forward_hook(hook)
    try:
        yield captured
    finally:
        handle.remove()


def residuals(lm: LoadedModel, layer: int, ids: torch.Tensor) -> torch.Tensor:
    """h at the output of block `layer`, [B, T, d]; the forward stops there."""
    with torch.inference_mode(), _tap(lm.layers[layer], "stop") as captured:
        try:
            lm.model(input_ids=ids, use_cache=False)
        except _StopForward:
            pass
    return captured[0]


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
    with torch.enable_grad(), _tap(lm.layers[layer], "leaf") as captured:
        logits = lm.model(input_ids=ids, use_cache=False).logits
        loss = F.cross_entropy(
            logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="sum"
        )
        h = captured[0]
        backwards_left = logit_probes + fisher_probes
        (g,) = torch.autograd.grad(loss, h, retain_graph=backwards_left > 0)

        def pull_back(probes: list[torch.Tensor]) -> torch.Tensor | None:
            nonlocal backwards_left
            out = []
            for v in probes:
                backwards_left -= 1
                (u,) = torch.autograd.grad(logits, h, v, retain_graph=backwards_left > 0)
                out.append(u)
            return torch.stack(out, dim=2) if out else None

        u_logits = pull_back(gaussian_probes(logits, logit_probes, generator))
        u_fisher = pull_back(fisher_probes_for(logits, fisher_probes, generator))
    return Gradients(h.detach(), g, u_logits, u_fisher, loss.item(), ids[:, 1:].numel())


def gaussian_probes(logits: torch.Tensor, k: int, generator=None) -> list[torch.Tensor]:
    """v ~ N(0, I) over the vocabulary at every position: E[J^T v v^T J] = J^T J."""
    return [
        torch.randn(logits.shape, generator=generator, dtype=torch.float32).to(logits.dtype)
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
        r = torch.rand(len(flat), 1, generator=generator, dtype=cdf.dtype) * cdf[:, -1:]
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
    key: dict
    store_dir: Path


def plan(cfg: HarvestConfig) -> Plan:
    """Validate the request cheaply (config files and the corpus only); UsageError if bad."""
    cfg.check()
    source = resolve_model(cfg.model, cfg.trust_remote_code)
    layer = source.n_layers // 2 if cfg.layer is None else cfg.layer
    if layer >= source.n_layers:
        raise UsageError(
            f"--layer {layer} is out of range: {cfg.model} has {source.n_layers} layers "
            f"(0..{source.n_layers - 1})"
        )
    layers_path = layers_path_for(source, cfg.layers_path)
    _check_layers_path(source, layers_path)
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
    key = {
        "model": identity,
        "layer": layer,
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
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return Plan(
        cfg,
        source,
        layer,
        layers_path,
        corpus,
        splits,
        identity,
        key,
        out / "stores" / f"L{layer}-{digest}",
    )


def _check_layers_path(source: ModelSource, path: str) -> None:
    """Check the path on the model's meta-device skeleton (no memory, no weights)."""
    decoder_layers(skeleton(source), path)


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
    store: Store
    reused: bool
    lm: LoadedModel | None = None  # the loaded model, when the pass ran (for reuse)


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


def _existing(plan: Plan) -> Store | None:
    try:
        store = Store(plan.store_dir)
    except StoreError:
        return None
    if store.manifest.get("key") != plan.key:
        return None
    store.verify()  # a damaged store is named, never silently reused
    return store


def harvest(cfg: HarvestConfig, progress: bool = True, the_plan: Plan | None = None):
    """Run the model pass for cfg (or reuse a finished, matching store)."""
    p = the_plan or plan(cfg)
    if (store := _existing(p)) is not None:
        return HarvestResult(store, reused=True)
    if p.store_dir.exists():  # an unfinished store of this same request: start it again
        shutil.rmtree(p.store_dir)
    p.store_dir.mkdir(parents=True)

    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    lm = load_model(p.source, cfg.dtype, p.layers_path)
    seconds = {"load_model": time.perf_counter() - t0}

    # The outlier threshold comes from the median norm of a fixed calibration batch.
    calib = residuals(lm, p.layer, p.splits.train[: max(cfg.batch_size, 16)]).float()
    median_norm = float(calib[:, 1:].norm(dim=-1).median())
    threshold = cfg.outlier_factor * median_norm

    splits_info, stats = {}, _OutlierStats(p.source.d_model)
    for name, seqs in (("eval", p.splits.eval), ("train", p.splits.train)):
        t = time.perf_counter()
        splits_info[name] = _harvest_split(lm, p, name, seqs, threshold, stats, progress)
        seconds[name] = time.perf_counter() - t
        splits_info[name]["tokens_per_second"] = splits_info[name]["n_tokens"] / seconds[name]

    manifest = {
        "format": FORMAT,
        "key": p.key,
        "model": {
            "identity": p.model_identity,
            "kind": p.source.kind,
            "n_layers": p.source.n_layers,
            "d_model": p.source.d_model,
            "vocab_size": int(p.source.config.vocab_size),
        },
        "layer": p.layer,
        "layers_path": p.layers_path,
        "site": f"output of block {p.layer} ({p.layers_path}[{p.layer}])",
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
            "median_norm": median_norm,
            "threshold": threshold,
            "n_outliers": sum(s["n_outliers"] for s in splits_info.values()),
            "n_tokens": sum(s["n_tokens"] for s in splits_info.values()),
            "variance_share": stats.variance_share(),
        },
        "splits": splits_info,
        "versions": _versions(),
        "seconds": seconds,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    atomic_write_json(p.store_dir / MANIFEST, manifest)
    return HarvestResult(Store(p.store_dir), reused=False, lm=lm)


def _harvest_split(lm, p: Plan, name, seqs, threshold, stats, progress) -> dict:
    cfg = p.config
    writer = ShardWriter(p.store_dir, name, cfg.store_dtype, cfg.shard_tokens)
    n_outliers, loss_sum, n_pred = 0, 0.0, 0
    bar = tqdm(total=seqs.numel(), desc=f"{name} pass", unit="tok", disable=not progress)
    for start in range(0, len(seqs), cfg.batch_size):
        ids = seqs[start : start + cfg.batch_size]
        cols: dict[str, torch.Tensor] = {}
        if name == "eval":
            # One generator per batch, so that probes do not depend on batching history.
            gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + start)
            out = residuals_and_grads(lm, p.layer, ids, cfg.logit_probes, cfg.fisher_probes, gen)
            h = out.h
            cols = {"g": out.g, "u_logits": out.u_logits, "u_fisher": out.u_fisher}
            cols = {k: v for k, v in cols.items() if v is not None}
            loss_sum, n_pred = loss_sum + out.loss_sum, n_pred + out.n_predictions
        else:
            h = residuals(lm, p.layer, ids)
        _check_finite(name, start, h, *cols.values())
        cols = {k: v.flatten(0, 1) for k, v in cols.items()}
        b, t, _ = h.shape
        flat = h.flatten(0, 1)
        pos = torch.arange(t, dtype=torch.int32).repeat(b)
        outlier = (pos == 0) | (flat.float().norm(dim=-1) > threshold)
        stats.add(flat.float(), outlier)
        n_outliers += int(outlier.sum())
        writer.add(
            h=flat,
            **cols,
            token=ids.flatten().to(torch.int32),
            pos=pos,
            seq=torch.arange(start, start + b, dtype=torch.int32).repeat_interleave(t),
            outlier=outlier,
        )
        bar.update(ids.numel())
    writer.flush()
    bar.close()
    info = {
        "n_sequences": len(seqs),
        "n_tokens": seqs.numel(),
        "n_outliers": n_outliers,
        "fields": writer.fields,
        "shards": writer.shards,
    }
    if name == "eval":
        info["mean_loss"] = loss_sum / n_pred
    return info


def _check_finite(split_name: str, first_seq: int, *tensors: torch.Tensor) -> None:
    for x in tensors:
        bad = ~torch.isfinite(x).flatten(2).all(-1)  # [B, T]
        if bad.any():
            where = [(first_seq + int(i), int(j)) for i, j in bad.nonzero()[:5]]
            raise FloatingPointError(
                f"non-finite values in the {split_name} pass at (sequence, position) {where}"
            )


def _versions() -> dict:
    import transformers

    return {
        "causaldim": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
