"""The only forward hooks causaldim puts on a model's blocks: tapping their outputs (the
model pass), and editing block L's output where an ablation or a splice may edit it."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from contextlib import contextmanager

import torch
from torch import nn

from .load import LoadedModel


class StopForward(Exception):
    """Raised by the hook on the highest tapped block to end a forward that needs nothing
    above it."""


@contextmanager
def tap_blocks(blocks: dict[int, nn.Module], mode: str):
    """Hooks on the outputs of the given blocks, captured into {layer: tensor}.
    mode "stop": capture them and end the forward at the highest one (StopForward).
    mode "leaf": at the lowest, swap in a detached copy that requires grad, so that
    backward stops there (with frozen weights nothing below records a graph at all);
    the higher ones are captured inside the graph, so that one backward reaches all."""
    captured: dict[int, torch.Tensor] = {}
    lowest, highest = min(blocks), max(blocks)

    def hook_for(layer: int):
        def hook(module, args, output):
            hidden = output[0] if isinstance(output, tuple) else output
            if mode == "stop":
                captured[layer] = hidden.detach()
                if layer == highest:
                    raise StopForward
                return None
            if layer != lowest:
                captured[layer] = hidden
                return None
            leaf = hidden.detach().requires_grad_(True)
            captured[layer] = leaf
            return (leaf, *output[1:]) if isinstance(output, tuple) else leaf

        return hook

    handles = [block.register_forward_hook(hook_for(i)) for i, block in blocks.items()]
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


def editable(hidden: torch.Tensor, threshold: float) -> torch.Tensor:
    """[B, T] where an edit applies: every position past 0 with norm within threshold
    (the store's outliers are left alone, as SAEs and AtP leave them out)."""
    mask = hidden.norm(dim=-1) <= threshold
    mask[:, 0] = False
    return mask


@contextmanager
def edited_block(
    lm: LoadedModel,
    layer: int,
    edit: Callable[[torch.Tensor], torch.Tensor] | None,
    threshold: float,
    masks: list[torch.Tensor] | None = None,
):
    """While inside, block `layer`'s output h is replaced by edit(h) where editable (edit
    None: left as it is); each forward's editable mask is appended to `masks` if given."""

    def hook(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        mask = editable(hidden, threshold)
        if masks is not None:
            masks.append(mask)
        if edit is None:
            return None
        hidden = hidden.clone()
        hidden[mask] = edit(hidden[mask].float()).to(hidden.dtype)
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    handle = lm.layers[layer].register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def starting_above(lm: LoadedModel, layer: int, hidden: torch.Tensor):
    """While inside, a forward does not compute blocks 0..layer: the lower ones pass their
    input through and block `layer` outputs `hidden` (its output for the ids the forward
    is given, from an earlier forward), so only the blocks above it and the head run. Its
    forward hooks (edited_block's edit) still apply to that output."""
    blocks = lm.layers[: layer + 1]

    def skipped(i: int, returns_tuple: bool):
        def forward(hidden_states, *args, **kwargs):
            out = hidden if i == layer else hidden_states
            return (out,) if returns_tuple else out

        return forward

    returns_tuple = _returns_tuple(lm, layer)
    for i, block in enumerate(blocks):
        block.forward = skipped(i, returns_tuple)
    try:
        yield
    finally:
        for block in blocks:
            del block.forward


_RETURNS_TUPLE: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()


def _returns_tuple(lm: LoadedModel, layer: int) -> bool:
    """Whether the model's blocks return (hidden, ...) rather than hidden (it varies by
    architecture and transformers version): one token through the blocks up to `layer`,
    once per model."""
    if lm.model in _RETURNS_TUPLE:
        return _RETURNS_TUPLE[lm.model]
    seen: list[bool] = []

    def hook(module, args, output):
        seen.append(isinstance(output, tuple))
        raise StopForward

    handle = lm.layers[layer].register_forward_hook(hook)
    try:
        with torch.no_grad():
            lm.model(
                input_ids=torch.zeros(1, 1, dtype=torch.long, device=lm.device), use_cache=False
            )
    except StopForward:
        pass
    finally:
        handle.remove()
    _RETURNS_TUPLE[lm.model] = seen[0]
    return seen[0]
