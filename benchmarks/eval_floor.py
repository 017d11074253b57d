"""The eval pass's speed against the floor its FLOPs imply on this machine, per embedded
model, measured side by side in one run.

For each model: the eval pass as runs make it (one Gaussian logit probe, split into its
centred and shift parts, and one Fisher probe) on a batch of the built-in corpus; its
matmul FLOPs a token from the model's weights as the dry run counts them (costs.py: a
full forward, one backward from the loss and one per probe part down to L, and two
[vocab x d] head products; attention's own products left out, a few percent at 128);
this machine's matmul speed timed at the model's own widest product (tokens x d against
d x vocab, the head) in the same run. floor = speed / FLOPs per token; the ratio
measured / floor is what to read (1.0: every cycle in a matmul at full speed). Gemma 3
270M's 262k-token head makes most of its FLOPs, SmolLM2's 49k-token head a third.

    .venv/bin/python benchmarks/eval_floor.py [--models smollm2-135m gemma3-270m] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from causaldim.config import HarvestConfig
from causaldim.costs import parameter_counts
from causaldim.harvest import plan
from causaldim.harvest.model_pass import grads_at
from causaldim.model.corpus import load_corpus, tokenize
from causaldim.model.load import load_model, resolve_model


def eval_pass(lm, layer, ids):
    return grads_at(lm, (layer,), ids, 1, 1, torch.Generator().manual_seed(0))[layer]


def matmul_speed(tokens: int, d: int, vocab: int, reps: int) -> float:
    """FLOP/s of [tokens, d] @ [d, vocab] in float32, the median of reps."""
    a, b = torch.randn(tokens, d), torch.randn(d, vocab)
    a @ b  # warm-up
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return 2 * tokens * d * vocab / statistics.median(times)


def flops_per_token(name: str, seq_len: int) -> float:
    """The eval pass's matmul FLOPs a token at the middle layer (costs.estimate's count)."""
    cfg = HarvestConfig(model=name, seq_len=seq_len, tokens=4 * seq_len, out="/nonexistent/x")
    params = parameter_counts(plan(cfg, dry_run=True))
    above = params["above_layer"]
    backwards = 1 + 3  # the loss, the probe's centred and shift parts, the Fisher probe
    head_products = 2  # p W (below the head for the loss, shift, Fisher) and the centred
    forward = params["through_layer"] + above + params["head"]
    return 2 * (forward + backwards * above + head_products * params["head"])


def measure(name: str, batch: int, seq_len: int, reps: int) -> dict:
    source = resolve_model(name)
    layer = source.n_layers // 2
    lm = load_model(source, "float32")
    seqs = tokenize(load_corpus("builtin"), lm.tokenizer, seq_len)
    ids = seqs[:batch]
    per_token = flops_per_token(name, seq_len)
    eval_pass(lm, layer, seqs[batch : 2 * batch])  # warm-up
    times, speeds = [], []
    for i in range(reps):  # alternate the pass and the speed, so load hits both alike
        part = seqs[(i + 2) * batch : (i + 3) * batch]
        t = time.perf_counter()
        eval_pass(lm, layer, part)
        times.append(time.perf_counter() - t)
        speeds.append(matmul_speed(ids.numel(), source.d_model, source.config.vocab_size, 2))
    measured = ids.numel() / statistics.median(times)
    speed = statistics.median(speeds)
    floor = speed / per_token
    return {
        "model": name,
        "layer": layer,
        "gflop_per_token": per_token / 1e9,
        "matmul_gflops": speed / 1e9,
        "tokens_per_second": measured,
        "floor": floor,
        "ratio": measured / floor,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    print(
        f"eval pass, batch {args.batch_size}x{args.seq_len}, float32, "
        f"{torch.get_num_threads()} threads, median of {args.reps}"
    )
    print(
        f"{'model':<14} {'layer':>5} {'GFLOP/tok':>9} {'matmul GFLOP/s':>14} "
        f"{'tok/s':>7} {'floor tok/s':>11} {'of floor':>8}"
    )
    rows = [measure(m, args.batch_size, args.seq_len, args.reps) for m in args.models]
    for r in rows:
        print(
            f"{r['model']:<14} {r['layer']:>5} {r['gflop_per_token']:>9.2f} "
            f"{r['matmul_gflops']:>14.1f} {r['tokens_per_second']:>7.1f} {r['floor']:>11.1f} "
            f"{r['ratio']:>8.2f}"
        )
    if len(rows) > 1:
        print(
            f"ratio to the floor, {rows[1]['model']} / {rows[0]['model']}: "
            f"{rows[1]['ratio'] / rows[0]['ratio']:.2f}"
        )


if __name__ == "__main__":
    main()
