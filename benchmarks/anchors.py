"""TopK SAE training throughput against the anchors, SAELens and sparsify, in one run.

All trainers see the same activations: the store's train-split residuals (outliers
dropped), centred and scaled so that E||x||^2 = d, cut into batches of B tokens. Each is
timed at width W, k active latents, in float32 and in its own bf16 mode:

- floor: the dense encoder product alone, (B x d) @ (d x W), in that dtype, in the faster
  of two weight layouts (both are printed: without bf16 instructions a CPU is much slower
  in bf16 when W is stored [d, W] than when it is stored [W, d] and used transposed).
- SAELens: TopKTrainingSAE driven by SAETrainer.step (Adam, its default TopK settings);
  bf16 is its `autocast=True`. Its sparse-activation mode (use_sparse_activations with
  rescale_acts_by_decoder_norm=False, the only way it runs backward on a CPU) is timed
  too unless --no-saelens-sparse.
- sparsify: SparseCoder driven by the step its Trainer runs on cached activations
  (b_dec to the batch mean at step 0, unit-norm decoder, loss fvu + multi_topk_fvu / 8,
  gradient parallel to decoder rows removed, ScheduleFree-wrapped SignSGD at lr
  5e-3 / sqrt(W / 2^14)); bf16 wraps the forward in torch.autocast("cpu", bfloat16).
- causaldim: causaldim.sae.train.train_sae itself. It has no per-step hook, so a step is
  the time between two successive pulls of a batch from its data iterable (Adam, decoder
  renormalisation and bookkeeping all inside). bf16 uses the TrainSettings dtype field
  when it has one.

Every trainer and the floor are timed step by step: median of N steps after the
warm-up. By default every (trainer, dtype) runs in its own subprocess, so each peak
resident memory (getrusage ru_maxrss) is that trainer's alone; the parent gathers their
JSON lines and prints the table and the ratios. The anchors are never causaldim
dependencies: they live in benchmarks/.venv-anchors (see benchmarks/setup_anchors.sh).

    bash benchmarks/setup_anchors.sh
    benchmarks/.venv-anchors/bin/python benchmarks/anchors.py \\
        --store runs/default/stores/L15-8531d6249e71 [--width 16384] [--steps 5]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
from timing import StepClock

TRAINERS = ("floor", "saelens", "sparsify", "causaldim")
DTYPES = ("float32", "bfloat16")
TAG = "ANCHORS_JSON "  # prefix of the result lines a child prints for the parent
HERE = Path(__file__).resolve().parent
ANCHORS_PYTHON = HERE / ".venv-anchors" / "bin" / "python"


# ----------------------------------------------------------------------------- data


def load_activations(store: str, n_tokens: int, read_batch: int = 8192) -> torch.Tensor:
    """The first n_tokens train-split residuals (outliers dropped), centred and scaled so
    that E||x||^2 = d. Fewer are returned if the split is smaller (batches then cycle)."""
    from causaldim.harvest.store import Store

    rows, have = [], 0
    for batch in Store(store).batches("train", ("h",), read_batch):
        rows.append(batch["h"])
        have += len(batch["h"])
        if have >= n_tokens:
            break
    x = torch.cat(rows)[:n_tokens].float()
    x = x - x.mean(0)
    scale = (x.pow(2).sum(-1).mean() / x.shape[1]).sqrt()
    return (x / scale).contiguous()


def cut_batches(x: torch.Tensor, batch: int, n: int) -> list[torch.Tensor]:
    """n batches of `batch` tokens, cycling through x when it holds fewer than n * batch."""
    if len(x) < batch:
        raise SystemExit(f"the store has only {len(x)} train tokens, fewer than one batch")
    per_pass = len(x) // batch
    return [x[(i % per_pass) * batch : (i % per_pass + 1) * batch] for i in range(n)]


# ----------------------------------------------------------------------------- trainers


def timed_steps(step: Callable[[int, torch.Tensor], None], batches, warmup: int) -> list[float]:
    """Run step(i, batch) over all batches; the times of those after the warm-up."""
    times = []
    for i, x in enumerate(batches):
        t = time.perf_counter()
        step(i, x)
        if i >= warmup:
            times.append(time.perf_counter() - t)
    return times


def run_floor(batches, args, dtype: torch.dtype, mode: str) -> dict:
    """The product in both weight layouts: W stored [d, W] (as causaldim's and SAELens'
    W_enc) and stored [W, d], used transposed (as nn.Linear, sparsify's encoder). Without
    bf16 instructions a CPU's bf16 product is several times slower in the first; the floor
    is the faster."""
    d = batches[0].shape[1]
    w = torch.randn(d, args.width, generator=torch.Generator().manual_seed(0)).to(dtype)
    layouts = {"[d,W]": w, "[W,d].T": w.T.contiguous().T}
    xs = [x.to(dtype) for x in batches]
    medians, all_times = {}, {}
    for name, weight in layouts.items():

        def step(i, x, weight=weight):
            x @ weight

        all_times[name] = timed_steps(step, xs, args.warmup)
        medians[name] = statistics.median(all_times[name])
    fastest = min(medians, key=medians.get)
    note = ", ".join(f"W stored {n}: {t:.4f} s" for n, t in medians.items())
    return {"times": all_times[fastest], "layout": fastest, "layouts_s": medians, "note": note}


def run_saelens(batches, args, dtype: torch.dtype, mode: str) -> dict:
    import sae_lens
    from sae_lens import SAETrainer, TopKTrainingSAE, TopKTrainingSAEConfig
    from sae_lens.config import SAETrainerConfig

    torch.manual_seed(0)
    d, batch = batches[0].shape[1], len(batches[0])
    extra = {}
    if mode == "sparse":  # its sparse path crashes in backward on a CPU without the second
        extra = {"use_sparse_activations": True, "rescale_acts_by_decoder_norm": False}
    sae = TopKTrainingSAE(
        TopKTrainingSAEConfig(d_in=d, d_sae=args.width, k=args.k, device="cpu", **extra)
    )
    lr = 3e-4  # SAETrainerConfig's default; its runner sets lr_end = lr / 10
    cfg = SAETrainerConfig(
        total_training_samples=batch * len(batches),
        train_batch_size_samples=batch,
        lr=lr,
        lr_end=lr / 10,
        device="cpu",
        autocast=dtype == torch.bfloat16,
    )
    trainer = SAETrainer(cfg, sae, data_provider=iter(batches))

    def step(i, x):  # what SAETrainer.fit does per step, less logging and the progress bar
        trainer.maybe_reset_sparsity()
        trainer.step(x)
        trainer.n_training_steps += 1

    times = timed_steps(step, batches, args.warmup)
    return {"times": times, "version": sae_lens.__version__, "settings": extra or None}


def run_sparsify(batches, args, dtype: torch.dtype, mode: str) -> dict:
    from importlib.metadata import version

    from schedulefree import ScheduleFreeWrapper
    from sparsify import SparseCoder, SparseCoderConfig
    from sparsify.sign_sgd import SignSGD

    torch.manual_seed(0)
    d, width = batches[0].shape[1], args.width
    cfg = SparseCoderConfig(num_latents=width, k=args.k)  # multi_topk, auxk off: its defaults
    sae = SparseCoder(d, cfg, device="cpu")
    lr = 5e-3 / (width / 2**14) ** 0.5  # its Trainer's default for "signum"
    opt = ScheduleFreeWrapper(SignSGD([{"params": sae.parameters(), "lr": lr}]), momentum=0.95)
    opt.train()
    # Its forward's autocast is CUDA-only; on a CPU its bf16 mode is this wrapper.
    cast = (
        (lambda: torch.autocast("cpu", dtype=torch.bfloat16))
        if dtype == torch.bfloat16
        else contextlib.nullcontext
    )
    did_fire = torch.zeros(width, dtype=torch.bool)
    since_fired = torch.zeros(width, dtype=torch.long)

    def step(i, x):  # sparsify.Trainer's step for loss_fn="fvu" on one hookpoint
        if i == 0:
            sae.b_dec.data = x.mean(0).to(sae.dtype)
        sae.set_decoder_norm_to_unit_norm()
        total_variance = (x - x.mean(0)).pow(2).sum()
        with cast():
            out = sae(x=x, y=x, dead_mask=None, total_variance=total_variance)
        did_fire[out.latent_indices.flatten()] = True
        float(out.fvu.detach())  # its running average (a sync)
        loss = out.fvu + out.multi_topk_fvu / 8
        loss.backward()
        sae.remove_gradient_parallel_to_decoder_directions()
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            since_fired.add_(len(x))
            since_fired[did_fire] = 0
            did_fire.zero_()

    times = timed_steps(step, batches, args.warmup)
    return {"times": times, "version": version("eai-sparsify"), "lr": lr}


def causaldim_dtype_field() -> tuple[str | None, object]:
    """TrainSettings' compute-dtype field, if it has one, and its value for bf16."""
    from causaldim.sae.train import TrainSettings

    fields = dataclasses.fields(TrainSettings)
    names = [f.name for f in fields]
    preferred = ("compute_dtype", "dtype", "train_dtype", "precision")
    name = next((n for n in preferred if n in names), None)
    name = name or next((n for n in names if "dtype" in n), None)
    if name is None:
        return None, None
    default = next(f.default for f in fields if f.name == name)
    return name, torch.bfloat16 if isinstance(default, torch.dtype) else "bfloat16"


def run_causaldim(batches, args, dtype: torch.dtype, mode: str) -> dict:
    from causaldim.sae import SAEConfig, build
    from causaldim.sae.train import Normalizer, TrainSettings, train_sae

    d = batches[0].shape[1]
    kwargs = {}
    if dtype == torch.bfloat16:
        name, value = causaldim_dtype_field()
        if name is None:
            fields = ", ".join(f.name for f in dataclasses.fields(TrainSettings))
            raise Unavailable(
                f"causaldim's bf16 row is unavailable: TrainSettings has no dtype field "
                f"(fields: {fields})"
            )
        kwargs[name] = value
    settings = TrainSettings(**kwargs)
    sae = build(SAEConfig("topk", d, args.width, k=args.k))
    normalizer = Normalizer(mean=torch.zeros(d), scale=1.0)  # the batches are normalised
    # One batch more than the others get: a step runs from its batch's pull to the next's.
    clock = StepClock(batches + batches[:1])
    train_sae(sae, lambda: clock, settings, len(clock.batches), normalizer)
    return {
        "times": clock.step_times(args.warmup),
        "settings": {k: str(v) for k, v in kwargs.items()} or None,
    }


class Unavailable(RuntimeError):
    """A row that cannot be measured, for a reason that is not a crash."""


RUNNERS = {
    "floor": run_floor,
    "saelens": run_saelens,
    "sparsify": run_sparsify,
    "causaldim": run_causaldim,
}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def measure(trainer: str, dtype_name: str, mode: str, batches, args) -> dict:
    """One row; errors are caught and reported in it."""
    rec = {"trainer": trainer, "dtype": dtype_name, "mode": mode, "error": None}
    rec["rss_before_mb"] = round(peak_rss_mb(), 1)
    try:
        out = RUNNERS[trainer](batches, args, getattr(torch, dtype_name), mode)
        times = out.pop("times", None)
        if times is not None:
            out["step_s"] = statistics.median(times)
            out["times"] = [round(t, 5) for t in times]
        rec.update(out)
        rec["tokens_per_s"] = len(batches[0]) / rec["step_s"]
    except Unavailable as exc:
        rec["error"], rec["unavailable"] = str(exc), True
    except Exception as exc:  # report exactly why, keep going with the others
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        rec["error"] = (
            f"{type(exc).__name__}: {exc} (at {Path(frame.filename).name}:{frame.lineno} "
            f"in {frame.name})"
        )
        rec["traceback"] = traceback.format_exc()
    rec["peak_rss_mb"] = round(peak_rss_mb(), 1)
    return rec


def modes_of(trainer: str, args) -> list[str]:
    if trainer == "saelens" and args.saelens_sparse:
        return ["dense", "sparse"]
    return ["dense"] if trainer == "saelens" else ["default"]


# ----------------------------------------------------------------------------- output


def describe(rec: dict) -> str:
    name = rec["trainer"] + ("" if rec["mode"] in ("default", "dense") else f" ({rec['mode']})")
    head = f"{name:<18} {rec['dtype']:<9}"
    if rec.get("error"):
        return f"{head} {'UNAVAILABLE' if rec.get('unavailable') else 'FAILED'}: {rec['error']}"
    note = f"  [{rec['note']}]" if rec.get("note") else ""
    return (
        f"{head} {rec['step_s']:9.4f} s/step {rec['tokens_per_s']:10.0f} tok/s   "
        f"peak RSS {rec['peak_rss_mb']:7.0f} MB (before the trainer {rec['rss_before_mb']:.0f})"
        + note
    )


def best(records: list[dict], trainer: str) -> dict | None:
    ok = [r for r in records if r["trainer"] == trainer and not r.get("error")]
    return max(ok, key=lambda r: r["tokens_per_s"]) if ok else None


def summary(records: list[dict], args) -> None:
    print("\n== ratios ==")
    ours = [r for r in records if r["trainer"] == "causaldim" and not r.get("error")]
    if not ours:
        ran = any(r["trainer"] == "causaldim" for r in records)
        print(f"causaldim {'failed' if ran else 'was not run'}, so no ratios")
        return
    floors = {r["dtype"]: r for r in records if r["trainer"] == "floor" and not r.get("error")}
    for r in ours:
        f = floors.get(r["dtype"])
        if f:
            print(
                f"causaldim {r['dtype']} step / floor {r['dtype']} matmul: "
                f"{r['step_s'] / f['step_s']:.2f}x ({r['step_s']:.4f} s vs {f['step_s']:.4f} s)"
            )
    for anchor, label in (("saelens", "SAELens"), ("sparsify", "sparsify")):
        b = best(records, anchor)
        if b is None:
            ran = any(r["trainer"] == anchor for r in records)
            print(f"causaldim vs {label}: {label} {'failed' if ran else 'was not run'}")
            continue
        mode = "" if b["mode"] in ("default", "dense") else f" {b['mode']}"
        for r in ours:
            print(
                f"causaldim {r['dtype']} tok/s / {label} fastest ({b['dtype']}{mode}, "
                f"{b['tokens_per_s']:.0f} tok/s): {r['tokens_per_s'] / b['tokens_per_s']:.2f}x"
            )
    fastest = max(ours, key=lambda r: r["tokens_per_s"])
    print(f"causaldim fastest: {fastest['dtype']}, {fastest['tokens_per_s']:.0f} tok/s")


def cpu() -> str:
    """The processor, and whether it has bf16 matmul instructions (without them a CPU's
    bf16 products take a slow path, and fp32 is every library's fastest mode)."""
    model, flags = "unknown CPU", set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown CPU":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    bf16 = sorted(flags & {"avx512_bf16", "amx_bf16", "amx_tile"}) or ["none"]
    return f"{model}, {os.cpu_count()} cores, bf16 instructions: {' '.join(bf16)}"


def header(args, n_tokens: int | None = None) -> str:
    threads = args.threads or torch.get_num_threads()
    extra = f", {n_tokens} distinct tokens" if n_tokens is not None else ""
    return (
        f"TopK SAE training throughput: W={args.width} k={args.k} B={args.batch}, "
        f"{args.warmup} warm-up + {args.steps} timed steps, torch {torch.__version__}, "
        f"{threads} thread(s){extra}; store {args.store}\n{cpu()}"
    )


# ----------------------------------------------------------------------------- modes


def child(args) -> None:
    """Measure the rows for --only (all dtypes/modes unless --dtype/--mode) and print one
    JSON line per row."""
    if args.threads:
        torch.set_num_threads(args.threads)
    n = args.warmup + args.steps
    x = load_activations(args.store, n * args.batch)
    batches = cut_batches(x, args.batch, n)
    dtypes = [args.dtype] if args.dtype else list(DTYPES)
    for trainer in args.only:
        modes = [args.mode] if args.mode else modes_of(trainer, args)
        for mode in modes:
            for dtype in dtypes:
                rec = measure(trainer, dtype, mode, batches, args)
                rec.update(distinct_tokens=len(x), threads=torch.get_num_threads())
                print(describe(rec), file=sys.stderr, flush=True)
                print(TAG + json.dumps(rec), flush=True)


def child_args(args, trainer: str, dtype: str, mode: str) -> list[str]:
    out = [
        str(Path(__file__).resolve()),
        *("--store", args.store, "--width", str(args.width), "--k", str(args.k)),
        *("--batch", str(args.batch), "--warmup", str(args.warmup), "--steps", str(args.steps)),
        *("--only", trainer, "--dtype", dtype, "--mode", mode),
    ]
    if args.threads:
        out += ["--threads", str(args.threads)]
    return out


def causaldim_revision() -> str:
    try:
        root = HERE.parent
        rev = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "src"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return rev + (" with uncommitted changes under src/" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_child(python: str, args, trainer: str, dtype: str, mode: str) -> list[dict]:
    """One row in its own subprocess; a crash or a time-out becomes a failed row."""
    cmd = [python, *child_args(args, trainer, dtype, mode)]
    row = {"trainer": trainer, "dtype": dtype, "mode": mode}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return [{**row, "error": f"subprocess ran past --timeout {args.timeout} s"}]
    got = [json.loads(ln[len(TAG) :]) for ln in proc.stdout.splitlines() if ln.startswith(TAG)]
    if not got:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        msg = f"subprocess exited {proc.returncode} with no result; stderr tail:\n{tail}"
        got = [{**row, "error": msg}]
    return got


def parent(args) -> None:
    python = args.python or (str(ANCHORS_PYTHON) if ANCHORS_PYTHON.exists() else sys.executable)
    trainers = [t for t in TRAINERS if t in (args.trainers or TRAINERS)]
    print(header(args))
    print(f"causaldim revision {causaldim_revision()}; each row in its own subprocess ({python})")
    records = []
    for trainer in trainers:
        for mode in modes_of(trainer, args):
            for dtype in [args.dtype] if args.dtype else DTYPES:
                got = run_child(python, args, trainer, dtype, mode)
                for rec in got:
                    print(describe(rec), flush=True)
                    if rec.get("traceback") and args.verbose:
                        print(rec["traceback"], flush=True)
                records.extend(got)
    finish(records, args)


def in_process(args) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    n = args.warmup + args.steps
    x = load_activations(args.store, n * args.batch)
    batches = cut_batches(x, args.batch, n)
    print(header(args, len(x)))
    print(
        f"causaldim revision {causaldim_revision()}; all rows in this process "
        "(peak RSS is cumulative)"
    )
    records = []
    for trainer in [t for t in TRAINERS if t in (args.trainers or TRAINERS)]:
        for mode in modes_of(trainer, args):
            for dtype in [args.dtype] if args.dtype else DTYPES:
                rec = measure(trainer, dtype, mode, batches, args)
                rec["distinct_tokens"] = len(x)
                print(describe(rec), flush=True)
                records.append(rec)
    finish(records, args)


def finish(records: list[dict], args) -> None:
    seen = {r["distinct_tokens"] for r in records if "distinct_tokens" in r}
    needed = (args.warmup + args.steps) * args.batch
    for n in seen:
        cycled = " (batches cycle through them)" if n < needed else ""
        print(f"activations: {n} distinct train tokens for {needed} tokens of steps{cycled}")
    failed = [r for r in records if r.get("error")]
    if failed:
        print("\n== could not run ==")
        for r in failed:
            print(f"{r['trainer']} {r['mode']} {r['dtype']}: {r['error']}")
    summary(records, args)
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {"args": {k: v for k, v in vars(args).items()}, "revision": causaldim_revision()}
        path.write_text(json.dumps({"meta": meta, "records": records}, indent=1))
        print(f"\nwrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True, help="a causaldim store folder")
    ap.add_argument("--width", type=int, default=16384)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--batch", type=int, default=4096, help="tokens per step")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--steps", type=int, default=5, help="timed steps (median reported)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: its own)")
    ap.add_argument("--trainers", nargs="+", choices=TRAINERS, help="a subset, in parent mode")
    ap.add_argument("--dtype", choices=DTYPES, help="one dtype only (default: both)")
    ap.add_argument(
        "--no-saelens-sparse",
        dest="saelens_sparse",
        action="store_false",
        help="skip SAELens' sparse-activation mode",
    )
    ap.add_argument(
        "--only",
        nargs="+",
        choices=TRAINERS,
        help="child mode: measure these here and print JSON lines",
    )
    ap.add_argument("--mode", help="child mode: one mode of the trainer (dense/sparse/default)")
    ap.add_argument(
        "--in-process",
        action="store_true",
        help="run every row in this process instead of one subprocess each",
    )
    ap.add_argument(
        "--python",
        help="interpreter for the subprocesses "
        "(default: benchmarks/.venv-anchors/bin/python if present)",
    )
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per subprocess")
    ap.add_argument("--json", help="also write every row to this JSON file")
    ap.add_argument("--verbose", action="store_true", help="print tracebacks of failures")
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps must be >= 1, --warmup >= 0")
    os.environ.setdefault("WANDB_MODE", "disabled")  # SAELens imports wandb; no logging
    if args.only:
        child(args)
    elif args.in_process:
        in_process(args)
    else:
        parent(args)


if __name__ == "__main__":
    main()
