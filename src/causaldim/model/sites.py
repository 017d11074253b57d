"""The measured site, named as other tools name it.

causaldim's `--layer L` is the residual stream at the output of block L (0-based): what
block L adds, added to what it read. The same stream is

- TransformerLens / SAELens: `blocks.L.hook_resid_post`, which is also
  `blocks.{L+1}.hook_resid_pre` (the input of the next block);
- Hugging Face: `hidden_states[L + 1]` of `output_hidden_states=True` (`hidden_states[0]` is the
  embeddings; in most models the last entry has the final norm applied, unlike the others);
- sparsify (EleutherAI): hookpoint `layers.L`;
- Gemma Scope: the folder `layer_L` of a `-res` release.

`site_of` reads such a name back to the block whose output it is, and says when a name
points elsewhere (the embeddings, the middle of a block, an attention or MLP output).
"""

from __future__ import annotations

import re

from ..errors import UsageError


class NotABlockOutput(UsageError):
    """A name that points at a site other than the residual stream after a block."""


def equivalents(layer: int) -> dict[str, str]:
    """The names other tools give the output of block `layer`."""
    if layer < 0:
        raise ValueError(f"layer must be >= 0, got {layer}")
    return {
        "transformer_lens": f"blocks.{layer}.hook_resid_post",
        "transformer_lens_next": f"blocks.{layer + 1}.hook_resid_pre",
        "saelens": f"blocks.{layer}.hook_resid_post",
        "hugging_face": f"hidden_states[{layer + 1}]",
        "sparsify": f"layers.{layer}",
        "gemma_scope": f"layer_{layer}",
    }


def aliases(layer: int) -> str:
    """The layer as TransformerLens, SAELens, Hugging Face, sparsify and Gemma Scope name it."""
    e = equivalents(layer)
    return (
        f"TransformerLens/SAELens {e['transformer_lens']} = {e['transformer_lens_next']}, "
        f"Hugging Face {e['hugging_face']}, sparsify {e['sparsify']}, Gemma Scope "
        f"{e['gemma_scope']}"
    )


def describe(layer: int) -> str:
    """One line: the output of block `layer`, and its names elsewhere."""
    return f"the output of block {layer}, named elsewhere {aliases(layer)}"


_TL = re.compile(r"blocks\.(\d+)\.(.+)")
_GEMMA_SCOPE = re.compile(r"layer_(\d+)")
_SPARSIFY = re.compile(r"(?:[\w.]*\.)?layers\.(\d+)(\..+)?")  # also HF's "model.layers.N"
_HF = re.compile(r"hidden_states\[(-?\d+)\]")
_EMBEDDINGS = {"hook_embed", "hook_pos_embed", "embed_tokens", "embed", "embedding"}


def _one(name: str) -> int | None:
    """The block whose output one name (no '/') is; None if it says nothing."""
    if name in _EMBEDDINGS:
        raise NotABlockOutput(f"{name} is the embeddings, no block's output")
    if m := _TL.fullmatch(name):
        block, hook = int(m.group(1)), m.group(2).split("__")[0]  # "..._post__trainer_0"
        if hook == "hook_resid_post":
            return block
        if hook == "hook_resid_pre":
            if block == 0:
                raise NotABlockOutput(f"{name} is the embeddings (the input of block 0)")
            return block - 1
        if hook == "hook_resid_mid":
            raise NotABlockOutput(
                f"{name} lies inside block {block} (after its attention, before its MLP), "
                "not the residual stream after a block"
            )
        raise NotABlockOutput(
            f"{name} is a site inside block {block}, not the residual stream after a block"
        )
    if m := _HF.fullmatch(name):
        k = int(m.group(1))
        if k == 0:
            raise NotABlockOutput(f"{name} is the embeddings, no block's output")
        return k - 1 if k > 0 else None  # negative indices need the model's depth
    if m := _SPARSIFY.fullmatch(name):
        if m.group(2):
            raise NotABlockOutput(
                f"{name} is a module inside block {m.group(1)}, not the residual stream "
                "after a block"
            )
        return int(m.group(1))
    if m := _GEMMA_SCOPE.fullmatch(name):
        return int(m.group(1))
    return None


def site_of(name: str) -> int | None:
    """The block whose output `name` is: a TransformerLens/SAELens hook name
    (`blocks.N.hook_resid_post` -> N, `blocks.N.hook_resid_pre` -> N - 1), a Hugging Face
    `hidden_states[K]` (-> K - 1), a sparsify hookpoint `layers.N` or a Gemma Scope folder
    `layer_N` (-> N). A path ('layer_12/width_16k/average_l0_82') is read component by
    component, the deepest that names a site winning. None when the name says nothing;
    NotABlockOutput (a UsageError) when it names another site: the embeddings
    (`blocks.0.hook_resid_pre`, `hook_embed`), `hook_resid_mid`, attention or MLP outputs."""
    for part in reversed([p for p in str(name).strip().split("/") if p]):
        block = _one(part)
        if block is not None:
            return block
    return None
