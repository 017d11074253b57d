"""The agreement task: its prompts, its real ablations against a hand-written patching
loop, and the recovery fraction on a planted feature whose answer is known."""

from __future__ import annotations

import pytest
import torch

from causaldim.controls.task import (
    NOUNS,
    agreement_prompts,
    length_groups,
    task_recovery,
    verb_pairs,
)
from causaldim.errors import UsageError
from causaldim.measures.score import Scores
from causaldim.sae import SAEConfig, build

SINGULAR, PLURAL = ({n[j] for n in NOUNS} for j in (0, 1))


@pytest.fixture(scope="module")
def tiny_task(tiny_lm_store):
    return tiny_lm_store(512)


def flat_scores(atp: torch.Tensor) -> Scores:
    """Scores whose AtP is the given vector (one block, one token)."""
    atp = atp.double()[None]
    return Scores(atp, torch.ones_like(atp), torch.tensor([1]), torch.tensor([0]))


def logit_diff_by_hand(lm, layer, prompt, sae, feature, threshold) -> float:
    """One prompt, token by token: subtract f_i d_i where it fires (not position 0, not
    outliers); logit(correct) - logit(wrong) at the last position."""

    def hook(module, args, output):
        hidden = (output[0] if isinstance(output, tuple) else output).clone()
        for t in range(1, hidden.shape[1]):
            h = hidden[0, t]
            if h.norm() <= threshold:
                hidden[0, t] = h - sae.encode(h[None])[0, feature] * sae.W_dec[feature]
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    handle = lm.layers[layer].register_forward_hook(hook)
    try:
        with torch.no_grad():
            last = lm.model(input_ids=torch.tensor([prompt.ids]), use_cache=False).logits[0, -1]
    finally:
        handle.remove()
    return float(last[prompt.correct].double() - last[prompt.wrong].double())


class FakeTokenizer:
    """Characters as tokens, except for the verb forms given."""

    def __init__(self, verbs: dict[str, list[int]]):
        self.verbs = verbs

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.verbs.get(text, [ord(c) for c in text])


def test_prompts_agree_in_number_and_end_on_the_distractor(tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model("llama"))
    # the tiny BPE splits every verb; only " is"/" are" start with different tokens
    assert [label for label, _, _ in verb_pairs(tok)] == ["is/are"]
    is_id, are_id = (tok.encode(w, add_special_tokens=False)[0] for w in (" is", " are"))
    prompts = agreement_prompts(tok, 24, seed=1)
    assert len(prompts) == 24 and len({p.text for p in prompts}) == 24
    assert sum(p.plural for p in prompts) == 12
    for p in prompts:
        words = p.text.split()
        assert words[0] == "The" and words[-2] == "the"
        assert (words[1] in PLURAL) == p.plural and (words[-1] in PLURAL) != p.plural
        assert (p.correct, p.wrong) == ((are_id, is_id) if p.plural else (is_id, are_id))
        assert tok.decode(list(p.ids)) == p.text
    groups = length_groups(prompts)
    assert sorted(torch.cat([g.index for g in groups]).tolist()) == list(range(24))
    for g in groups:
        for row, j in zip(g.ids.tolist(), g.index.tolist(), strict=True):
            assert tuple(row) == prompts[j].ids
        assert g.correct.tolist() == [prompts[j].correct for j in g.index.tolist()]
    assert prompts == agreement_prompts(tok, 24, seed=1)
    assert prompts != agreement_prompts(tok, 24, seed=2)


def test_single_token_verb_pairs_are_preferred_and_none_usable_is_an_error():
    tok = FakeTokenizer({" is": [1], " are": [2], " was": [3, 9], " were": [4, 9]})
    assert verb_pairs(tok) == [("is/are", 1, 2)]  # has/have: both start with " "
    assert {p.verbs for p in agreement_prompts(tok, 40)} == {"is/are"}
    with pytest.raises(UsageError, match="same first token"):
        verb_pairs(FakeTokenizer({}))


def test_real_effects_match_a_hand_written_patching_loop(tiny_task):
    lm, store = tiny_task
    layer, threshold = store.manifest["layer"], store.manifest["outliers"]["threshold"]
    sae = build(SAEConfig("topk", 32, 48, k=4))
    sae.reset(torch.Generator().manual_seed(1))
    sae.requires_grad_(False)
    scores = flat_scores(torch.rand(48, generator=torch.Generator().manual_seed(2)))
    out = task_recovery(lm, store, sae, scores, n_prompts=8, max_features=10)
    prompts = agreement_prompts(lm.tokenizer, 8)
    clean = [logit_diff_by_hand(lm, layer, p, sae, 0, -1.0) for p in prompts]  # no edit
    assert out["clean_metric"] == pytest.approx(sum(clean) / 8, rel=1e-5)
    assert out["n_evaluated"] == 10 and out["n_dropped"] == out["n_candidates"] - 10
    for feature, effect in zip(out["features"], out["effects"], strict=True):
        real = [
            logit_diff_by_hand(lm, layer, p, sae, feature, threshold) - c
            for p, c in zip(prompts, clean, strict=True)
        ]
        assert effect == pytest.approx(sum(real) / 8, rel=1e-4, abs=1e-7)
    assert min(abs(e) for e in out["effects"]) > 0
    # the cap kept the largest first-order effects, and they predict the real ones' signs
    first = out["first_order"]
    assert [abs(v) for v in first] == sorted((abs(v) for v in first), reverse=True)
    assert 0 < out["largest_dropped_first_order"] <= abs(first[-1])
    assert sum((a > 0) == (b > 0) for a, b in zip(first, out["effects"], strict=True)) >= 8


def test_a_planted_feature_is_the_ground_truth_and_its_rank_decides_the_fraction(tiny_task):
    """Feature 0 reads and removes the mean direction of the residual stream, which every
    later layer depends on; features 1-4 write at 1e-6 the scale, so cannot move the
    metric; the rest never fire."""
    lm, store = tiny_task
    width = 40
    h = torch.cat([b["h"] for b in store.batches("eval", ("h",), 4096)]).float()
    u = h.mean(0) / h.mean(0).norm()
    sae = build(SAEConfig("relu", 32, width))
    sae.reset(torch.Generator().manual_seed(0))
    with torch.no_grad():
        sae.W_dec[1:] *= 1e-6
        sae.b_enc[5:] = -1e6
        sae.W_enc_t[0] = sae.W_dec[0] = u
    sae.requires_grad_(False)

    def run(atp: torch.Tensor, **kw) -> dict:
        return task_recovery(lm, store, sae, flat_scores(atp), n_prompts=16, **kw)

    first = torch.linspace(1, 2, width).flip(0)  # feature 0 ranks first by AtP
    out = run(first)
    assert out["top_k"] == 2 and out["n_evaluated"] == out["n_candidates"] > 1
    assert set(out["features"]) <= set(range(5))
    assert [f for f, t in zip(out["features"], out["ground_truth"], strict=True) if t] == [0]
    assert out["n_ground_truth"] == out["n_ground_truth_in_top"] == 1
    assert out["ground_truth_bar"] == pytest.approx(0.1 * abs(out["clean_metric"]))
    assert out["largest_dropped_first_order"] is None
    assert out["recovered_fraction"] == 1.0
    assert out["evaluated_in_top_fraction"] == pytest.approx(2 / out["n_evaluated"])
    assert out["atp_rank"][out["features"].index(0)] == 0

    last = run(first.flip(0))  # feature 0 ranks last
    assert last["n_ground_truth"] == 1 and last["recovered_fraction"] == 0.0
    assert last["effects"] == out["effects"]

    capped = run(first, max_features=1)  # the largest first-order effect survives the cap
    assert capped["features"] == [0] and capped["n_dropped"] == out["n_candidates"] - 1

    none = run(first, fraction=1e6)
    assert none["n_ground_truth"] == 0 and none["recovered_fraction"] is None
