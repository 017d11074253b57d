"""The headline pass against the floor of the model's body, with the eval split's pass
and today's (debcec4) pass beside it, per embedded model, measured side by side in one run.

For each model, on batches of the built-in corpus, at the middle layer, in rounds that
alternate the passes (so machine load hits each alike):
- floor: the body alone, forward to the output head's input and one backward from there
  to the layer (no head, no probe drawing): what any head-free pass of one backward costs;
- headline: the pass --headline-tokens runs (model_pass.headline_at): the forward to the
  head's input, one Gaussian probe drawn in the model's width, its centred part pulled
  back (one backward, as the floor's);
- eval split: the pass every eval token gets (grads_at: the loss gradient, one Gaussian
  probe drawn in the width, one Fisher probe, the head's forward for the loss);
- debcec4: the eval pass as it was, the centred probe drawn over the vocabulary and
  pulled back through the head (the reference below, kept for this comparison).

What to read: headline / floor (target: at least 0.7), and headline / debcec4, the
headline's tokens a second against what each headline token cost before (target for
Gemma 3: at least 3).

    .venv/bin/python benchmarks/eval_floor.py [--models smollm2-135m gemma3-270m] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from causaldim.harvest.model_pass import (
    _head_io,
    fisher_draws,
    gaussian_probes,
    grads_at,
    head_probes,
    headline_at,
)
from causaldim.model.corpus import load_corpus, tokenize
from causaldim.model.hooks import StopForward, tap_blocks
from causaldim.model.load import load_model, resolve_model


def floor_pass(lm, layer, ids):
    """Forward to the head's input, one backward from there to the layer."""
    head = lm.model.get_output_embeddings()
    seen = {}

    def stop(module, args):
        seen["x"] = args[0]
        raise StopForward

    handle = head.register_forward_pre_hook(stop)
    try:
        with torch.enable_grad(), tap_blocks({layer: lm.layers[layer]}, "leaf") as captured:
            try:
                lm.model(input_ids=ids, use_cache=False)
            except StopForward:
                pass
            x = seen["x"]
            torch.autograd.grad(x, captured[layer], torch.ones_like(x))
    finally:
        handle.remove()


def debcec4_pass(lm, layer, ids, gen):
    """The eval pass of debcec4: as the eval split's, but the centred probe drawn over the
    vocabulary and pulled back through the head."""
    with (
        torch.enable_grad(),
        tap_blocks({layer: lm.layers[layer]}, "leaf") as cap,
        _head_io(lm) as head,
    ):
        logits = lm.model(input_ids=ids, use_cache=False).logits
        F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
        hs = [cap[layer]]
        centred, means = gaussian_probes(logits, 1, gen)
        draws = fisher_draws(logits, 1, gen)
        x, w = head["input"], head["module"].weight.detach()
        pw = (logits.detach().float().softmax(-1) @ w.float()).to(x.dtype)
        to_loss = pw - w[ids.roll(-1, dims=1)]
        for v in [to_loss, means[0] * w.sum(0), w[draws[0]] - pw]:
            torch.autograd.grad(x, hs, v, retain_graph=True)
        torch.autograd.grad(logits, hs, centred[0])


def measure(name: str, batch: int, seq_len: int, reps: int) -> dict:
    source = resolve_model(name)
    layer = source.n_layers // 2
    lm = load_model(source, "float32", progress=False)
    seqs = tokenize(load_corpus("builtin"), lm.tokenizer, seq_len)
    probes = head_probes(lm)
    gen = torch.Generator().manual_seed(0)
    passes = {
        "floor": lambda ids: floor_pass(lm, layer, ids),
        "headline": lambda ids: headline_at(lm, (layer,), ids, 1, probes, gen),
        "eval split": lambda ids: grads_at(lm, (layer,), ids, 1, 1, gen, probes),
        "debcec4": lambda ids: debcec4_pass(lm, layer, ids, gen),
    }
    for f in passes.values():  # warm-up
        f(seqs[:batch])
    times = {k: [] for k in passes}
    for i in range(reps):
        ids = seqs[(i + 1) * batch : (i + 2) * batch]
        for k, f in passes.items():
            t = time.perf_counter()
            f(ids)
            times[k].append(time.perf_counter() - t)
    rate = {k: ids.numel() / statistics.median(v) for k, v in times.items()}
    return {"model": name, "layer": layer, **rate}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    print(
        f"tokens a second, batch {args.batch_size}x{args.seq_len}, float32, "
        f"{torch.get_num_threads()} threads, median of {args.reps} alternating rounds"
    )
    print(
        f"{'model':<14} {'layer':>5} {'floor':>7} {'headline':>8} {'eval split':>10} "
        f"{'debcec4':>7} {'headline/floor':>14} {'headline/debcec4':>16} {'eval/debcec4':>12}"
    )
    for m in args.models:
        r = measure(m, args.batch_size, args.seq_len, args.reps)
        print(
            f"{r['model']:<14} {r['layer']:>5} {r['floor']:>7.0f} {r['headline']:>8.0f} "
            f"{r['eval split']:>10.0f} {r['debcec4']:>7.0f} "
            f"{r['headline'] / r['floor']:>14.2f} {r['headline'] / r['debcec4']:>16.2f} "
            f"{r['eval split'] / r['debcec4']:>12.2f}"
        )


if __name__ == "__main__":
    main()
