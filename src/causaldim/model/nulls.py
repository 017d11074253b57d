"""Null models by name: what an untrained network of the same shape gives.

  MODEL:permuted  every parameter's entries shuffled within their own tensor (each weight
                  matrix within the matrix, each norm's gains and each bias within their
                  vector): the trained weights' values, none of their arrangement
  MODEL:init      a fresh initialisation from the model's config, as transformers
                  initialises it (no weights read)

A seed may follow: MODEL:permuted@3 (default 0); the store's identity and results.json
record the null and its seed. The tokenizer is the model's own and the corpus unchanged,
so a null reads the same tokens as the trained model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import nn

from ..errors import UsageError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

KINDS = {
    "permuted": "every weight matrix's entries shuffled within the matrix, every norm's "
    "gains and every bias within their vector",
    "init": "freshly initialised from the config, as transformers initialises it",
}


class Null(NamedTuple):
    kind: str  # one of KINDS
    seed: int

    def to_dict(self) -> dict:
        return {"kind": self.kind, "seed": self.seed, "what": KINDS[self.kind]}

    def describe(self) -> str:
        return f"{self.kind} null (seed {self.seed}): {KINDS[self.kind]}"


def split_null(name: str) -> tuple[str, Null | None]:
    """The model's own name and the null it asks for (None: the model as trained)."""
    base, sep, tail = name.rpartition(":")
    kind, _, seed = tail.partition("@")
    if not sep or not base or kind not in KINDS:
        return name, None
    if seed and not seed.isdigit():
        raise UsageError(
            f"model {name!r}: the seed after '@' must be a whole number (e.g. {base}:{kind}@1)"
        )
    return base, Null(kind, int(seed or 0))


def permute_(model: nn.Module, seed: int) -> nn.Module:
    """Shuffle each parameter's entries within itself, in place (a tied embedding and head
    are one parameter, shuffled once, so they stay tied)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters(), key=lambda item: item[0]):
            order = torch.randperm(p.numel(), generator=gen).to(p.device)
            p.copy_(p.reshape(-1)[order].reshape(p.shape))
    return model


def initialised(config, seed: int, dtype: torch.dtype, trust_remote_code: bool) -> PreTrainedModel:
    """A fresh model from the config, its weights drawn by transformers' own init under
    `seed` (the global generator is left as it was)."""
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(
            config, dtype=dtype, trust_remote_code=trust_remote_code
        )
