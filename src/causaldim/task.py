"""Task-specific recovery: does generic-text AtP find the features one task needs?

The tool makes its own task, so that it runs offline on any model: subject-verb
agreement across a distractor of the opposite number ("The key to the cabinets" ->
" is", not " are"). Metric: the mean over prompts of logit(correct) - logit(wrong) at
the last position. Ground truth: the features that fire on the prompts and whose real
ablation (as in ablation.py: h <- h - f_i d_i at the non-outlier positions past 0 of
layer L, layers above re-run) moves the metric by more than a set fraction of its clean
value. Reported: the share of them in the top of the generic-text AtP ranking (paper:
98.2% in the top 5%), beside the share of all evaluated candidates there, which is what
a ranking blind to the task would give.
"""

from __future__ import annotations

import inspect
import itertools
import random
from collections.abc import Callable
from typing import NamedTuple

import torch

from .ablation import editable, edited_block, zero_feature
from .devices import placed
from .errors import UsageError
from .harvest import tap_blocks
from .models import LoadedModel
from .sae import SAE
from .score import Scores
from .store import Store

NOUNS = [  # (singular, plural)
    ("key", "keys"),
    ("cabinet", "cabinets"),
    ("author", "authors"),
    ("book", "books"),
    ("dog", "dogs"),
    ("teacher", "teachers"),
    ("student", "students"),
    ("house", "houses"),
    ("car", "cars"),
    ("friend", "friends"),
    ("door", "doors"),
    ("table", "tables"),
    ("picture", "pictures"),
    ("window", "windows"),
    ("report", "reports"),
    ("manager", "managers"),
    ("farmer", "farmers"),
    ("letter", "letters"),
    ("doctor", "doctors"),
    ("tree", "trees"),
    ("box", "boxes"),
    ("child", "children"),
    ("man", "men"),
    ("woman", "women"),
]
PREPOSITIONS = ["to", "near", "behind", "beside", "of", "next to", "for", "with", "from", "above"]
VERBS = [(" is", " are"), (" was", " were"), (" has", " have")]  # (singular, plural)


class Prompt(NamedTuple):
    text: str
    ids: tuple[int, ...]  # no special tokens, like the harvested sequences
    correct: int  # the next-token id the subject's number calls for
    wrong: int  # the other number's
    plural: bool  # the subject's number
    verbs: str  # "is/are"


def verb_pairs(tokenizer) -> list[tuple[str, int, int]]:
    """(label, singular id, plural id) for the verb pairs whose two forms are single tokens;
    where none is (a small BPE splits " is"), the pairs whose forms start with different
    tokens, since the first token then still tells the two numbers apart."""
    found = []
    for sing, plur in VERBS:
        a, b = (tokenizer.encode(w, add_special_tokens=False) for w in (sing, plur))
        if a and b and a[0] != b[0]:
            found.append((len(a) == len(b) == 1, f"{sing.strip()}/{plur.strip()}", a[0], b[0]))
    usable = [p[1:] for p in found if p[0]] or [p[1:] for p in found]
    if not usable:
        raise UsageError(
            "the model's tokenizer gives the same first token to the singular and plural "
            f"forms of every verb pair ({', '.join(f'{s!r}/{p!r}' for s, p in VERBS)}), so "
            "the agreement task cannot tell them apart"
        )
    return usable


def agreement_prompts(tokenizer, n: int, seed: int = 0) -> list[Prompt]:
    """n prompts "The <subject> <preposition> the <distractor>", half with a plural subject,
    the distractor always of the other number, each with a usable verb pair."""
    pairs = verb_pairs(tokenizer)
    combos = [
        (s, d, prep, pair)
        for s, d, prep, pair in itertools.product(
            range(len(NOUNS)), range(len(NOUNS)), PREPOSITIONS, pairs
        )
        if s != d
    ]
    prompts = []
    for j, (s, d, prep, (label, sing, plur)) in enumerate(
        random.Random(seed).sample(combos, min(n, len(combos)))
    ):
        plural = j % 2 == 1
        text = f"The {NOUNS[s][plural]} {prep} the {NOUNS[d][not plural]}"
        ids = tuple(tokenizer.encode(text, add_special_tokens=False))
        correct, wrong = (plur, sing) if plural else (sing, plur)
        prompts.append(Prompt(text, ids, correct, wrong, plural, label))
    return prompts


class Group(NamedTuple):
    """Prompts of one token length, run as one batch: the metric's position is the last
    token of every row, with no padding or attention mask to get wrong."""

    index: torch.Tensor  # [b] positions in the prompt list
    ids: torch.Tensor  # [b, length]
    correct: torch.Tensor  # [b]
    wrong: torch.Tensor  # [b]


def length_groups(prompts: list[Prompt]) -> list[Group]:
    by_length: dict[int, list[int]] = {}
    for j, p in enumerate(prompts):
        by_length.setdefault(len(p.ids), []).append(j)
    return [
        Group(
            torch.tensor(rows, device="cpu"),
            torch.tensor([prompts[j].ids for j in rows], device="cpu"),
            torch.tensor([prompts[j].correct for j in rows], device="cpu"),
            torch.tensor([prompts[j].wrong for j in rows], device="cpu"),
        )
        for _, rows in sorted(by_length.items())
    ]


def _diffs(lm: LoadedModel, group: Group) -> torch.Tensor:
    """[b] logit(correct) - logit(wrong) at the last position, float64; only the last
    position's logits are made where the model allows it (the head of a 49k vocabulary
    is about a fifth of SmolLM2's forward). On the model's device."""
    keep = "logits_to_keep" in inspect.signature(lm.model.forward).parameters
    kw = {"logits_to_keep": 1} if keep else {}
    ids = group.ids.to(lm.device)
    last = lm.model(input_ids=ids, use_cache=False, **kw).logits[:, -1].double()
    correct, wrong = group.correct.to(lm.device)[:, None], group.wrong.to(lm.device)[:, None]
    return last.gather(1, correct)[:, 0] - last.gather(1, wrong)[:, 0]


@torch.no_grad()
def logit_diffs(
    lm: LoadedModel,
    layer: int,
    group: Group,
    edit: Callable[[torch.Tensor], torch.Tensor],
    threshold: float,
) -> torch.Tensor:
    """_diffs with block `layer`'s output replaced by edit(h) where a real ablation edits."""
    with edited_block(lm, layer, edit, threshold):
        return _diffs(lm, group).cpu()


def _clean_pass(lm: LoadedModel, layer: int, group: Group):
    """Per prompt the clean logit difference; block `layer`'s output h and its gradient."""
    with torch.enable_grad(), tap_blocks({layer: lm.layers[layer]}, "leaf") as captured:
        diffs = _diffs(lm, group)
        (grad,) = torch.autograd.grad(diffs.sum(), captured[layer])
    return diffs.detach().cpu(), captured[layer].detach().float(), grad.float()


@torch.no_grad()
def task_recovery(
    lm: LoadedModel,
    store: Store,
    sae: SAE,
    scores: Scores,
    n_prompts: int = 64,
    fraction: float = 0.1,
    top: float = 0.05,
    max_features: int = 96,
    seed: int = 0,
) -> dict:
    """Really ablate the features that fire on the agreement prompts (at most max_features,
    those with the largest first-order effect on the metric), call those that move the
    metric by more than fraction * |clean metric| ground truth, and count how many of them
    rank in the top `top` of the width by generic-text AtP."""
    with placed(sae, lm.device):
        return _task_recovery(lm, store, sae, scores, n_prompts, fraction, top, max_features, seed)


def _task_recovery(lm, store, sae, scores, n_prompts, fraction, top, max_features, seed) -> dict:
    layer, threshold = store.manifest["layer"], store.manifest["outliers"]["threshold"]
    prompts = agreement_prompts(lm.tokenizer, n_prompts, seed)
    groups = length_groups(prompts)
    n, width = len(prompts), sae.cfg.width
    # On the CPU; the model's device only holds one group's tensors at a time.
    clean = torch.zeros(n, dtype=torch.float64, device="cpu")
    fires = torch.zeros(n, width, dtype=torch.bool, device="cpu")
    linear = torch.zeros(width, dtype=torch.float64, device="cpu")  # sum of f (g.d)
    for group in groups:
        diffs, h, g = _clean_pass(lm, layer, group)
        clean[group.index] = diffs
        mask = editable(h, threshold)
        f = torch.zeros(*mask.shape, width, device=h.device)
        f[mask] = sae.encode(h[mask])
        fires[group.index] = (f > 0).any(1).cpu()
        linear += (f * (g @ sae.W_dec.T)).sum((0, 1), dtype=torch.float64).cpu()
    first_order = -linear / n  # removing f d changes the metric by -f (g . d) to first order
    clean_metric = float(clean.mean())

    candidates = fires.any(0).nonzero()[:, 0]
    candidates = candidates[first_order[candidates].abs().argsort(descending=True, stable=True)]
    evaluated, dropped = candidates[:max_features], candidates[max_features:]
    effects = []
    for i in evaluated.tolist():
        edit, total = zero_feature(sae, i), 0.0
        for group in groups:
            rows = fires[group.index, i]
            if rows.any():
                sub = Group(*(t[rows] for t in group))
                total += float(
                    (logit_diffs(lm, layer, sub, edit, threshold) - clean[sub.index]).sum()
                )
        effects.append(total / n)

    rank = torch.empty(width, dtype=torch.long, device="cpu")
    rank[scores.atp.argsort(descending=True, stable=True)] = torch.arange(width, device="cpu")
    top_k = max(1, round(top * width))  # 5% of 256: the 13 highest
    truth = torch.tensor(effects, dtype=torch.float64, device="cpu").abs() > fraction * abs(
        clean_metric
    )
    in_top = rank[evaluated] < top_k
    n_truth = int(truth.sum())
    return {
        "task": "subject-verb agreement",
        "verb_pairs": sorted({p.verbs for p in prompts}),
        "n_prompts": n,
        "clean_metric": clean_metric,
        "clean_accuracy": float((clean > 0).double().mean()),
        "fraction": fraction,
        "top": top,
        "top_k": top_k,
        "max_features": max_features,
        "n_candidates": len(candidates),
        "n_evaluated": len(evaluated),
        "n_dropped": len(dropped),
        # what the cap may have cost: the largest dropped first-order effect vs the bar
        "largest_dropped_first_order": (
            float(first_order[dropped].abs().max()) if len(dropped) else None
        ),
        "ground_truth_bar": fraction * abs(clean_metric),
        "n_ground_truth": n_truth,
        "n_ground_truth_in_top": int((truth & in_top).sum()),
        "recovered_fraction": float((truth & in_top).sum()) / n_truth if n_truth else None,
        "evaluated_in_top_fraction": float(in_top.double().mean()) if len(evaluated) else None,
        "features": evaluated.tolist(),
        "effects": effects,
        "first_order": first_order[evaluated].tolist(),
        "atp": scores.atp[evaluated].tolist(),
        "atp_rank": rank[evaluated].tolist(),
        "ground_truth": truth.tolist(),
    }
