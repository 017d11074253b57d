"""SAE training step against its floor, measured side by side in one run.

The floor is the one dense product a step cannot avoid: the encoder's
(B x d) @ (d x W), in the faster of the two weight layouts ([d, W] and [W, d]). The
fused step (sparse decoder, sparse encoder backward) is timed through `train_sae`
itself, step by step (between successive pulls of a batch), so that Adam, decoder
renormalisation and bookkeeping are all counted. The machine is shared and noisy, so the
floor and the step are measured in alternating rounds and the median ratio is reported.

    .venv/bin/python benchmarks/sae_step.py [--store runs/default/stores/L15-...]
"""

from __future__ import annotations

import argparse
import itertools
import statistics

import torch
from timing import StepClock, median_time

from causaldim.devices import describe, resolve_device
from causaldim.harvest.store import Store
from causaldim.sae import SAEConfig, build
from causaldim.sae.train import Normalizer, TrainSettings, train_sae


def activations(store: str | None, d: int, n: int) -> torch.Tensor:
    if store is None:
        return torch.randn(n, d, device="cpu")
    rows, have = [], 0
    for batch in Store(store).batches("train", ("h",), 8192):
        rows.append(batch["h"])
        have += len(batch["h"])
        if have >= n:
            break
    x = torch.cat(rows)[:n]
    norm = Normalizer.fit(x)
    return norm(x)


def make_sae(arch, d, width, k, device):
    with torch.device(device):
        return build(SAEConfig(arch, d, width, k=k if arch == "topk" else None))


def step_times(x, arch, width, k, batch, dtype, warmup, steps) -> list[float]:
    """Per-step wall times of `train_sae` itself, after `warmup` steps (JumpReLU and ReLU
    at target L0 k: their first batch calibrates the thresholds)."""
    d = x.shape[1]
    sae = make_sae(arch, d, width, k, x.device)
    chunks = [x[(i * batch) % len(x) :][:batch] for i in range(warmup + steps + 1)]
    clock = StepClock(chunks)  # one chunk more: a step runs from its pull to the next's
    settings = TrainSettings(compute_dtype=dtype, target_l0=k)  # each step syncs (a .item())
    normalizer = Normalizer(torch.zeros(d, device=x.device), 1.0)
    train_sae(sae, lambda: clock, settings, len(chunks), normalizer)
    return clock.step_times(warmup)


def dense_step_time(x, arch, width, k, batch, reps) -> float:
    """The dense definition: f over all [B, W] pre-activations, decode with a matmul,
    dense backward (reconstruction loss only: a lower bound on the dense step)."""
    d = x.shape[1]
    sae = make_sae(arch, d, width, k, x.device)
    sae.reset(torch.Generator().manual_seed(0))
    opt = torch.optim.Adam(sae.parameters(), lr=1e-4, fused=True)
    xb = x[:batch]
    with torch.no_grad():
        sae.b_dec.copy_(xb.mean(0))
        sae.calibrate(sae.pre_acts(xb), k)

    def step():
        x_hat = sae.decode(sae.encode(xb))
        loss = (x_hat - xb).pow(2).sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        sae.remove_parallel_grad()
        opt.step()
        sae.normalize_decoder()

    return median_time(step, reps, warmup=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--store", help="a causaldim store folder (default: Gaussian data)")
    p.add_argument("--d", type=int, default=576, help="width of the data without --store")
    p.add_argument("--archs", nargs="+", default=["topk"], choices=["topk", "jumprelu", "relu"])
    p.add_argument("--width", type=int, default=16384)
    p.add_argument("--k", type=int, default=32, help="TopK's k; the others' target L0")
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3, help="floor/step measurements side by side")
    p.add_argument("--dense", action="store_true", help="also time the dense definition")
    p.add_argument(
        "--profile", action="store_true", help="also print where a step's time goes, by op"
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument(
        "--dtypes",
        nargs="+",
        default=["float32", "bfloat16"],
        help="compute dtypes to time (bfloat16 is slow on CPUs without bf16 instructions)",
    )
    args = p.parse_args()

    torch.manual_seed(0)
    x = activations(args.store, args.d, args.batch * 4).to(args.device)
    d, where = x.shape[1], describe(resolve_device(args.device))
    print(
        f"SAE training step, W={args.width}, k={args.k}, B={args.batch}, d={d}, on {where} "
        f"({torch.get_num_threads()} CPU threads), {'store' if args.store else 'Gaussian'} data"
    )
    for arch, dtype in itertools.product(args.archs, args.dtypes):
        dt = getattr(torch, dtype)
        a, w = x[: args.batch].to(dt), torch.randn(d, args.width, device=x.device).to(dt)
        w_t = w.T.contiguous().T  # the same [d, W] matrix stored [W, d], as W_enc is
        ratios = []
        for r in range(args.rounds):  # floor and step side by side, round after round
            floor = min(  # the faster of the two layouts
                median_time(lambda a=a, w=w: a @ w, args.steps, warmup=1),
                median_time(lambda a=a, w=w_t: a @ w, args.steps, warmup=1),
            )
            times = step_times(
                x, arch, args.width, args.k, args.batch, dtype, args.warmup, args.steps
            )
            ours = statistics.median(times)
            ratios.append(ours / floor)
            print(
                f"{arch:>8} {dtype:>8} round {r + 1}: encoder matmul {floor:.3f} s; sparse "
                f"step {ours:.3f} s ({args.batch / ours:,.0f} tokens/s); step / floor = "
                f"{ours / floor:.2f}"
            )
        print(
            f"{arch:>8} {dtype:>8}: step / floor, median of {args.rounds} rounds = "
            f"{statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f})"
        )
        if args.dense and dtype == "float32":
            dense = dense_step_time(x, arch, args.width, args.k, args.batch, args.steps)
            sparse = step_times(
                x, arch, args.width, args.k, args.batch, dtype, args.warmup, args.steps
            )
            print(
                f"{arch:>8} float32: dense definition {dense:.3f} s / sparse step "
                f"{statistics.median(sparse):.3f} s = {dense / statistics.median(sparse):.2f}x"
            )
        if args.profile:
            profile_steps(x, arch, args.width, args.k, args.batch, dtype, args.steps)


def profile_steps(x, arch, width, k, batch, dtype, steps) -> None:
    """torch.profiler over `steps` training steps: the ops by their own CPU time, which
    shows what stands between the step and the encoder product."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step_times(x, arch, width, k, batch, dtype, 0, steps)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


if __name__ == "__main__":
    main()
