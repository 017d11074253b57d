"""Throughput of the model pass, measured side by side in one run.

eval split: ours (frozen weights, layers 0..L without a graph, backward from the loss
down to L only) against the naive way (weights trainable, full forward, full backward
with parameter gradients, h's gradient read from a retained hook); and ours with the
default probes (a Gaussian logit probe split into centred and shift parts, two
backwards, and a Fisher probe) against one backward per Gaussian probe, as before the
split.
train split: forward stopped at L against a full forward, both without autograd.

Each repetition times both on the same batch, alternating the order; medians are
reported, and the ratio is what to read (the machine is shared and noisy).

    .venv/bin/python benchmarks/eval_pass.py [--model smollm2-135m] [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from causaldim.harvest.model_pass import grads_at, residuals_at
from causaldim.model.corpus import load_corpus, tokenize
from causaldim.model.load import load_model, resolve_model


def eval_pass(lm, layer, ids):
    """causaldim's eval pass at one layer."""
    return grads_at(lm, (layer,), ids)[layer]


def split_probes(lm, layer, ids):
    """The eval pass as runs make it: one Gaussian logit probe split into its centred part
    and its shift of all logits (two backwards) and one Fisher probe: four backwards."""
    return grads_at(lm, (layer,), ids, 1, 1, torch.Generator().manual_seed(0))[layer]


def whole_probes(lm, layer, ids):
    """The eval pass before the split: the Gaussian probe pulled back whole, one backward
    like the Fisher probe's; timed as two Fisher probes (the same vector-Jacobian product
    from the logits): three backwards."""
    return grads_at(lm, (layer,), ids, 0, 2, torch.Generator().manual_seed(0))[layer]


def train_pass(lm, layer, ids):
    """causaldim's train pass at one layer: the forward stopped there."""
    return residuals_at(lm, (layer,), ids)[layer]


def naive_eval(lm, layer, ids):
    lm.model.requires_grad_(True)
    lm.model.zero_grad(set_to_none=True)
    seen = []
    handle = lm.layers[layer].register_forward_hook(
        lambda m, a, out: seen.append(out[0] if isinstance(out, tuple) else out)
    )
    logits = lm.model(input_ids=ids, use_cache=False).logits
    handle.remove()
    seen[0].retain_grad()
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="sum"
    )
    loss.backward()
    g = seen[0].grad
    lm.model.requires_grad_(False)
    lm.model.zero_grad(set_to_none=True)
    return g


def full_forward(lm, layer, ids):
    with torch.inference_mode():
        return lm.model(input_ids=ids, use_cache=False).logits


def timed(fn, *args) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def compare(name, ours, naive, lm, layer, batches, reps):
    ours(lm, layer, batches[0]), naive(lm, layer, batches[0])  # warm-up
    t_ours, t_naive = [], []
    for i in range(reps):
        ids = batches[i % len(batches)]
        pair = [(ours, t_ours), (naive, t_naive)]
        for fn, sink in pair if i % 2 == 0 else pair[::-1]:
            sink.append(timed(fn, lm, layer, ids))
    n = batches[0].numel()
    ours_tps, naive_tps = n / statistics.median(t_ours), n / statistics.median(t_naive)
    print(
        f"{name}: ours {ours_tps:7.0f} tok/s, baseline {naive_tps:7.0f} tok/s, "
        f"ratio {ours_tps / naive_tps:.2f}x"
    )
    return ours_tps / naive_tps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--layer", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = ap.parse_args()

    source = resolve_model(args.model)
    layer = source.n_layers // 2 if args.layer is None else args.layer
    lm = load_model(source, args.dtype)
    seqs = tokenize(load_corpus("builtin"), lm.tokenizer, args.seq_len)
    batches = [seqs[i * args.batch_size : (i + 1) * args.batch_size] for i in range(args.reps)]
    print(
        f"{args.model} layer {layer}/{source.n_layers}, {args.dtype}, batch "
        f"{args.batch_size}x{args.seq_len}, {torch.get_num_threads()} threads, "
        f"median of {args.reps}"
    )
    compare(
        "eval pass (h, g) vs full fwd+bwd with weight grads",
        eval_pass,
        naive_eval,
        lm,
        layer,
        batches,
        args.reps,
    )
    compare(
        "eval pass with the default probes vs one backward per Gaussian probe",
        split_probes,
        whole_probes,
        lm,
        layer,
        batches,
        args.reps,
    )
    compare(
        "train pass (h)   vs full forward                  ",
        train_pass,
        full_forward,
        lm,
        layer,
        batches,
        args.reps,
    )


if __name__ == "__main__":
    main()
