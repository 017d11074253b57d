"""How much device memory each stage needs, and the batch sizes that fill the device
without overflowing it. Counts of the tensors each stage holds at its peak, not
measurements; benchmarks/memory.py compares them with measured peaks.

- Model pass (eval split, the costly one): the weights, plus per sequence the activations
  autograd keeps for the blocks above the lowest harvested layer and the vocabulary-wide
  tensors (logits, their float32 copy for the loss, the loss's softmax, and each probe).
- SAE training: float32 weights, gradients and both Adam moments (16 bytes per weight),
  plus one block of pre-activations.
- Scoring and evaluation: the SAE's weights, plus per token a few dense [width] rows.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .devices import memory
from .errors import UsageError

HEADROOM = 0.85  # of free memory planned for: allocator slack, the CUDA context, the rest
CPU_BATCH = 8  # sequences per model batch on a CPU: more buys no speed there
MAX_BATCH = 256
SCORE_ROW_BYTES = 17  # per token and feature: f, g.D, |f g.D| in float32, and the firing mask


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


def sae_training_bytes(d: int, width: int, batch_tokens: int, sae_dtype: str) -> int:
    """Peak bytes of training one SAE: each weight, its gradient and both Adam moments in
    float32, the encoder cast to sae_dtype, the batch and one block of pre-activations."""
    from .sae.sparse import PRE_CHUNK_ELEMENTS

    n_weights = 2 * d * width + 2 * width + d
    state = 4 * 4 * n_weights + element_bytes(sae_dtype) * d * width
    pre = PRE_CHUNK_ELEMENTS * (element_bytes(sae_dtype) + 4)
    return state + 8 * batch_tokens * d * 4 + pre


def check_sae_training(
    d: int, widths: list[int], batch_tokens: int, sae_dtype: str, device, beside: int = 0
):
    """UsageError naming the fix if the widest SAE cannot be trained on device next to
    `beside` bytes held there (the model's weights, kept for splicing)."""
    width = max(widths)
    need = sae_training_bytes(d, width, batch_tokens, sae_dtype)
    free = memory(device)[1]
    if need + beside > HEADROOM * free:
        raise UsageError(
            f"training the {width:,}-wide SAE needs about {_gib(need)} GiB on {device} "
            f"(float32 weights, gradients and Adam moments) beside {_gib(beside)} GiB of "
            f"model weights, and it has {_gib(free)} GiB free; drop that width from "
            "--widths, load trained SAEs with --sae-paths, or use a device with more memory"
        )


def dense_batch_tokens(d: int, width: int, wanted: int, device: torch.device) -> int:
    """Tokens per batch for scoring and evaluation, which hold dense [tokens, width]
    rows: `wanted`, or fewer where the device's free memory is short (at least 1)."""
    weights = 2 * 4 * d * width
    free = HEADROOM * memory(device)[1] - weights
    per_token = SCORE_ROW_BYTES * width + 4 * 4 * d
    return int(max(1, min(wanted, free // per_token)))


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f}"
