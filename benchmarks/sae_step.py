"""TopK SAE training step against its floor, measured side by side in one run.

The floor is the one dense product a TopK step cannot avoid: the encoder's
(B x d) @ (d x W), in the faster of the two weight layouts ([d, W] and [W, d]). The
fused step (sparse decoder, sparse encoder backward) is timed through `train_sae`
itself, step by step (between successive pulls of a batch), so that Adam, decoder
renormalisation and bookkeeping are all counted. The machine is shared and noisy, so the
floor and the step are measured in alternating rounds and the median ratio is reported.

    .venv/bin/python benchmarks/sae_step.py [--store runs/default/stores/L15-...]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from timing import StepClock, median_time

from causaldim.sae import SAEConfig, build
from causaldim.sae.train import Normalizer, TrainSettings, train_sae
from causaldim.store import Store


def activations(store: str | None, d: int, n: int) -> torch.Tensor:
    if store is None:
        return torch.randn(n, d)
    rows, have = [], 0
    for batch in Store(store).batches("train", ("h",), 8192):
        rows.append(batch["h"])
        have += len(batch["h"])
        if have >= n:
            break
    x = torch.cat(rows)[:n]
    norm = Normalizer.fit(x)
    return norm(x)


def step_times(x, width, k, batch, dtype, warmup, steps) -> list[float]:
    """Per-step wall times of `train_sae` itself, after `warmup` steps."""
    d = x.shape[1]
    sae = build(SAEConfig("topk", d, width, k=k))
    chunks = [x[(i * batch) % len(x) :][:batch] for i in range(warmup + steps + 1)]
    clock = StepClock(chunks)  # one chunk more: a step runs from its pull to the next's
    settings = TrainSettings(compute_dtype=dtype)
    train_sae(sae, lambda: clock, settings, len(chunks), Normalizer(torch.zeros(d), 1.0))
    return clock.step_times(warmup)


def dense_step_time(x, width, k, batch, reps) -> float:
    """The dense definition: scatter into [B, W], decode with a matmul, dense backward."""
    d = x.shape[1]
    sae = build(SAEConfig("topk", d, width, k=k))
    sae.reset(torch.Generator().manual_seed(0))
    opt = torch.optim.Adam(sae.parameters(), lr=1e-4)
    xb = x[:batch]

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
    p.add_argument("--width", type=int, default=16384)
    p.add_argument("--k", type=int, default=32)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3, help="floor/step measurements side by side")
    p.add_argument("--dense", action="store_true", help="also time the dense definition")
    p.add_argument(
        "--dtypes",
        nargs="+",
        default=["float32", "bfloat16"],
        help="compute dtypes to time (bfloat16 is slow on CPUs without bf16 instructions)",
    )
    args = p.parse_args()

    torch.manual_seed(0)
    x = activations(args.store, args.d, args.batch * 4)
    d = x.shape[1]
    print(
        f"TopK step, W={args.width}, k={args.k}, B={args.batch}, d={d}, "
        f"{torch.get_num_threads()} threads, {'store' if args.store else 'Gaussian'} data"
    )
    for dtype in args.dtypes:
        dt = getattr(torch, dtype)
        a, w = x[: args.batch].to(dt), torch.randn(d, args.width).to(dt)
        w_t = w.T.contiguous().T  # the same [d, W] matrix stored [W, d], as W_enc is
        ratios = []
        for r in range(args.rounds):  # floor and step side by side, round after round
            floor = min(  # the faster of the two layouts
                median_time(lambda a=a, w=w: a @ w, args.steps, warmup=1),
                median_time(lambda a=a, w=w_t: a @ w, args.steps, warmup=1),
            )
            times = step_times(x, args.width, args.k, args.batch, dtype, args.warmup, args.steps)
            ours = statistics.median(times)
            ratios.append(ours / floor)
            print(
                f"{dtype:>9} round {r + 1}: encoder matmul {floor:.3f} s; fused step "
                f"{ours:.3f} s ({args.batch / ours:,.0f} tokens/s); step / floor = "
                f"{ours / floor:.2f}"
            )
        print(
            f"{dtype:>9}: step / floor, median of {args.rounds} rounds = "
            f"{statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f})"
        )
    if args.dense:
        dense = dense_step_time(x, args.width, args.k, args.batch, args.steps)
        print(f"  float32 dense definition of the step: {dense:.3f} s")


if __name__ == "__main__":
    main()
