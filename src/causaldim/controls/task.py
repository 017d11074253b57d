"""Control 'task', task-specific recovery: does generic-text AtP find the features one task needs?

The tool makes its own task, so that it runs offline on any model: subject-verb
agreement across a distractor of the opposite number ("The key to the cabinets" ->
" is", not " are"). Metric: the mean over prompts of logit(correct) - logit(wrong) at
the last position. Ground truth: the features that fire on the prompts and whose real
ablation (as in control 'ablation': h <- h - f_i d_i at the non-outlier positions past 0 of
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
from contextlib import nullcontext
from pathlib import Path
from typing import NamedTuple

import torch

from ..devices import placed
from ..errors import UsageError
from ..fmt import num, pct
from ..harvest.store import Store
from ..measures.score import Scores
from ..measures.splice import zero_feature
from ..measures.stats import wilson_95
from ..model.hooks import editable, edited_block, starting_above, tap_blocks
from ..model.load import LoadedModel
from ..paper import TASK_RECOVERY
from ..progress import bar as progress_bar
from ..report.doc import Doc
from ..report.figures import finish, pyplot
from ..sae import SAE
from . import Context, Control

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
    hidden: torch.Tensor | None = None,
) -> torch.Tensor:
    """_diffs with block `layer`'s output replaced by edit(h) where a real ablation edits;
    given `hidden`, that block's clean output for these prompts, only the blocks above
    it run."""
    above = nullcontext() if hidden is None else starting_above(lm, layer, hidden)
    with above, edited_block(lm, layer, edit, threshold):
        return _diffs(lm, group).cpu()


def _clean_pass(lm: LoadedModel, layer: int, group: Group):
    """Per prompt the clean logit difference; block `layer`'s output h (in the model's
    dtype) and its gradient."""
    with torch.enable_grad(), tap_blocks({layer: lm.layers[layer]}, "leaf") as captured:
        diffs = _diffs(lm, group)
        (grad,) = torch.autograd.grad(diffs.sum(), captured[layer])
    return diffs.detach().cpu(), captured[layer].detach(), grad.float()


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
    progress: bool = False,
) -> dict:
    """Really ablate the features that fire on the agreement prompts (at most max_features,
    those with the largest first-order effect on the metric), call those that move the
    metric by more than fraction * |clean metric| ground truth, and count how many of them
    rank in the top `top` of the width by generic-text AtP."""
    with placed(sae, lm.device):
        return _task_recovery(
            lm, store, sae, scores, n_prompts, fraction, top, max_features, seed, progress
        )


def _task_recovery(
    lm, store, sae, scores, n_prompts, fraction, top, max_features, seed, progress
) -> dict:
    layer, threshold = store.manifest["layer"], store.manifest["outliers"]["threshold"]
    prompts = agreement_prompts(lm.tokenizer, n_prompts, seed)
    groups = length_groups(prompts)
    n, width = len(prompts), sae.cfg.width
    # On the CPU; the model's device only holds one group's tensors at a time.
    clean = torch.zeros(n, dtype=torch.float64, device="cpu")
    fires = torch.zeros(n, width, dtype=torch.bool, device="cpu")
    linear = torch.zeros(width, dtype=torch.float64, device="cpu")  # sum of f (g.d)
    hidden = []  # per group, block L's clean output: the ablations run only the blocks above
    for group in groups:
        diffs, h_model, g = _clean_pass(lm, layer, group)
        hidden.append(h_model)
        h = h_model.float()
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
    for i in progress_bar(evaluated.tolist(), desc="task ablations", enabled=progress, leave=False):
        edit, total = zero_feature(sae, i), 0.0
        for group, h in zip(groups, hidden, strict=True):
            rows = fires[group.index, i]
            if rows.any():
                sub = Group(*(t[rows] for t in group))
                diffs = logit_diffs(lm, layer, sub, edit, threshold, h[rows.to(h.device)])
                total += float((diffs - clean[sub.index]).sum())
        effects.append(total / n)

    rank = torch.empty(width, dtype=torch.long, device="cpu")
    rank[scores.atp.argsort(descending=True, stable=True)] = torch.arange(width, device="cpu")
    top_k = max(1, round(top * width))  # 5% of 256: the 13 highest
    bar = fraction * abs(clean_metric)
    truth = torch.tensor(effects, dtype=torch.float64, device="cpu").abs() > bar
    in_top = rank[evaluated] < top_k
    n_truth = int(truth.sum())
    effects_abs = torch.tensor(effects, dtype=torch.float64, device="cpu").abs()

    def recovered_at(bar: float) -> float | None:
        """The recovery fraction with the ground-truth bar moved to `bar`."""
        hits = effects_abs > bar
        return float((hits & in_top).sum()) / int(hits.sum()) if hits.any() else None

    recovered = float((truth & in_top).sum()) / n_truth if n_truth else None
    chance = float(in_top.double().mean()) if len(evaluated) else None
    interval = wilson_95(int((truth & in_top).sum()), n_truth) if n_truth else None
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
        "ground_truth_bar": bar,
        "n_ground_truth": n_truth,
        "n_ground_truth_in_top": int((truth & in_top).sum()),
        "recovered_fraction": recovered,
        "recovered_95": interval,
        "paper_recovery": TASK_RECOVERY,
        "paper_inside_interval": None
        if interval is None
        else interval[0] <= TASK_RECOVERY <= interval[1],
        "evaluated_in_top_fraction": chance,
        # how much more often ground truth ranks in the top than the candidates do
        "enrichment": recovered / chance if recovered is not None and chance else None,
        # the fraction's sensitivity to the bar
        "recovered_at_half_bar": recovered_at(0.5 * bar),
        "recovered_at_double_bar": recovered_at(2.0 * bar),
        "features": evaluated.tolist(),
        "effects": effects,
        "first_order": first_order[evaluated].tolist(),
        "atp": scores.atp[evaluated].tolist(),
        "atp_rank": rank[evaluated].tolist(),
        "ground_truth": truth.tolist(),
    }


def plot_task(c: dict, path: Path) -> Path:
    """Each evaluated feature: its generic-text AtP rank against how far its real ablation
    moves the task metric; ground truth is what lies above the bar, recovery what lies
    left of the top-5% line as well."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    floor = 1e-9  # zero effects drawn on the axis floor of a log plot
    for truth, colour, label in ((False, "grey", "other candidates"), (True, "C3", "ground truth")):
        pts = [
            (rank + 1, max(abs(e), floor))
            for rank, e, t in zip(c["atp_rank"], c["effects"], c["ground_truth"], strict=True)
            if t == truth
        ]
        if pts:
            ax.plot(*zip(*pts, strict=True), "o", color=colour, ms=4, alpha=0.8, label=label)
    ax.axvline(c["top_k"] + 0.5, color="C0", ls="--", lw=1, label=f"top {100 * c['top']:g}% of AtP")
    ax.axhline(
        c["ground_truth_bar"],
        color="C1",
        ls="--",
        lw=1,
        label=f"{100 * c['fraction']:g}% of the clean metric",
    )
    where = ", ".join(
        str(x)
        for x in (c.get("architecture"), c.get("width") and f"m = {c['width']}")
        if x is not None
    )
    return finish(
        fig,
        ax,
        path,
        "generic-text AtP rank (1 = highest)",
        "|change in mean logit difference| on ablation",
        f"Agreement task: real ablation vs AtP rank{f' ({where})' if where else ''}",
        log_x=True,
        log_y=True,
    )


def _undefined_pct(x: float | None) -> str:
    return "undefined (no ground truth)" if x is None else pct(x)


def task_section(doc: Doc, c: dict) -> None:
    top = f"top {100 * c['top']:g}%"
    frac = c["recovered_fraction"]
    if frac is None:
        recovered = "n/a"
    else:
        lo, hi = c["recovered_95"]
        recovered = f"{pct(frac)} [{pct(lo)}, {pct(hi)}]"
    doc.table(
        [
            "prompts (verbs)",
            "clean logit diff",
            "clean accuracy",
            "firing / ablated",
            "ground truth",
            f"in {top} of AtP",
            "recovered [95%]",
            f"ablated features in {top}",
        ],
        [
            [
                f"{c['n_prompts']} ({', '.join(c['verb_pairs'])})",
                num(c["clean_metric"], 3),
                pct(c["clean_accuracy"]),
                f"{c['n_candidates']} / {c['n_evaluated']}",
                c["n_ground_truth"],
                c["n_ground_truth_in_top"],
                recovered,
                pct(c["evaluated_in_top_fraction"]),
            ]
        ],
    )
    text = [
        f"Subject-verb agreement across a distractor of the other number, {c['n_prompts']} "
        f"generated prompts; metric: mean logit(correct) - logit(wrong) at the verb, "
        f"{c['clean_metric']:.3g} clean, correct verb preferred on "
        f"{pct(c['clean_accuracy'])} of prompts"
    ]
    if c["clean_metric"] <= 0 or c["clean_accuracy"] < 0.6:
        text.append(
            "the model barely does this task, so the features that move the metric are not "
            "a circuit for agreement and the recovery figure says little about one"
        )
    bar = f"{100 * c['fraction']:g}% of the clean metric ({c['ground_truth_bar']:.3g})"
    if frac is None:
        text.append(
            f"no ablated feature moves the metric by more than {bar}, so there is no ground "
            "truth and the recovery fraction is undefined: this is not evidence either way"
        )
    else:
        text.append(
            f"{c['n_ground_truth']} feature(s) move it by more than {bar}; "
            f"{c['n_ground_truth_in_top']} of them ({pct(frac)}, 95% interval "
            f"{pct(lo)}-{pct(hi)}) rank in the {top} of the width by generic-text AtP "
            f"(the {c['top_k']} highest); the paper's {pct(c['paper_recovery'])} is "
            + ("inside" if c["paper_inside_interval"] else "outside")
            + " that interval"
        )
        chance = c["evaluated_in_top_fraction"]
        text.append(
            f"of all ablated candidates, {pct(chance)} rank there, which is what a ranking "
            "blind to the task would recover; "
            + (
                f"ground truth is enriched there x{c['enrichment']:.1f}"
                if c["enrichment"] is not None and c["enrichment"] > 1
                else "ground truth is there as often as the candidates are"
                if frac == chance
                else "ground truth is there less often than the candidates are"
            )
        )
        half, double = c["recovered_at_half_bar"], c["recovered_at_double_bar"]
        text.append(
            f"with the bar at half or twice {100 * c['fraction']:g}%, the fraction is "
            f"{_undefined_pct(half)} or {_undefined_pct(double)}"
        )
    if c["n_dropped"]:
        dropped = c["largest_dropped_first_order"]
        text.append(
            f"{c['n_dropped']} of the {c['n_candidates']} firing features were not ablated "
            f"(cap {c['max_features']}, smallest first-order effects dropped); the largest "
            f"first-order effect among them is {dropped:.3g}, "
            + (
                "well under the bar, so, as far as first order predicts the real effect, "
                "they are unlikely to hold ground truth"
                if dropped < 0.5 * c["ground_truth_bar"]
                else "not far under the bar or above it, so ground truth may have been "
                "dropped and the fraction covers the ablated features only"
            )
        )
    doc.p(
        "; ".join(text) + ". Ground truth here is one generated task at one width, judged by "
        "single-feature ablations (features that matter only together are missed); it "
        "checks that AtP's top finds what this task uses, not how many features matter on "
        "generic text."
    )


def _compute(ctx: Context) -> dict:
    width = ctx.analysis_cfg.reference_width or min(ctx.sweep_cfg.widths)
    return {
        "width": width,
        **task_recovery(
            ctx.load_lm(),
            ctx.store,
            ctx.saes[width],
            ctx.scores[width],
            ctx.analysis_cfg.task_prompts,
            seed=ctx.seed,
            progress=ctx.progress,
        ),
    }


CONTROL = Control(
    "task", "Task-specific recovery", _compute, task_section, plot_task, reads_weights=True
)
