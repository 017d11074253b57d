"""The memory estimates of causaldim.memory against measured peaks: the eval pass
(forward, backward from the loss, one backward per probe) per batch size, which sizes
model batches, and training one SAE (weights, gradients, Adam moments, the sparse step),
which refuses SAEs too wide for the device.

Each measurement runs in a fresh process. On a GPU the peak is torch's
max_memory_allocated; on the CPU the process's peak resident set (reset through
/proc/self/clear_refs once the model is loaded), both over what was in use before the
pass. The ratio estimate / measured is what to read: above 1 the batch sizes are
safe, far above 1 they leave memory unused.

    .venv/bin/python benchmarks/memory.py [--model smollm2-135m] [--device auto]
        [--batches 1 2 4 8] [--seq-len 128] [--sae-widths 16384 65536]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import torch

from causaldim.devices import peak_bytes, reset_peak, resolve_device, resolve_dtype
from causaldim.harvest.model_pass import grads_at
from causaldim.memory import model_pass_memory, sae_training_bytes
from causaldim.model.corpus import load_corpus, tokenize
from causaldim.model.load import load_model, resolve_model, skeleton


def measure(args) -> dict:
    """One batch size, in this process: the pass's peak over the loaded model's."""
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    source = resolve_model(args.model)
    layer = source.n_layers // 2 if args.layer is None else args.layer
    lm = load_model(source, dtype, device=device)
    ids = tokenize(load_corpus("builtin"), lm.tokenizer, args.seq_len)[: args.batch]
    warm = grads_at(lm, (layer,), ids[:1, :8], 1, 1, torch.Generator().manual_seed(0))
    del warm
    base = reset_peak(device)
    grads_at(lm, (layer,), ids, 1, 1, torch.Generator().manual_seed(0))
    return {"measured": peak_bytes(device) - base}


def measure_sae(args) -> dict:
    """Training one TopK SAE for a few steps, in this process: the peak over before."""
    from causaldim.sae import SAEConfig, build
    from causaldim.sae.train import Normalizer, TrainSettings, train_sae

    device = resolve_device(args.device)
    x = torch.randn(args.sae_batch * 3, args.d, device=device)
    base = reset_peak(device)
    with device:
        sae = build(SAEConfig("topk", args.d, args.sae_width, k=32))
    batches = [x[i * args.sae_batch :][: args.sae_batch] for i in range(3)]
    settings = TrainSettings(compute_dtype=resolve_dtype(args.dtype, device))
    normalizer = Normalizer(torch.zeros(args.d, device=device), 1.0)
    train_sae(sae, lambda: batches, settings, 3, normalizer)
    return {"measured": peak_bytes(device) - base}


def estimate(args, device: torch.device) -> int:
    source = resolve_model(args.model)
    layer = source.n_layers // 2 if args.layer is None else args.layer
    n_params = sum(p.numel() for p in skeleton(source).parameters())
    need = model_pass_memory(
        source.config,
        n_params,
        layer,
        args.seq_len,
        resolve_dtype(args.dtype, device),
        1,
        1,
        device,
    )
    return need.per_sequence


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--layer", type=int, default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--sae-widths", type=int, nargs="+", default=[16384, 65536])
    parser.add_argument("--d", type=int, default=576, help="the SAEs' input width")
    parser.add_argument("--sae-batch", type=int, default=4096)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)  # one child process
    parser.add_argument("--sae-width", type=int, help=argparse.SUPPRESS)  # one child process
    args = parser.parse_args()
    if args.batch is not None:
        print(json.dumps(measure(args)))
        return
    if args.sae_width is not None:
        print(json.dumps(measure_sae(args)))
        return
    device = resolve_device(args.device)
    per_sequence = estimate(args, device)
    print(
        f"{args.model}, {resolve_dtype(args.dtype, device)} on {device}, seq {args.seq_len}, "
        "1 logit and 1 Fisher probe"
    )
    print(f"{'batch':>5} {'estimate MiB':>13} {'measured MiB':>13} {'estimate/measured':>18}")
    for batch in args.batches:
        child = [sys.executable, __file__, *sys.argv[1:], "--batch", str(batch)]
        out = subprocess.run(child, capture_output=True, text=True, check=True).stdout
        measured = json.loads(out.strip().splitlines()[-1])["measured"]
        est = batch * per_sequence
        print(f"{batch:5d} {est / 2**20:13,.0f} {measured / 2**20:13,.0f} {est / measured:18.2f}")
    sae_dtype = resolve_dtype(args.dtype, device)
    print(f"TopK SAE training, d={args.d}, k=32, {args.sae_batch} tokens a step, {sae_dtype}")
    print(f"{'width':>7} {'estimate MiB':>13} {'measured MiB':>13} {'estimate/measured':>18}")
    for width in args.sae_widths:
        child = [sys.executable, __file__, *sys.argv[1:], "--sae-width", str(width)]
        out = subprocess.run(child, capture_output=True, text=True, check=True).stdout
        measured = json.loads(out.strip().splitlines()[-1])["measured"]
        est = sae_training_bytes(args.d, width, args.sae_batch, sae_dtype)
        print(f"{width:7d} {est / 2**20:13,.0f} {measured / 2**20:13,.0f} {est / measured:18.2f}")


if __name__ == "__main__":
    main()
