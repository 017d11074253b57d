"""Harvesting: the model pass over both splits, written to one store per harvested layer
(train split: h; eval split: h, g and the probe products). Everything downstream reads
the stores only."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import NamedTuple, Protocol, cast

import torch

from .. import versions
from ..config import HarvestConfig
from ..errors import IntegrityError
from ..faults import fault_point
from ..fileio import write_sealed_json
from ..model.load import LoadedModel, load_model
from ..progress import bar as progress_bar
from .model_pass import HeadProbes, grads_at, head_probes, headline_at, residuals_at
from .plan import Plan, plan
from .store import FORMAT, MANIFEST, ShardWriter, Store, UnfinishedStore


class HarvestResult(NamedTuple):
    # the headline layer's (None only for a plan without store folders: the atlas's, which
    # reads no store)
    store: Store
    reused: bool
    lm: LoadedModel | None = None  # the loaded model, when the pass ran (for reuse)
    stores: dict[int, Store] | None = None  # every planned layer's, the headline's included
    # each tapped layer's median residual norm (the outlier rule), when the pass ran
    median_norms: dict[int, float] | None = None


class EvalObserver(Protocol):
    """Takes the eval pass's rows at more layers than the stores hold (the profile of
    every layer): tapping them makes the backward run on down to the lowest."""

    layers: tuple[int, ...]

    @property
    def wants_forward(self) -> bool:
        """Whether it wants a forward pass over the eval sequences before the eval pass (the
        activations' covariance, by which it weighs the eval pass's rows); an attribute or a
        property."""
        ...

    def add(self, layer: int, rows: dict[str, torch.Tensor]) -> None:
        """One batch's rows at `layer` as a store would hold them (h, g, u_logits,
        u_shift, u_fisher, token, pos, seq, outlier; flat over tokens), on the pass's device."""

    def add_forward(self, layer: int, rows: dict[str, torch.Tensor]) -> None:
        """The forward pass's rows at `layer`: h, pos, outlier."""

    def forward_done(self) -> None:
        """The forward pass is over."""


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


def _existing(root: Path, key: dict, repair: bool) -> tuple[Store | None, str]:
    """The finished store of this key under root, or None and why (absent, unfinished,
    another key, or damaged with repair). A damaged store is named, never silently reused."""
    try:
        store = Store(root)
        if store.manifest.get("key") != key:
            return None, "written for another request"
        store.verify()
    except UnfinishedStore:
        return None, "unfinished (no manifest)"
    except IntegrityError as e:
        if repair:
            detail = str(e).split(": ", 1)[-1].split("; rerun")[0]  # what is damaged
            return None, f"damaged ({detail}) and --repair was given"
        raise
    return store, ""


class _LayerOutput:
    """What the pass collects for one layer: its outlier threshold, writers and counts."""

    def __init__(self, root: Path, threshold: float, median_norm: float, d: int):
        self.root, self.threshold, self.median_norm = root, threshold, median_norm
        self.stats = _OutlierStats(d)
        self.splits: dict[str, dict] = {}


def harvest(
    cfg: HarvestConfig,
    progress: bool = True,
    the_plan: Plan | None = None,
    observer: EvalObserver | None = None,
    eval_round: int | None = None,
    lm: LoadedModel | None = None,
    median_norms: dict[int, float] | None = None,
):
    """Run the model pass for cfg (or reuse finished, matching stores): one pass writes
    the store of every planned layer that has none yet, and hands the observer (if any)
    the eval split's rows at its layers; with every store finished, only the eval split
    runs, for the observer. With eval_round (the index of the round's first sequence in
    the pooled eval sequences; --until-converged), only the eval split is harvested, its
    probes drawn as they would be at that index of one long eval split; lm: the model,
    already loaded; median_norms: each layer's median residual norm (the outlier rule's
    calibration) from the run the round extends, instead of calibrating again. A plan
    with no store folders only feeds the observer (the atlas)."""
    p = the_plan or plan(cfg)
    cfg = p.config  # device, dtype and batch size resolved
    assert cfg.batch_size is not None  # resolved
    found = {i: _existing(p.store_dirs[i], p.keys[i], cfg.repair) for i in p.store_dirs}
    stores = {i: store for i, (store, _) in found.items()}
    missing = [i for i, s in stores.items() if s is None]
    if not missing and observer is None:
        every = cast("dict[int, Store]", stores)  # none missing
        return HarvestResult(cast(Store, every.get(p.layer)), reused=True, stores=every)
    for i in missing:
        if p.store_dirs[i].exists():  # unfinished or damaged under --repair: redo it
            print(
                f"causaldim: note: store {p.store_dirs[i].name} is {found[i][1]}; "
                "harvesting it again",
                file=sys.stderr,
            )
            shutil.rmtree(p.store_dirs[i])
        p.store_dirs[i].mkdir(parents=True)

    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    lm = lm or load_model(p.source, cfg.dtype, p.layers_path, cfg.device, progress)
    seconds = {"load_model": time.perf_counter() - t0}

    # Each layer's outlier threshold comes from the median norm of a fixed calibration batch.
    tapped = sorted({*missing, *(observer.layers if observer else ())})
    median_norm = median_norms
    if median_norm is None:
        calib = residuals_at(lm, tapped, p.splits.train[: max(cfg.batch_size, 16)])
        median_norm = {i: float(calib[i].float()[:, 1:].norm(dim=-1).median()) for i in tapped}
    thresholds = {i: cfg.outlier_factor * median_norm[i] for i in tapped}
    probes = head_probes(lm) if cfg.logit_probes else None  # once: a d x d factor
    outputs = {
        i: _LayerOutput(p.store_dirs[i], thresholds[i], median_norm[i], p.source.d_model)
        for i in missing
    }

    if observer is not None and observer.wants_forward:
        t = time.perf_counter()
        _metric_pass(lm, p.splits.eval, observer, thresholds, cfg.batch_size, progress)
        seconds["metric"] = time.perf_counter() - t
    for name, seqs in (("eval", p.splits.eval), ("train", p.splits.train)):
        if name == "train" and (not missing or eval_round is not None):
            continue
        t = time.perf_counter()
        watcher = observer if name == "eval" else None
        offset = eval_round or 0
        _harvest_split(lm, p, name, seqs, outputs, thresholds, watcher, progress, offset, probes)
        seconds[name] = time.perf_counter() - t
        for out in outputs.values():
            out.splits[name]["tokens_per_second"] = out.splits[name]["n_tokens"] / seconds[name]

    for i, out in outputs.items():
        manifest = _manifest(p, i, out, seconds, missing, probes is not None)
        write_sealed_json(out.root / MANIFEST, manifest)
        stores[i] = Store(out.root)
    every = cast("dict[int, Store]", stores)  # every missing one written
    headline = cast(Store, every.get(p.layer))
    return HarvestResult(headline, p.layer not in missing, lm, every, median_norm)


def headline_only(p: Plan) -> bool:
    """Whether the plan's eval split is harvested by the headline pass (logit probes only,
    no head): the eval sequences beyond the run's own that only the headline reads."""
    return p.key.get("pass") == "headline"


def _manifest(
    p: Plan, layer: int, out: _LayerOutput, seconds: dict, shared_with, in_width: bool
) -> dict:
    cfg = p.config
    drawn = (
        "drawn in the model's width, as N(0, W^T C W) and m W^T 1 at the head's input "
        "(exactly the distribution of the vocabulary probes' products)"
        if in_width
        else "drawn over the vocabulary (the logits are not the linear head's own output)"
    )
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
            "position, centred over the vocabulary: u = J^T (v - mean(v))",
            "u_shift": "the same probes' shift parts: u = J^T (mean(v) 1); u_logits + "
            "u_shift = J^T v",
            "u_fisher": f"{cfg.fisher_probes} probe(s) v = onehot(y) - p, y ~ softmax; u = J^T v",
            "drawn": drawn,
        },
        # "headline": the head-free pass (h and the logit probes' products alone)
        "pass": "headline" if headline_only(p) else "full",
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
        "versions": versions("causaldim", "torch", "transformers"),
        "seconds": seconds,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _harvest_split(
    lm,
    p: Plan,
    name,
    seqs,
    outputs: dict[int, _LayerOutput],
    thresholds: dict[int, float],
    observer: EvalObserver | None,
    progress,
    offset: int = 0,
    probes: HeadProbes | None = None,
) -> None:
    cfg = p.config
    assert cfg.batch_size is not None  # resolved by plan()
    headline = headline_only(p)
    writers = {
        i: ShardWriter(out.root, name, cfg.store_dtype, cfg.shard_tokens)
        for i, out in outputs.items()
    }
    tapped = sorted({*outputs, *(observer.layers if observer else ())})
    n_outliers = dict.fromkeys(outputs, 0)
    loss_sum, n_pred = 0.0, 0
    bar = progress_bar(desc=f"{name} pass", total=seqs.numel(), unit="tok", enabled=progress)
    for start in range(0, len(seqs), cfg.batch_size):
        ids = seqs[start : start + cfg.batch_size]
        per_layer: dict[int, tuple[torch.Tensor, dict]] = {}
        if name == "eval":
            # One generator per batch, so that probes do not depend on batching history.
            gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + offset + start)
            if headline and probes is not None:
                grads = headline_at(lm, tapped, ids, cfg.logit_probes, probes, gen)
            elif headline:  # a head that is not linear: the full pass, its logit products kept
                grads = {
                    i: out._replace(g=None, u_shift=None)
                    for i, out in grads_at(lm, tapped, ids, cfg.logit_probes, 0, gen).items()
                }
            else:
                grads = grads_at(lm, tapped, ids, cfg.logit_probes, cfg.fisher_probes, gen, probes)
            for i, out in grads.items():
                cols = {
                    "g": out.g,
                    "u_logits": out.u_logits,
                    "u_shift": out.u_shift,
                    "u_fisher": out.u_fisher,
                }
                per_layer[i] = (out.h, {k: v for k, v in cols.items() if v is not None})
            if not headline:
                first = next(iter(grads.values()))
                loss_sum, n_pred = loss_sum + first.loss_sum, n_pred + first.n_predictions
        else:
            per_layer = {i: (h, {}) for i, h in residuals_at(lm, tapped, ids).items()}
        b, t = ids.shape
        pos = torch.arange(t, dtype=torch.int32).repeat(b)
        seq = torch.arange(start, start + b, dtype=torch.int32).repeat_interleave(t)
        for i, (h, cols) in per_layer.items():
            _check_finite(f"{name} pass at layer {i}", start, h, *cols.values())
            rows = {
                "h": h.flatten(0, 1),
                **{k: v.flatten(0, 1) for k, v in cols.items()},
                "token": ids.flatten().to(torch.int32),
                "pos": pos,
                "seq": seq,
            }
            rows["outlier"] = (pos == 0) | (rows["h"].float().norm(dim=-1).cpu() > thresholds[i])
            if observer is not None and i in observer.layers:
                device = rows["h"].device
                seen = {k: v.to(device) for k, v in rows.items()}
                seen["seq"] = seen["seq"] + offset  # numbered on from the run's eval split
                observer.add(i, seen)
            if i in outputs:
                rows = {k: v.cpu() for k, v in rows.items()}
                outputs[i].stats.add(rows["h"].float(), rows["outlier"])
                n_outliers[i] += int(rows["outlier"].sum())
                writers[i].add(**rows)
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
        if name == "eval" and n_pred:
            info["mean_loss"] = loss_sum / n_pred
        outputs[i].splits[name] = info


def _metric_pass(
    lm, seqs, observer: EvalObserver, thresholds: dict[int, float], batch_size: int, progress
) -> None:
    """A forward pass over the eval sequences for the observer's layers, each row's
    outlier flag as the eval pass sets it: what weighs the eval pass's rows."""
    bar = progress_bar(desc="metric pass", total=seqs.numel(), unit="tok", enabled=progress)
    for start in range(0, len(seqs), batch_size):
        ids = seqs[start : start + batch_size]
        pos = torch.arange(ids.shape[1], dtype=torch.int32).repeat(len(ids))
        for i, h in residuals_at(lm, observer.layers, ids).items():
            h = h.flatten(0, 1)
            outlier = (pos == 0) | (h.float().norm(dim=-1).cpu() > thresholds[i])
            observer.add_forward(i, {"h": h, "outlier": outlier.to(h.device)})
        bar.update(ids.numel())
    bar.close()
    observer.forward_done()


def _check_finite(stage: str, first_seq: int, *tensors: torch.Tensor) -> None:
    for x in tensors:
        bad = ~torch.isfinite(x).flatten(2).all(-1)  # [B, T]
        if bad.any():
            where = [(first_seq + int(i), int(j)) for i, j in bad.nonzero()[:5]]
            raise FloatingPointError(
                f"non-finite values in the {stage} at (sequence, position) {where}"
            )
