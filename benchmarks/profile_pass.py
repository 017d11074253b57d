"""The cost of the profile: the eval pass tapping every block (its backward from the loss
and each probe run on down to block 0, every layer's rows added to the profile's block
sums) against the eval pass at one layer (backward down to L only, its rows added to
that layer's sums), over the same batches, measured side by side in one run.

Each repetition times both on the same batch, alternating the order; medians are
reported, and the ratio is what to read (the machine is shared and noisy). The target
(issue 17): at most 2x.

    .venv/bin/python benchmarks/profile_pass.py [--model smollm2-135m] [--reps 6]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from causaldim.harvest.model_pass import grads_at
from causaldim.measures.profile import Accumulator, profile_readings
from causaldim.model.corpus import load_corpus, tokenize
from causaldim.model.load import load_model, resolve_model


def pass_into(lm, layers, ids, acc: Accumulator, probes: int, start: int) -> None:
    """One batch of the eval pass at `layers`, each layer's rows into acc (as
    harvest/write.py hands them to an observer; no outliers, for the timing)."""
    gen = torch.Generator().manual_seed(start)
    grads = grads_at(lm, layers, ids, probes, probes, gen)
    b, t = ids.shape
    pos = torch.arange(t, dtype=torch.int32).repeat(b)
    seq = torch.arange(start, start + b, dtype=torch.int32).repeat_interleave(t)
    for i, out in grads.items():
        rows = {"h": out.h.flatten(0, 1), "g": out.g.flatten(0, 1), "pos": pos, "seq": seq}
        if probes:
            rows["u_logits"] = out.u_logits.flatten(0, 1)
            rows["u_fisher"] = out.u_fisher.flatten(0, 1)
        rows["outlier"] = torch.zeros(len(pos), dtype=torch.bool)
        acc.add(i, rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--layer", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--probes", type=int, default=1, help="logit and fisher probes each")
    ap.add_argument("--reps", type=int, default=6)
    args = ap.parse_args()

    source = resolve_model(args.model)
    layer = source.n_layers // 2 if args.layer is None else args.layer
    lm = load_model(source, "float32")
    seqs = tokenize(load_corpus("builtin"), lm.tokenizer, args.seq_len)
    batches = [seqs[i * args.batch_size : (i + 1) * args.batch_size] for i in range(args.reps)]
    n_seq = args.reps * args.batch_size
    readings = profile_readings(args.probes, args.probes)
    every = tuple(range(source.n_layers))

    def accumulator(layers) -> Accumulator:
        return Accumulator(layers, source.d_model, n_seq, args.seq_len, 16, readings)

    one, profile = accumulator((layer,)), accumulator(every)
    pass_into(lm, (layer,), batches[0], accumulator((layer,)), args.probes, 0)  # warm-up
    times = {"one": [], "profile": []}
    for i, ids in enumerate(batches):
        pair = [("one", (layer,), one), ("profile", every, profile)]
        for name, layers, acc in pair if i % 2 == 0 else pair[::-1]:
            t = time.perf_counter()
            pass_into(lm, layers, ids, acc, args.probes, i * args.batch_size)
            times[name].append(time.perf_counter() - t)
    n = batches[0].numel()
    tps = {k: n / statistics.median(v) for k, v in times.items()}
    print(
        f"{args.model}, layer {layer} of {source.n_layers}, batch {args.batch_size}x"
        f"{args.seq_len}, {args.probes} logit + {args.probes} fisher probe(s), "
        f"{torch.get_num_threads()} threads, median of {args.reps}"
    )
    print(
        f"eval pass at layer {layer}: {tps['one']:6.0f} tok/s; profile of all "
        f"{source.n_layers} layers: {tps['profile']:6.0f} tok/s; cost ratio "
        f"{tps['one'] / tps['profile']:.2f}x (target <= 2x)"
    )


if __name__ == "__main__":
    main()
