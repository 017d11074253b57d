"""Model-pass throughput and memory at the batch size causaldim picks, on a random-init
model of a named shape: nothing to download, and the speed does not depend on the
weights' values. Prints tokens/s of the eval pass (h, g and one logit and one Fisher
probe) and of the train pass (h, forward stopped at L), and the measured peak memory
beside the estimate that chose the batch.

    python benchmarks/model_pass.py --shape gemma-2-2b --device cuda --seq-len 512
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from timing import sync

from causaldim.devices import describe, resolve_device, resolve_dtype
from causaldim.harvest.model_pass import grads_at, residuals_at
from causaldim.memory import model_batch_size, model_pass_memory
from causaldim.model.load import KNOWN_SHAPES, LoadedModel

SHAPES = {
    "tiny": (
        "llama",
        dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4),
    ),
    "smollm2-135m": (
        "llama",
        dict(
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            vocab_size=49152,
            tie_word_embeddings=True,
        ),
    ),
    "gemma-2-2b": KNOWN_SHAPES["google/gemma-2-2b"],
}


def random_model(shape: str, dtype: str, device: torch.device) -> LoadedModel:
    from transformers import AutoConfig, AutoModelForCausalLM

    family, sizes = SHAPES[shape]
    config = AutoConfig.for_model(family, **{"max_position_embeddings": 8192, **sizes})
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.eval().requires_grad_(False)
    return LoadedModel(None, model, None, model.model.layers)


def tokens_per_second(fn, ids, reps: int) -> float:
    fn(ids)  # warm-up
    sync()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn(ids)
        sync()
        times.append(time.perf_counter() - t)
    return ids.numel() / statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=SHAPES, default="smollm2-135m")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--layer", type=int, default=None, help="default: the middle block")
    p.add_argument("--batch", type=int, default=None, help="default: what causaldim picks")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()

    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    lm = random_model(args.shape, dtype, device)
    config = lm.model.config
    layer = config.num_hidden_layers // 2 if args.layer is None else args.layer
    n_params = sum(p.numel() for p in lm.model.parameters())
    # The estimate is made before the weights are loaded, as in a run.
    free_before = None
    if device.type == "cuda":
        free_before = torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_allocated(device)
    need = model_pass_memory(config, n_params, layer, args.seq_len, dtype, 1, 1, device)
    if free_before is not None:
        from causaldim.memory import HEADROOM

        need = need._replace(budget=int(HEADROOM * free_before))
    batch = args.batch or model_batch_size(need, device, 100_000)
    print(
        f"{args.shape} (random init, {n_params / 1e9:.2f} B parameters), {dtype}, layer "
        f"{layer}/{config.num_hidden_layers}, batch {batch} x {args.seq_len} on {describe(device)}"
    )
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (batch, args.seq_len), generator=gen)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    eval_tps = tokens_per_second(lambda x: grads_at(lm, (layer,), x, 1, 1, gen), ids, args.reps)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        estimate = need.weights + batch * need.per_sequence
        print(
            f"memory: peak {peak / 2**30:,.1f} GiB, estimate {estimate / 2**30:,.1f} GiB "
            f"(estimate / peak {estimate / peak:.2f}; planned within "
            f"{need.budget / 2**30:,.1f} GiB)"
        )
    train_tps = tokens_per_second(lambda x: residuals_at(lm, (layer,), x), ids, args.reps)
    print(f"eval pass (h, g, 1 logit + 1 Fisher probe): {eval_tps:,.0f} tokens/s")
    print(f"train pass (h, forward stopped at L):       {train_tps:,.0f} tokens/s")


if __name__ == "__main__":
    main()
