"""How much device memory each stage needs, and the batch sizes that fill the device
without overflowing it. Counts of the tensors each stage holds at its peak, not
measurements; benchmarks/memory.py compares them with measured peaks.

- Model pass (eval split, the costly one): the weights, plus per sequence the activations
  autograd keeps for the blocks above the lowest harvested layer and the vocabulary-wide
  tensors (logits, their float32 copy for the loss, the loss's softmax, and each probe).
- SAE training: float32 weights and what the optimiser keeps beside each (Adam: 16 bytes a
  weight in all; lean: about 10, gradients only on the rows a step names), plus the batch
  and one block of pre-activations. The same count on a CPU and a GPU; on a GPU the plan
  takes HEADROOM of the free memory, the rest left to the allocator and the CUDA context.
- Scoring and evaluation: the SAE's weights, plus per token a few dense [width] rows.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .devices import memory
from .errors import UsageError

HEADROOM = 0.85  # of free memory planned for: allocator slack, the CUDA context, the rest
CPU_BATCH = 8  # sequences per model batch on a CPU: more buys no speed there
MAX_BATCH = 256
SCORE_ROW_BYTES = 17  # per token and feature: f, g.D, |f g.D| in float32, and the firing mask
# Entries a lean training step keeps per token, per unit of k (TopK: k, and AuxK's dead
# features; JumpReLU: those that fire and those in the window below the bar)
ENTRIES_PER_K = 2.0


def element_bytes(dtype: str) -> int:
    return 2 if dtype in ("bfloat16", "float16") else 4


class ModelPassMemory(NamedTuple):
    weights: int  # bytes
    per_sequence: int  # bytes for each sequence of a batch
    budget: int  # bytes the device can give the pass (HEADROOM x free)

    def batch_that_fits(self) -> int:
        return max(0, (self.budget - self.weights) // max(self.per_sequence, 1))


def _text_config(config):
    return getattr(config, "text_config", None) or config


def model_pass_memory(
    config,
    n_params: int,
    lowest_layer: int,
    seq_len: int,
    dtype: str,
    logit_probes: int,
    fisher_probes: int,
    device: torch.device,
    tapped: int = 1,
) -> ModelPassMemory:
    c = _text_config(config)
    d, n_layers, vocab = c.hidden_size, c.num_hidden_layers, c.vocab_size
    inter = getattr(c, "intermediate_size", None) or 4 * d
    heads = getattr(c, "num_attention_heads", None) or max(1, d // 64)
    e = element_bytes(dtype)
    # Kept for backward per block and token: the block's input, its two norms' outputs,
    # q, k, v and the attention output (about 8 d), the MLP's gate, up, activation and
    # product (4 x intermediate), and one row of attention probabilities per head.
    per_block = seq_len * (8 * d + 4 * inter + 2 * heads * seq_len) * e
    graph = (n_layers - 1 - lowest_layer) * per_block
    # Vocabulary-wide: logits (dtype), their float32 copy for the loss, its saved softmax
    # and its gradient; a Gaussian probe is drawn in float32 and cast; a Fisher probe
    # needs the softmax and its cumulative sum once, then a float32 row and its cast.
    vocab_row = seq_len * vocab
    logits = vocab_row * (e + 3 * 4)
    logits += logit_probes * vocab_row * (4 + e)
    if fisher_probes:
        logits += vocab_row * 2 * 4 + fisher_probes * vocab_row * (4 + e)
    # per block: h, g, and each probe's products (a Gaussian probe's two parts)
    captured = tapped * seq_len * d * 4 * (2 + 2 * logit_probes + fisher_probes)
    budget = int(HEADROOM * memory(device)[1])
    return ModelPassMemory(n_params * e, graph + logits + captured, budget)


def model_batch_size(need: ModelPassMemory, device: torch.device, n_sequences: int) -> int:
    """Sequences per model batch: on a GPU as many as fit (at most MAX_BATCH), on the CPU
    CPU_BATCH or fewer if memory is short; UsageError if not even one fits."""
    fits = need.batch_that_fits()
    if fits < 1:
        raise UsageError(
            f"the model pass needs about {_gib(need.weights)} GiB of weights and "
            f"{_gib(need.per_sequence)} GiB per sequence on {device}, which has "
            f"{_gib(need.budget / HEADROOM)} GiB free; lower --seq-len or the probes, use "
            "--dtype bfloat16, or a device with more memory"
        )
    cap = CPU_BATCH if device.type == "cpu" else MAX_BATCH
    return max(1, min(fits, cap, n_sequences))


def step_entries(k: int, architectures: list[str]) -> float:
    """Entries a training step keeps per token, at most over the architectures: TopK's k
    and AuxK's picks among dead features; JumpReLU's and ReLU's about ENTRIES_PER_K x k."""
    from .sae.train import TrainSettings

    per = {"topk": k + TrainSettings().aux_k}
    return max(per.get(a, ENTRIES_PER_K * k) for a in architectures)


def sae_training_bytes(
    d: int,
    width: int,
    batch_tokens: int,
    sae_dtype: str,
    optimizer: str = "adam",
    entries_per_token: float = 64.0,
) -> int:
    """Peak bytes of training one SAE: its float32 weights and what the optimiser keeps
    beside each (Adam: a gradient and two float32 moments; lean: a bfloat16 and a float32
    moment, and gradients only on the rows a step names), the encoder cast to sae_dtype,
    the batch, one block of pre-activations and the lean update's block of temporaries."""
    from .sae.optim import BLOCK_ELEMENTS, moment_bytes
    from .sae.sparse import PRE_CHUNK_ELEMENTS

    matrices, vectors = 2 * d * width, 3 * width + d  # vectors: biases and thresholds
    grad, moments = moment_bytes(optimizer)
    state = (4 + grad + moments) * matrices + 16 * vectors
    if optimizer == "lean":
        # the features a step names: at most its entries, and (firing spread evenly, the
        # most distinct a number of entries can name) width (1 - exp(-entries / width))
        rows = width * -math.expm1(-entries_per_token * batch_tokens / width)
        state += int(2 * 4 * rows * d) + 4 * 4 * BLOCK_ELEMENTS  # W_enc_t's and W_dec's rows
    cast = 0 if sae_dtype == "float32" else element_bytes(sae_dtype) * d * width
    pre = PRE_CHUNK_ELEMENTS * (element_bytes(sae_dtype) + 4)
    return state + cast + 8 * batch_tokens * d * 4 + pre


def check_sae_training(
    d: int,
    widths: list[int],
    batch_tokens: int,
    sae_dtype: str,
    device,
    beside: int = 0,
    optimizer: str = "adam",
    entries_per_token: float = 64.0,
):
    """UsageError naming the fix if the widest SAE cannot be trained on device next to
    `beside` bytes held there (the model's weights, kept for splicing)."""
    width = max(widths)
    need = sae_training_bytes(d, width, batch_tokens, sae_dtype, optimizer, entries_per_token)
    free = memory(device)[1]
    if need + beside <= HEADROOM * free:
        return
    budget = HEADROOM * free - beside
    fits = widest_that_fits(
        d, widths, batch_tokens, sae_dtype, optimizer, entries_per_token, budget
    )
    what = (
        "float32 weights, gradients and Adam moments"
        if optimizer == "adam"
        else "float32 weights and second moments, bfloat16 first moments, row gradients"
    )
    lean = sae_training_bytes(d, width, batch_tokens, sae_dtype, "lean", entries_per_token)
    fix = ""
    if optimizer == "adam" and lean <= budget:
        fix = "--optimizer lean (the same Adam update in about 10 bytes a weight, not 16), "
    widest = f"the widest that fits is {fits:,}; " if fits else ""
    raise UsageError(
        f"training the {width:,}-wide SAE needs about {_gib(need)} GiB on {device} ({what}) "
        f"beside {_gib(beside)} GiB of model weights, and it has {_gib(free)} GiB free; "
        f"{widest}use {fix}drop that width from --widths, load trained SAEs with "
        "--sae-paths, or use a device with more memory"
    )


def widest_that_fits(
    d: int,
    widths: list[int],
    batch_tokens: int,
    sae_dtype: str,
    optimizer: str,
    entries_per_token: float,
    budget: float,
) -> int | None:
    """The widest of widths whose training fits in budget bytes, or None."""
    fitting = [
        w
        for w in widths
        if sae_training_bytes(d, w, batch_tokens, sae_dtype, optimizer, entries_per_token) <= budget
    ]
    return max(fitting, default=None)


def dense_batch_tokens(d: int, width: int, wanted: int, device: torch.device) -> int:
    """Tokens per batch for scoring and evaluation, which hold dense [tokens, width]
    rows: `wanted`, or fewer where the device's free memory is short (at least 1)."""
    weights = 2 * 4 * d * width
    free = HEADROOM * memory(device)[1] - weights
    per_token = SCORE_ROW_BYTES * width + 4 * 4 * d
    return int(max(1, min(wanted, free // per_token)))


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f}"
