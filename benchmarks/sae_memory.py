"""Training one wide SAE: causaldim.memory's estimate against the measured peak, and the
time a step takes, for each optimiser (adam: torch's float32 Adam; lean: optim.LeanAdam
on sparse row gradients), at the paper's d = 2,304 (Gemma-2-2B) by default.

Each (width, optimiser) trains in a fresh process for a few steps on Gaussian inputs
(their firing spreads evenly over the features, the most distinct rows a step can name:
the case the estimate assumes). The peak is torch's max_memory_allocated on a GPU, the
process's peak resident set on the CPU (reset through /proc/self/clear_refs), over what
was in use before the SAE was made; on a GPU the allocator's reserve beyond it is printed
too. Read the ratio estimate / measured: the plan refuses widths by the estimate.

    .venv/bin/python benchmarks/sae_memory.py [--d 2304] [--widths 32768 65536 131072]
        [--optimizers adam lean] [--architecture jumprelu] [--k 64] [--batch-tokens 4096]
        [--steps 4] [--device auto] [--sae-dtype float32] [--fit]

--fit trains, for each optimiser, the widest of the paper preset's widths whose estimate
fits the device's free memory (the share the plan allows: memory.HEADROOM): on a lent GPU,
the one run that says whether the plan's widest SAE really trains there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

from causaldim.devices import memory, peak_bytes, reset_peak, resolve_device, resolve_dtype
from causaldim.memory import HEADROOM, sae_training_bytes, step_entries, widest_that_fits
from causaldim.presets import PRESETS
from causaldim.sae import SAEConfig, build
from causaldim.sae.train import Normalizer, TrainSettings, train_sae


def measure(args) -> dict:
    """One (width, optimiser) in this process: peak over before, seconds a step."""
    device = resolve_device(args.device)
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(args.steps * args.batch_tokens, args.d, device=device, generator=gen)
    batches = list(x.split(args.batch_tokens))
    base = reset_peak(device)
    with device:
        k = args.k if args.architecture == "topk" else None
        sae = build(SAEConfig(args.architecture, args.d, args.width, k=k))
    times: list[float] = []
    entries: list[int] = []

    def timed():
        for b in batches:
            times.append(time.perf_counter())
            yield b

    settings = TrainSettings(
        target_l0=float(args.k),
        compute_dtype=resolve_dtype(args.sae_dtype, device),
        optimizer=args.optimizer,
    )
    original = sae.train_forward

    def counting(x, step):  # the entries each step keeps, for the estimate's ENTRIES_PER_K
        out = original(x, step)
        entries.append(out.idx.numel())
        return out

    sae.train_forward = counting
    train_sae(sae, timed, settings, args.steps, Normalizer(torch.zeros(args.d, device=device), 1.0))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    times.append(time.perf_counter())
    steps = [b - a for a, b in zip(times, times[1:], strict=False)][1:]  # the first warms up
    reserved = torch.cuda.max_memory_reserved(device) if device.type == "cuda" else 0
    return {
        "measured": peak_bytes(device) - base,
        "reserved": reserved,
        "seconds_a_step": statistics.median(steps),
        "entries_per_k": statistics.mean(entries) / (args.batch_tokens * args.k),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--d", type=int, default=2304)
    parser.add_argument("--widths", type=int, nargs="+", default=[32768, 65536, 131072])
    parser.add_argument("--optimizers", nargs="+", default=["adam", "lean"])
    parser.add_argument("--architecture", default="jumprelu")
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--sae-dtype", default="float32")
    parser.add_argument("--fit", action="store_true", help="the widest that fits (see above)")
    parser.add_argument("--width", type=int, help=argparse.SUPPRESS)  # one child process
    parser.add_argument("--optimizer", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.width is not None:
        print(json.dumps(measure(args)))
        return
    device = resolve_device(args.device)
    sae_dtype = resolve_dtype(args.sae_dtype, device)
    print(
        f"{args.architecture} SAE training on {device}: d={args.d}, k={args.k}, "
        f"{args.batch_tokens} tokens a step, encoder product {sae_dtype}, {args.steps} steps"
    )
    print(
        f"{'width':>9} {'optimiser':>9} {'estimate GiB':>12} {'measured GiB':>12} "
        f"{'est/meas':>8} {'s/step':>7} {'entries/k':>9}"
        + ("  reserved GiB" if device.type == "cuda" else "")
    )
    per_token = step_entries(args.k, [args.architecture])
    free = memory(device)[1]
    runs = [(w, o) for w in args.widths for o in args.optimizers]
    if args.fit:
        paper = PRESETS["paper"]["widths"]
        runs = []
        for o in args.optimizers:
            widest = widest_that_fits(
                args.d, paper, args.batch_tokens, sae_dtype, o, per_token, HEADROOM * free
            )
            print(f"{o}: the widest of {paper} that fits {free / 2**30:,.1f} GiB free: {widest}")
            runs += [(widest, o)] if widest else []
    for width, optimizer in runs:
        child = [*(sys.executable, __file__, *sys.argv[1:]), "--width", str(width)]
        child += ["--optimizer", optimizer]
        out = subprocess.run(child, capture_output=True, text=True, check=True).stdout
        got = json.loads(out.strip().splitlines()[-1])
        est = sae_training_bytes(args.d, width, args.batch_tokens, sae_dtype, optimizer, per_token)
        meas = got["measured"]
        line = (
            f"{width:9,d} {optimizer:>9} {est / 2**30:12.2f} {meas / 2**30:12.2f} "
            f"{est / meas:8.2f} {got['seconds_a_step']:7.2f} {got['entries_per_k']:9.2f}"
        )
        if device.type == "cuda":
            line += f"  {got['reserved'] / 2**30:12.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
