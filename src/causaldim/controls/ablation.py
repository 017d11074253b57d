"""AtP against real ablation, the check the paper did not make.

AtP is first order. For a stratified sample of features per width, each feature is
really zeroed (h <- h - f_i(h) d_i at every non-outlier position of layer L where it
fires; layers L+1 onward re-run) and the change in each sequence's summed next-token
loss is measured. Its first-order prediction from the store is sum_t f_i(t) (g_t . d_i)
over the sequence. Per feature, both are averaged over sequences as |change| per token,
so that they are on the scale of AtP (a mean over tokens).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..devices import placed
from ..fmt import num, pct
from ..harvest.model_pass import residuals_at
from ..harvest.store import Store
from ..measures.counts import calibrate
from ..measures.score import Scores
from ..measures.splice import sequence_losses, zero_feature
from ..measures.stats import spearman
from ..model.load import LoadedModel
from ..progress import bar
from ..report.doc import Doc
from ..report.figures import finish, pyplot
from ..sae import SAE
from . import Context, Control


@torch.no_grad()
def first_order(sae: SAE, store: Store, n_sequences: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per eval sequence (the first n_sequences) and feature: sum_t f_i(t) (g_t . d_i) over
    its non-outlier tokens, and whether the feature fires there at all. [seqs, width],
    computed on the SAE's device, returned on the CPU."""
    device = sae.b_dec.device
    linear = torch.zeros(n_sequences, sae.cfg.width, dtype=torch.float64, device=device)
    fires = torch.zeros(n_sequences, sae.cfg.width, dtype=torch.int32, device=device)
    for batch in store.batches("eval", ("h", "g", "seq"), 4096):
        keep = batch["seq"] < n_sequences
        if not keep.any():
            continue
        h, g = batch["h"][keep].to(device), batch["g"][keep].to(device)
        seq = batch["seq"][keep].long().to(device)
        f = sae.encode(h)
        linear.index_add_(0, seq, (f * (g @ sae.W_dec.T)).double())
        fires.index_add_(0, seq, (f > 0).int())
    return linear.cpu(), fires.cpu() > 0


def sample_features(atp: torch.Tensor, fired: torch.Tensor, n: int, gen: torch.Generator):
    """Half the sample from the top of the AtP ranking, the rest drawn evenly from the
    quartiles of log AtP among the other firing features."""
    order = atp.argsort(descending=True)
    order = order[fired[order] > 0]
    top, rest = order[: n // 2], order[n // 2 :]
    left = n - len(top)
    picks = [top]
    for j, quartile in enumerate(rest.tensor_split(4) if len(rest) else []):
        take = left // 4 + (j < left % 4)
        picks.append(quartile[torch.randperm(len(quartile), generator=gen, device="cpu")[:take]])
    return torch.cat(picks).sort().values


def atp_vs_ablation(
    lm: LoadedModel,
    store: Store,
    saes: dict[int, SAE],
    scores: dict[int, Scores],
    epsilon: float,
    percentile: float,
    n_features: int = 16,
    n_sequences: int = 16,
    batch_size: int = 4,
    seed: int = 0,
    progress: bool = False,
) -> dict:
    """Per width: real and first-order effects of the sampled features, their Spearman
    correlations with AtP, and which features are truly causal (real effect above the
    same percentile calibration on the first-order sequence effects of the reference
    width) but below epsilon by AtP (missed), or the reverse."""
    layer, threshold = store.manifest["layer"], store.manifest["outliers"]["threshold"]
    ids = store.token_ids("eval", n_sequences)
    n_tokens = ids.shape[0] * (ids.shape[1] - 1)
    # Block L's clean output, once: each ablation then runs only the blocks above it.
    hidden = torch.cat([residuals_at(lm, (layer,), b)[layer] for b in ids.split(batch_size)])
    clean = torch.cat(
        [
            sequence_losses(lm, layer, b, None, threshold, h)
            for b, h in zip(ids.split(batch_size), hidden.split(batch_size), strict=True)
        ]
    )
    gen = torch.Generator().manual_seed(seed)
    rows, epsilon_seq = [], None
    for width, sae in sorted(saes.items()):
        with placed(sae, lm.device):  # one SAE at a time on the model's device
            linear, fires = first_order(sae, store, len(ids))
            linear_effect = linear.abs().sum(0) / n_tokens  # [width]
            if width == min(saes):
                epsilon_seq = calibrate(linear_effect, percentile)
            feats = sample_features(scores[width].atp, scores[width].fired, n_features, gen)
            real = [
                _real_effect(
                    lm,
                    layer,
                    ids,
                    hidden,
                    clean,
                    fires[:, i],
                    zero_feature(sae, i),
                    threshold,
                    batch_size,
                )
                / n_tokens
                for i in bar(
                    feats.tolist(), desc=f"ablation w{width}", enabled=progress, leave=False
                )
            ]
        real_t = torch.tensor(real, dtype=torch.float64, device="cpu")
        atp = scores[width].atp[feats]
        assert epsilon_seq is not None  # calibrated at the smallest width, the first
        truly = real_t > epsilon_seq
        by_atp = atp > epsilon
        rows.append(
            {
                "width": width,
                "features": feats.tolist(),
                "atp": atp.tolist(),
                "first_order": linear_effect[feats].tolist(),
                "real": real,
                "spearman_real_atp": spearman(real_t, atp),
                "spearman_real_first_order": spearman(real_t, linear_effect[feats]),
                "n_truly_causal": int(truly.sum()),
                "n_missed_by_atp": int((truly & ~by_atp).sum()),
                "n_false_alarms": int((~truly & by_atp).sum()),
            }
        )
    missed = sum(r["n_missed_by_atp"] for r in rows)
    truly_total = sum(r["n_truly_causal"] for r in rows)
    return {
        "n_features": sum(len(r["features"]) for r in rows),
        "n_sequences": len(ids),
        "n_tokens": n_tokens,
        "epsilon": epsilon,
        "epsilon_sequence_level": epsilon_seq,
        "rows": rows,
        "missed_fraction": missed / truly_total if truly_total else None,
        "spearman_real_atp_pooled": spearman(
            torch.tensor([v for r in rows for v in r["real"]], device="cpu"),
            torch.tensor([v for r in rows for v in r["atp"]], device="cpu"),
        ),
    }


def _real_effect(lm, layer, ids, hidden, clean, fires, edit, threshold, batch_size) -> float:
    """Sum over the sequences where the feature fires of |loss(ablated) - loss(clean)|."""
    seqs, total = fires.nonzero()[:, 0], 0.0
    for b in seqs.split(batch_size) if len(seqs) else ():
        ablated = sequence_losses(lm, layer, ids[b], edit, threshold, hidden[b])
        total += float((ablated - clean[b]).abs().sum())
    return total


def plot_ablation(c: dict, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    floor = 1e-12  # zero effects drawn on the axis floor of a log plot
    for i, r in enumerate(c["rows"]):
        ax.plot(
            [max(v, floor) for v in r["atp"]],
            [max(v, floor) for v in r["real"]],
            "o",
            color=plt.cm.viridis(i / max(len(c["rows"]) - 1, 1)),
            ms=4,
            label=f"m = {r['width']}",
        )
    ax.axvline(c["epsilon"], color="C3", ls="--", lw=1, label="epsilon (AtP)")
    if c.get("epsilon_sequence_level"):
        ax.axhline(
            c["epsilon_sequence_level"],
            color="C1",
            ls="--",
            lw=1,
            label="epsilon's equivalent (real)",
        )
    return finish(
        fig,
        ax,
        path,
        "AtP (first order, mean |f (g . d)| per token)",
        "real ablation: mean |change in loss| per token",
        f"AtP vs zeroing the feature ({c['architecture']})",
        log_x=True,
        log_y=True,
    )


def ablation_section(doc: Doc, c: dict) -> None:
    doc.table(
        [
            "width",
            "features",
            "Spearman real vs AtP",
            "real vs first order",
            "truly causal",
            "missed by AtP",
            "false alarms",
        ],
        [
            [
                r["width"],
                len(r["features"]),
                num(r["spearman_real_atp"], 2),
                num(r["spearman_real_first_order"], 2),
                r["n_truly_causal"],
                r["n_missed_by_atp"],
                r["n_false_alarms"],
            ]
            for r in c["rows"]
        ],
    )
    rho = c.get("spearman_real_atp_pooled")
    text = [
        f"{c['n_features']} features, stratified by AtP, zeroed on "
        f"{c['n_sequences']} eval sequences ({c['n_tokens']:,} predictions)"
    ]
    if rho is not None:
        text.append(f"pooled Spearman correlation of the real effect with AtP: {rho:.2f}")
    missed = c.get("missed_fraction")
    if missed is None:
        text.append(
            "no sampled feature's real effect clears epsilon's sequence-level equivalent, so "
            "AtP's misses cannot be counted here"
        )
    else:
        text.append(
            f"AtP misses {pct(missed)} of the sampled features whose real effect clears "
            "epsilon's equivalent; this is a fraction of the sample, which over-represents "
            "the top of the AtP ranking, not of all features"
        )
    doc.p("; ".join(text) + ".")


def _compute(ctx: Context) -> dict:
    cfg = ctx.analysis_cfg
    return atp_vs_ablation(
        ctx.load_lm(),
        ctx.store,
        ctx.saes,
        ctx.scores,
        ctx.epsilon,
        ctx.analysis["percentile"],
        cfg.ablation_features,
        cfg.ablation_sequences,
        seed=ctx.seed,
        progress=ctx.progress,
    )


CONTROL = Control(
    "ablation",
    "AtP against real ablation",
    _compute,
    ablation_section,
    plot_ablation,
    reads_weights=True,
)
