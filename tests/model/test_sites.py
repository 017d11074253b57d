"""The measured layer as TransformerLens, SAELens, Hugging Face, sparsify and Gemma Scope
name it, and those names read back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from causaldim.errors import UsageError
from causaldim.model.sites import NotABlockOutput, describe, equivalents, site_of


def test_block_12_as_others_name_it():
    assert equivalents(12) == {
        "transformer_lens": "blocks.12.hook_resid_post",
        "transformer_lens_next": "blocks.13.hook_resid_pre",
        "saelens": "blocks.12.hook_resid_post",
        "hugging_face": "hidden_states[13]",
        "sparsify": "layers.12",
        "gemma_scope": "layer_12",
    }
    line = describe(12)
    for name in equivalents(12).values():
        assert name in line
    assert line.startswith("the output of block 12")


@given(st.integers(0, 500))
def test_every_name_of_a_layer_reads_back_to_it(layer):
    for name in equivalents(layer).values():
        assert site_of(name) == layer


@pytest.mark.parametrize(
    ("name", "block"),
    [
        ("blocks.8.hook_resid_pre", 7),
        ("blocks.11.hook_resid_post", 11),
        ("layer_12/width_16k/average_l0_82", 12),  # a Gemma Scope id, component by component
        ("layer_20/width_131k/average_l0_114/params.npz", 20),
        ("layers.5", 5),
        ("model.layers.1", 1),  # a Hugging Face module path
        ("hidden_states[1]", 0),
        ("blocks.12.hook_resid_post__trainer_0", 12),  # SAEBench-style ids
    ],
)
def test_names_read_back_to_the_block_whose_output_they_are(name, block):
    assert site_of(name) == block


@pytest.mark.parametrize(
    "name",
    [
        "blocks.0.hook_resid_pre",  # the embeddings
        "hook_embed",
        "hidden_states[0]",
        "embedding/width_4k/average_l0_6",
        "blocks.4.hook_resid_mid",  # inside block 4
        "blocks.4.hook_attn_out",
        "blocks.4.hook_mlp_out",
        "blocks.4.attn.hook_z",
        "blocks.4.ln2.hook_normalized",
        "layers.4.mlp",
    ],
)
def test_names_of_other_sites_are_refused_with_what_they_are(name):
    with pytest.raises(NotABlockOutput, match="embeddings|inside block|block 4"):
        site_of(name)
    assert issubclass(NotABlockOutput, UsageError)  # one line at the command line


@pytest.mark.parametrize(
    "name", ["", "sae", "width_16k/average_l0_82", "w32.npz", "blocks.x.hook_resid_post"]
)
def test_names_that_say_nothing_give_none(name):
    assert site_of(name) is None


@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz_./0123456789[]", max_size=40))
def test_any_name_gives_a_block_none_or_a_usage_error(name):
    try:
        block = site_of(name)
    except NotABlockOutput:
        return
    assert block is None or (isinstance(block, int) and block >= 0)
