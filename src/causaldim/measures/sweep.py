"""A sweep of SAEs, one per (architecture, width), trained from one store's train split
and evaluated on its eval split. Each finished SAE is written atomically and skipped when
a re-run finds it complete for the same store and settings."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

from ..devices import resolve_device, resolve_dtype
from ..errors import IntegrityError, UsageError
from ..executors import Executor, LocalExecutor
from ..fileio import write_sealed_json
from ..harvest.store import Store, key_digest
from ..memory import dense_batch_tokens
from ..model.sites import equivalents
from ..sae import SAE, SAEConfig, build
from ..sae.checkpoint import Checkpoint
from ..sae.formats import (
    CONFIG,
    WEIGHTS,
    describe_source,
    load,
    load_any,
    read_meta,
    round_weights,
    save,
    verify,
)
from ..sae.train import Normalizer, TrainSettings, train_sae
from ..sweep_config import SweepConfig
from .splice import ce_loss_recovered

# Whether an SAE whose weights were dropped is reusable: (its folder, its cfg.json) -> bool
Reusable = Callable[[Path, dict], bool]


class SweepEntry(NamedTuple):
    architecture: str
    width: int
    folder: Path
    reused: bool
    meta: dict  # what cfg.json holds: training stats and evaluation
    replicate: int = 0  # 0: the sweep's SAE of this width; j > 0: trained again, seed + j

    @property
    def dropped(self) -> bool:
        """Whether its weights were dropped once it was scored (--drop-weights)."""
        return "dropped" in self.meta

    @property
    def name(self) -> str:
        """The SAE's folder name: "topk-w256", or "topk-w256-s1" for a replicate."""
        return self.folder.name


def fit_normalizer(store: Store, max_tokens: int = 65_536) -> Normalizer:
    rows, n = [], 0
    for batch in store.batches("train", ("h",), 8192):
        rows.append(batch["h"])
        n += len(batch["h"])
        if n >= max_tokens:
            break
    return Normalizer.fit(torch.cat(rows)[:max_tokens])


@torch.no_grad()
def evaluate(sae: SAE, store: Store, batch_tokens: int = 4096) -> dict:
    """Fraction of variance explained, L0, alive and dead features, density histogram,
    on the eval split with outliers left out, on the SAE's device."""
    device = sae.b_dec.device
    fired = torch.zeros(sae.cfg.width, dtype=torch.long, device=device)
    sq_err, l0_sum, n = 0.0, 0.0, 0
    s1 = torch.zeros(sae.cfg.d_in, dtype=torch.float64, device=device)
    s2 = 0.0
    batch_tokens = dense_batch_tokens(sae.cfg.d_in, sae.cfg.width, batch_tokens, device)
    for batch in store.batches("eval", ("h",), batch_tokens):
        x = batch["h"].to(device)
        f = sae.encode(x)
        active = f > 0
        fired += active.sum(0)
        l0_sum += float(active.sum())
        sq_err += float((sae.decode(f) - x).pow(2).sum())
        s1 += x.double().sum(0)
        s2 += float(x.double().pow(2).sum())
        n += len(x)
    total_var = s2 - float(s1 @ s1) / n
    freq = fired.cpu().double() / n
    alive = int((fired > 0).sum())
    edges = list(range(-7, 1))
    log_freq = freq[freq > 0].log10()
    hist = torch.histc(log_freq.float(), bins=len(edges) - 1, min=edges[0], max=edges[-1])
    return {
        "n_tokens": n,
        "fraction_variance_explained": 1 - sq_err / total_var,
        "l0": l0_sum / n,
        "alive": alive,
        "dead": sae.cfg.width - alive,
        "dead_fraction": 1 - alive / sae.cfg.width,
        "density_histogram": {"log10_edges": edges, "counts": [int(c) for c in hist]},
    }


def _settings(cfg: SweepConfig, seed: int, device: torch.device, trained: int) -> TrainSettings:
    return TrainSettings(
        lr=cfg.lr,
        epochs=cfg.epochs,
        target_l0=float(cfg.k),
        dead_tokens=cfg.dead_tokens_for(trained),
        seed=seed,
        compute_dtype=resolve_dtype(cfg.sae_dtype, device),
        optimizer=cfg.optimizer,
    )


class TrainJob(NamedTuple):
    """One SAE of the sweep, as plain data: any worker that can read the store trains it."""

    store: str  # the store's folder
    folder: str  # where the SAE goes
    request: dict  # what the finished SAE's cfg.json records (and reuse compares)
    settings: dict  # TrainSettings
    steps: int
    checkpoint_steps: int
    repair: bool


def train_job(job: TrainJob, device: str = "cpu") -> None:
    """Train, evaluate and save one SAE on device (resuming from its checkpoint if one is
    there)."""
    dev = resolve_device(device)
    store, folder, request = Store(job.store), Path(job.folder), job.request
    normalizer = fit_normalizer(store).to(dev)
    # Train tokens on which JumpReLU and ReLU get their final exact L0 match.
    held_out = next(store.batches("train", ("h",), 16_384))["h"].to(dev)
    arch, width, k = request["architecture"], request["width"], request["k"]
    save_dtype = request.get("save_dtype", "float32")
    with dev:  # the weights are made where they train
        sae = build(SAEConfig(arch, store.d_model, width, k=k if arch == "topk" else None))
    checkpoint = Checkpoint(
        folder.parent / f".partial-{folder.name}", request, job.checkpoint_steps, job.repair
    )

    def batches():
        for b in store.batches("train", ("h",), request["batch_tokens"]):
            yield b["h"].to(dev, non_blocking=True)

    t = time.perf_counter()
    settings = TrainSettings(**job.settings)
    stats = train_sae(sae, batches, settings, job.steps, normalizer, held_out, checkpoint)
    meta = {
        "request": request,
        # the site, as SAELens names it: an import of this folder is checked against it
        "hook_name": equivalents(store.manifest["layer"])["saelens"],
        "train_stats": {**stats._asdict(), "seconds": time.perf_counter() - t},
        "normalizer": {"scale": normalizer.scale},
        "eval": evaluate(round_weights(sae.requires_grad_(False), save_dtype), store),
    }
    save(sae.cpu(), folder, meta, save_dtype)
    checkpoint.clear()


def run_sweep(
    store: Store,
    out: Path,
    cfg: SweepConfig,
    seed: int = 0,
    progress: bool = True,
    repair: bool = False,
    executor: Executor | None = None,
    reusable: Reusable | None = None,
) -> list[SweepEntry]:
    """Train (or reuse) every (architecture, width, replicate) SAE of the sweep, the missing ones as
    independent jobs of the executor (default: in this process); returns entries. An SAE
    killed mid-training resumes from its last checkpoint; a finished one whose weights
    fail their hash raises IntegrityError, or is trained again with repair. One whose
    weights were dropped (drop_weights) is reused where reusable(folder, meta) says that
    what was kept of it serves, else trained again."""
    out = Path(out)
    executor = executor or LocalExecutor()
    fingerprint = key_digest(store.manifest["key"])
    n_train = store.n_tokens("train", drop_outliers=True)
    steps = cfg.epochs * math.ceil(n_train / cfg.batch_tokens)
    settings = _settings(cfg, seed, resolve_device(executor.device), cfg.epochs * n_train)
    folders, jobs = {}, []
    # Replicate j > 0 trains the same SAE again with seed + j (--sae-seeds): replicate 0's
    # request is what it was before replicates existed, so its SAEs stay reusable.
    for j, arch, width in itertools.product(range(cfg.sae_seeds), cfg.architectures, cfg.widths):
        folder = out / "saes" / (f"{arch}-w{width}" + (f"-s{j}" if j else ""))
        folders[arch, width, j] = folder
        request = {
            "store": fingerprint,
            "train": {**settings.to_dict(), "seed": seed + j},
            "batch_tokens": cfg.batch_tokens,
            "architecture": arch,
            "width": width,
            "k": cfg.k,
            # float32 is left out: the SAEs saved before --save-dtype existed stay reusable
            **({"save_dtype": cfg.save_dtype} if cfg.save_dtype != "float32" else {}),
        }
        if _finished(folder, request, repair, reusable) is None:
            job = TrainJob(
                str(store.root),
                str(folder),
                request,
                request["train"],
                steps,
                cfg.checkpoint_steps,
                repair,
            )
            jobs.append(job)
    executor.map(train_job, jobs, "SAE sweep", progress)
    trained = {job.folder for job in jobs}
    return [
        SweepEntry(arch, width, folder, str(folder) not in trained, read_meta(folder), j)
        for (arch, width, j), folder in folders.items()
    ]


def sweep_saes(
    store: Store,
    out: Path,
    cfg: SweepConfig,
    seed: int = 0,
    progress: bool = True,
    repair: bool = False,
    executor: Executor | None = None,
    imports: list[dict] | None = None,
    reusable: Reusable | None = None,
) -> list[SweepEntry]:
    """The sweep's SAEs: imported from cfg.sae_paths where given (`imports`: their sources
    as the pipeline's check described them), else trained (run_sweep)."""
    if cfg.sae_paths:
        return import_saes(store, out, cfg.sae_paths, imports)
    return run_sweep(store, out, cfg, seed, progress, repair, executor, reusable)


def import_saes(
    store: Store, out: Path, paths: list[str], sources: list[dict] | None = None
) -> list[SweepEntry]:
    """SAEs trained elsewhere (Gemma Scope params.npz, SAELens or sparsify folders, our own)
    in place of training: each is evaluated on the store and saved under out/saes like a
    trained one, so that everything downstream treats them alike. Each entry's meta holds
    its `source`: path, format and the site its metadata names (and, fetched by
    --sae-release, release, id, repo and revision), from `sources` where given. Entries are
    ordered by architecture, then width."""
    fingerprint, entries = key_digest(store.manifest["key"]), []
    by_path = {str(Path(s["path"])): s for s in sources or []}
    for path in paths:
        source = Path(path)
        described = by_path.get(str(source)) or {"path": str(source), **describe_source(source)}
        request = {"store": fingerprint, "imported": str(source.resolve())}
        sae = load_any(source)
        if sae.cfg.d_in != store.d_model:
            raise UsageError(
                f"--sae-paths {path}: the SAE reads d = {sae.cfg.d_in}, the store's layer "
                f"has d = {store.d_model}; pass SAEs of this model and layer"
            )
        folder = Path(out) / "saes" / f"{sae.architecture}-w{sae.cfg.width}"
        meta = _finished(folder, request, repair=True)
        if meta is None:
            meta = {
                "request": request,
                "train_stats": {"seconds": 0.0, "steps": None, "imported_from": str(source)},
                "eval": evaluate(sae.requires_grad_(False), store),
                "source": described,
            }
            if described.get("block") is not None:
                meta["hook_name"] = equivalents(described["block"])["saelens"]
            save(sae, folder, meta)
        meta = {**meta, "source": described}  # as this run found it, if reused
        entries.append(SweepEntry(sae.architecture, sae.cfg.width, folder, True, meta))
    entries.sort(key=lambda e: (e.architecture, e.width))
    if len({(e.architecture, e.width) for e in entries}) < len(entries):
        raise UsageError("--sae-paths: two SAEs of one architecture and width; pass one each")
    return entries


def load_entry(entry: SweepEntry) -> SAE:
    return load(entry.folder)


def load_entries(entries: list[SweepEntry]) -> dict[str, SAE]:
    """The sweep's SAEs by name ("topk-w256"), frozen."""
    return {e.name: load_entry(e).requires_grad_(False) for e in entries}


def splice_evaluation(
    lm,
    store: Store,
    seqs: torch.Tensor,
    saes: dict[str, SAE],
    baseline: dict | None = None,
    hidden: list[torch.Tensor] | None = None,
) -> dict:
    """CE loss recovered of every SAE of the sweep, spliced in at the store's layer on
    these eval sequences; the mean-ablation floor uses the eval split's mean residual (or
    baseline's losses: an earlier result on the same sequences; hidden: their
    splice.block_outputs)."""
    mean = None
    if baseline is None:
        total, n = torch.zeros(store.d_model, dtype=torch.float64), 0
        for batch in store.batches("eval", ("h",), 8192):
            total += batch["h"].double().sum(0)
            n += len(batch["h"])
        mean = (total / n).float()
    return ce_loss_recovered(
        lm,
        store.manifest["layer"],
        seqs,
        saes,
        mean,
        store.manifest["outliers"]["threshold"],
        baseline=baseline,
        hidden=hidden,
    )


def drop_weights(entry: SweepEntry, kept: dict) -> SweepEntry:
    """Delete a scored SAE's weights (--drop-weights), once what the run reads of them is
    saved; `kept` says what (recorded in cfg.json as `dropped`, before the weights go: a
    kill between the two leaves a folder that reads as dropped)."""
    meta = {**entry.meta, "dropped": kept}
    write_sealed_json(entry.folder / CONFIG, meta)
    (entry.folder / WEIGHTS).unlink(missing_ok=True)
    return entry._replace(meta=meta)


def _finished(
    folder: Path, request: dict, repair: bool, reusable: Reusable | None = None
) -> dict | None:
    """cfg.json of a finished, intact SAE of this request in folder, or None. A damaged
    one raises IntegrityError, or gives None (train again) with repair; one whose weights
    were dropped is finished where reusable(folder, meta) says so."""
    if not folder.is_dir():
        return None
    try:
        if not (folder / CONFIG).is_file():  # folders are renamed into place whole
            raise IntegrityError(
                f"{folder / CONFIG} is missing; rerun with --repair to train that SAE again"
            )
        meta = read_meta(folder)
        if meta.get("request") != request:
            return None
        if "dropped" in meta:
            return meta if reusable is not None and reusable(folder, meta) else None
        verify(folder)
        return meta
    except IntegrityError:
        if repair:
            return None
        raise
