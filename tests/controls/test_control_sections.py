"""Every control's report section and figure from hand-made results (the keys its compute
function returns, no model or training): the text holds the numbers the result holds, in
every branch, the rare ones included."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from causaldim.config import AnalysisConfig
from causaldim.controls import NAMES, get, report_controls
from causaldim.controls.architectures import architecture_invariance
from causaldim.controls.depth import depth_summary
from causaldim.controls.l0 import matched_l0
from causaldim.controls.scale import scale_comparison
from causaldim.controls.synthetic import SyntheticSpec
from causaldim.controls.thresholds import PERCENTILES, threshold_robustness
from causaldim.measures.score import Scores
from causaldim.measures.sigma import DIRECT
from causaldim.paper import EPSILON_FALL, RANDOM_ENCODER_INFLATION, SYNTHETIC_RECALL, TASK_RECOVERY
from causaldim.report.doc import Doc

WIDTHS = [1024, 2048, 4096]
PNG = b"\x89PNG\r\n\x1a\n"
CELLS = ["trained/trained", "random/trained", "trained/random", "random/random"]


# ----------------------------------------------------------------------------- hand-made results


def thresholds_result(
    growths=(7.3415, 5.1234, 3.2109, 1.8765), kappas=(432.7, 512.3, 601.9, 700.4), ratio="max/min"
):
    """threshold_robustness(): a row per percentile."""
    epsilons = (1.5e-05, 3.2109e-05, 4.8e-05, 6.1234e-05)
    rows = [
        {
            "percentile": p,
            "epsilon": eps,
            "epsilon_95": [0.9 * eps, 1.1 * eps],
            "n_causal": [41, 117, 301] if g is not None else [0, 12, 40],
            "n_causal_95": [[35.0, 48.0], [101.0, 130.0], [270.0, 333.0]],
            "n_causal_growth": g,
            "n_causal_loglog_slope": None if g is None else 1.4372,
            "kappa_hat": k,
            "kappa_95": [0.7 * k, 1.6 * k],
            "kappa_at_most_d": min(k, 576.0),
            "form": "hyperbolic",
        }
        for p, eps, g, k in zip(PERCENTILES, epsilons, growths, kappas, strict=True)
    ]
    real = [g for g in growths if g is not None]
    return {
        "widths": WIDTHS,
        "rows": rows,
        "n_growths": len(real),
        "n_growing": sum(g > 1 for g in real),
        "kappa_ratio": max(kappas) / min(kappas) if ratio == "max/min" else ratio,
    }


def architectures_result(kappas=(432.7, 389.1, 1298.6), growths=(7.3415, 4.2, 0.95), spread=3.3374):
    """architecture_invariance(): a row per architecture."""
    rows = []
    for arch, eps, k, g in zip(
        ("topk", "jumprelu", "relu"), (3.2109e-05, 2.5e-05, 1.1e-04), kappas, growths, strict=True
    ):
        rows.append(
            {
                "architecture": arch,
                "epsilon": eps,
                "n_causal": [41, 117, 301],
                "n_repr": [1010, 1987, 3816],
                "l0": [32.0, 32.0, 32.0],
                "n_causal_growth": g,
                "n_repr_growth": 3.7782,
                "kappa_hat": k,
                "kappa_95": [0.7 * k, 1.6 * k],
                "kappa_at_most_d": min(k, 576.0),
                "n_causal_grows": (g or 0) > 1,
            }
        )
    return {"widths": WIDTHS, "rows": rows, "kappa_spread": spread}


def l0_result(flag=True):
    """matched_l0(): a row per SAE."""
    rows = [
        ("topk", 1024, 32.0, 0.0),
        ("topk", 4096, 30.1, -0.059375),
        ("jumprelu", 1024, 36.5 if flag else 33.0, 0.140625 if flag else 0.03125),
        ("relu", 4096, 27.9 if flag else 31.0, -0.128 if flag else -0.03125),
    ]
    return {
        "target": 32.0,
        "tolerance": 0.1,
        "rows": [
            {"architecture": a, "width": w, "l0": l0, "relative_error": e, "flagged": abs(e) > 0.1}
            for a, w, l0, e in rows
        ],
        "n_flagged": 2 if flag else 0,
    }


def cell(n_causal, n_repr):
    return {"n_causal": n_causal, "n_repr": n_repr, "l0": 32.0}


def four_cell_result(trained=(41, 117, 301)):
    """four_cell(): N_causal of each encoder/decoder cell per width."""
    random_enc, random_dec, both = (380, 900, 1500), (1000, 100, 3800), (990, 1900, 3700)
    rows = []
    for w, t, re, rd, rr, n in zip(
        WIDTHS, trained, random_enc, random_dec, both, (1010, 1987, 3816), strict=True
    ):
        cells = dict(zip(CELLS, (cell(t, n), cell(re, n), cell(rd, n), cell(rr, n)), strict=True))
        rows.append({"width": w, "cells": cells, "random_encoder_inflation": re / t if t else None})
    inflation = [r["random_encoder_inflation"] for r in rows if r["random_encoder_inflation"]]
    return {
        "epsilon": 3.2109e-05,
        "cells": CELLS,
        "rows": rows,
        "random_encoder_inflation_range": [min(inflation), max(inflation)] if inflation else None,
        "paper_random_encoder_inflation": RANDOM_ENCODER_INFLATION,
        "n_random_decoder_above_trained": sum(
            rd > t for t, rd in zip(trained, random_dec, strict=True)
        ),
    }


def compared(n_causal, n_other, med_causal, med_other, auc, auc_95):
    """geometry._compare() of one measure at one width."""
    if not n_causal:
        return {"n_causal": 0, "n_other": n_other, "auc": None, "auc_95": []}
    return {
        "n_causal": n_causal,
        "n_other": n_other,
        "median_causal": med_causal,
        "median_other": med_other,
        "auc": auc,
        "auc_95": auc_95,
        "causal_values": [med_causal + 0.01 * i for i in range(-2, 3)],
        "other_quantiles": [med_other - 0.2 + 0.02 * i for i in range(21)],
    }


def geometry_result(last_n_causal=0, norm_spread=0.0004, norm_differs=()):
    """geometric_privilege(): per width, decoder norm and nearest-neighbour cosine."""
    rows = [
        {
            "width": 1024,
            "decoder_norm": compared(41, 969, 1.0012, 0.9987, 0.5123, [0.43, 0.59]),
            "nn_cosine": compared(41, 969, 0.4123, 0.3456, 0.7123, [0.65, 0.77]),
            "decoder_norm_spread": norm_spread,
        },
        {
            "width": 2048,
            "decoder_norm": compared(117, 1870, 1.0004, 0.9998, 0.4821, [0.40, 0.56]),
            "nn_cosine": compared(117, 1870, 0.3911, 0.3302, 0.6234, [0.55, 0.68]),
            "decoder_norm_spread": norm_spread / 2,
        },
        {
            "width": 4096,
            "decoder_norm": compared(last_n_causal, 3816, 1.0, 0.999, 0.3012, [0.21, 0.42]),
            "nn_cosine": compared(last_n_causal, 3816, 0.35, 0.31, 0.5512, [0.32, 0.78]),
            "decoder_norm_spread": norm_spread / 4,
        },
    ]
    return {
        "epsilon": 3.2109e-05,
        "rows": rows,
        "widths_differing": {"decoder_norm": list(norm_differs), "nn_cosine": [1024, 2048]},
        "max_decoder_norm_spread": norm_spread,
        "min_n_causal": min(last_n_causal, 41),
    }


def ablation_result(missed=0.25, pooled=0.7543):
    """atp_vs_ablation(): per width, the sampled features' real and first-order effects."""
    rows = [
        {
            "width": 1024,
            "features": [3, 17, 40, 101, 230, 511],
            "atp": [4.1e-04, 2.2e-04, 9.0e-05, 3.0e-05, 8.0e-06, 0.0],
            "first_order": [3.9e-04, 2.0e-04, 1.1e-04, 2.5e-05, 9.0e-06, 1.0e-07],
            "real": [3.1e-04, 2.9e-04, 6.0e-05, 4.0e-05, 1.0e-05, 0.0],
            "spearman_real_atp": 0.8286,
            "spearman_real_first_order": 0.9429,
            "n_truly_causal": 3,
            "n_missed_by_atp": 1,
            "n_false_alarms": 0,
        },
        {
            "width": 4096,
            "features": [8, 77, 900, 1500, 2222, 4000],
            "atp": [9.0e-04, 7.0e-05, 4.0e-05, 2.0e-06, 1.0e-06, 5.0e-07],
            "first_order": [8.0e-04, 6.0e-05, 4.0e-05, 3.0e-06, 1.0e-06, 5.0e-07],
            "real": [5.0e-05, 5.0e-05, 5.0e-05, 5.0e-05, 5.0e-05, 5.0e-05],
            "spearman_real_atp": None,  # a constant real effect: undefined
            "spearman_real_first_order": 0.7714,
            "n_truly_causal": 1,
            "n_missed_by_atp": 0,
            "n_false_alarms": 2,
        },
    ]
    return {
        "n_features": sum(len(r["features"]) for r in rows),
        "n_sequences": 16,
        "n_tokens": 2032,
        "epsilon": 3.2109e-05,
        "epsilon_sequence_level": 2.1e-05,
        "rows": rows,
        "missed_fraction": missed,
        "spearman_real_atp_pooled": pooled,
    }


def synthetic_row(width, n_causal, n_repr, recall, learned, capture, noncausal):
    return {
        "width": width,
        "n_causal": n_causal,
        "n_repr": n_repr,
        "l0": 7.9,
        "fraction_variance_explained": 0.9123,
        "recall": recall,
        "recall_dictionary": learned,
        "subspace_capture": capture,
        "n_selected_noncausal": noncausal,
        "selected_noncausal_fraction": noncausal / n_causal if n_causal else None,
        "best_cosine": [0.95, 0.91, 0.88, 0.97, 0.42, 0.61, 0.93, 0.99],
    }


def synthetic_result(recalls=(0.125, 0.375, 0.25), learned=(0.75, 0.875, 0.875), kappa=9.4321):
    """synthetic_ground_truth(): the toy layer's truth against both estimates."""
    rows = [
        synthetic_row(128, 3, 120, recalls[0], learned[0], 0.3012, 1),
        synthetic_row(256, 7, 250, recalls[1], learned[1], 0.5555, 2),
        synthetic_row(512, 12, 490, recalls[2], learned[2], 0.6789, 5),
    ]
    best = max(rows, key=lambda r: r["recall"])
    return {
        "spec": {
            "d": 64,
            "k": 8,
            "n_features": 256,
            "feature_density": 0.024,
            "causal_density": 0.25,
            "causal_scale": 1.0,
            "train_tokens": 65_536,
            "eval_tokens": 8_192,
            "seq_len": 64,
        },
        "k": 8,
        "d_model": 64,
        "sweep": {
            "architecture": "topk",
            "widths": [128, 256, 512],
            "k": 8,
            "epochs": 3,
            "batch_tokens": 256,
        },
        "cosine_threshold": 0.9,
        "inside_fraction": 0.5,
        "direct": {
            "erank": 8.0123,
            "relative_error": 8.0123 / 8 - 1,
            "within_2_percent": True,
            "erank_95": [7.9, 8.1],
            "participation_ratio": 7.98,
            "activations_erank": 54.3,
            "n_samples": 8192,
            "warning": None,
        },
        "percentile": 98.0,
        "epsilon": 0.0123,
        "kappa_hat": kappa,
        "kappa_95": [7.1, 14.2] if kappa == kappa else [math.nan, math.nan],
        "kappa_width_95": 800.0,
        "kappa_at_most_d": kappa,
        "kappa_over_k": kappa / 8,
        "rows": rows,
        "best_recall": {"width": best["width"], "recall": best["recall"]},
        "max_recall_dictionary": max(learned),
        "max_subspace_capture": 0.6789,
        "expected_n_causal_at_reference": (1 - 98.0 / 100) * 128,
        "paper_recall": SYNTHETIC_RECALL,
        "warnings": ["only 3 widths: a saturating fit needs at least 4 to mean much"],
        "seconds": 12.3,
    }


def task_result(**overrides):
    """task's _compute(): the width, and task_recovery() at it."""
    effects = [0.91, -0.45, 0.30, 0.25, -0.26, 0.05, 0.0, 0.01]
    c = {
        "width": 1024,
        "task": "subject-verb agreement",
        "verb_pairs": ["has/have", "is/are", "was/were"],
        "n_prompts": 64,
        "clean_metric": 2.3456,
        "clean_accuracy": 0.9219,
        "fraction": 0.1,
        "top": 0.05,
        "top_k": 51,
        "max_features": 8,
        "n_candidates": 12,
        "n_evaluated": 8,
        "n_dropped": 4,
        "largest_dropped_first_order": 0.0123,
        "ground_truth_bar": 0.23456,
        "n_ground_truth": 5,
        "n_ground_truth_in_top": 3,
        "recovered_fraction": 0.6,
        "recovered_95": [0.2307, 0.8824],
        "paper_recovery": TASK_RECOVERY,
        "paper_inside_interval": False,
        "evaluated_in_top_fraction": 0.5,
        "enrichment": 1.2,
        "recovered_at_half_bar": 0.6,
        "recovered_at_double_bar": 1.0,
        "features": [3, 9, 14, 27, 40, 88, 301, 777],
        "effects": effects,
        "first_order": [0.8, -0.5, 0.2, 0.3, -0.1, 0.04, 0.001, 0.02],
        "atp": [4e-04, 3e-04, 1e-05, 2e-04, 1e-06, 5e-04, 1e-07, 0.0],
        "atp_rank": [1, 4, 60, 12, 300, 0, 900, 1000],
        "ground_truth": [abs(e) > 0.23456 for e in effects],
    }
    c.update(overrides)
    return c


def depth_row(layer, epsilon, growth, kappa, eranks, converged=True):
    return {
        "layer": layer,
        "epsilon": epsilon,
        "n_causal": [41, 117, 301],
        "n_repr": [1010, 1987, 3816],
        "n_causal_growth": growth,
        "kappa_hat": kappa,
        "kappa_95": [0.7 * kappa, 1.6 * kappa],
        "erank": eranks,
        "erank_95": {r: [v - 5.0, v + 5.0] for r, v in eranks.items()},
        "converged": {r: converged or r != "logits" for r in eranks},
    }


def depth_result(last_epsilon=1.05e-04, loss=True, converged=True):
    """depth_summary(): a row per layer."""

    def eranks(loss_erank, logits, uncentred, fisher):
        e = {"loss": loss_erank, "logits": logits, "logits_uncentred": uncentred, "fisher": fisher}
        return e if loss else {k: v for k, v in e.items() if k != "loss"}

    rows = [
        depth_row(3, 2.1e-03, 3.1, 210.5, eranks(98.7, 150.2, 120.0, 140.0)),
        depth_row(15, 3.2109e-05, 7.3415, 432.7, eranks(123.4, 234.5, 190.1, 210.9)),
        depth_row(27, last_epsilon, None, 88.8, eranks(111.1, 180.0, 60.2, 170.0), converged),
    ]
    return {
        "layers": [3, 15, 27],
        "widths": WIDTHS,
        "rows": rows,
        "epsilon_first_over_last": 2.1e-03 / last_epsilon if last_epsilon > 0 else None,
        "paper_epsilon_fall": EPSILON_FALL,
        "kappa_range": [88.8, 432.7],
        "logits_erank_range": [150.2, 234.5],
    }


def scale_row(width, ks, p, n, n_causal, null_ks=(0.05, 0.04)):
    quantiles = [[-4.0 + 0.1 * i for i in range(41)], [-4.2 + 0.11 * i for i in range(41)]]
    return {
        "widths": [width, width],
        "ks": ks,
        "p_value": p,
        "permutations": 1000,
        "n": n,
        "null_ks": list(null_ks),
        "margin": max(null_ks),
        "n_causal": n_causal,
        "quantiles": quantiles,
    }


def scale_result():
    """scale's _compute(): the two models, and scale_comparison() of them."""
    return {
        "layers": [15, 23],
        "n_layers": [30, 32],
        "d_model": [576, 960],
        "models": ["smollm2-135m", "smollm2-360m"],
        "n_widths_differ": 1,
        "n_widths_beyond_null": 1,
        "epsilon": [3.2109e-05, 1.9e-05],
        "kappa_hat": [432.7, 612.4],
        "rows": [
            scale_row(1024, 0.0812, 0.2346, [1010, 1003], [41, 39]),
            scale_row(4096, 0.1534, 0.000999, [3816, 3790], [301, 377]),
        ],
    }


def nulls_result(permuted=(550.0, 545.0, 555.0)):
    """controls/nulls.py's result: the trained and null kappas in both metrics."""

    def est(v, lo, hi, converged=True):
        return {
            "value": v,
            "interval_95": [lo, hi],
            "over_d": v / 576,
            "converged": converged,
            "n_independent": 5000.0,
            "eval_tokens_needed": None,
            "n_tokens": 28_442,
        }

    def null(kind, raw, act, seed=0):
        return {
            "model": f"smollm2-135m:{kind}@{seed}",
            "null": {"kind": kind, "seed": seed, "what": f"the {kind} null"},
            "raw": est(*raw),
            "act": est(*act),
            "activations_erank": 300.0,
        }

    return {
        "layer": 15,
        "d_model": 576,
        "reading": "logits",
        "trained": {
            "model": "smollm2-135m",
            "raw": est(467.0, 465.0, 469.0),
            "act": est(105.0, 100.0, 110.0),
        },
        "nulls": {
            "permuted": null("permuted", permuted, (450.0, 410.0, 490.0)),
            "init": null("init", (567.0, 565.0, 568.0), (71.5, 39.5, 103.6, False)),
        },
    }


def test_the_nulls_section_sets_each_null_beside_the_trained_model():
    md = section("nulls", nulls_result())
    assert "| model | kappa, raw [95%] | kappa, activation-weighted [95%] |" in md
    assert "| trained: smollm2-135m | 467 [465, 469], 0.81 d | 105 [100, 110], 0.18 d |" in md
    assert (
        "| init: the init null (seed 0) | 567 [565, 568], 0.98 d | "
        "71.5 [40, 104], 0.12 d (not converged) |" in md
    )


RESULTS = {
    "thresholds": thresholds_result,
    "architectures": architectures_result,
    "l0": l0_result,
    "four_cell": four_cell_result,
    "geometry": geometry_result,
    "synthetic": synthetic_result,
    "task": task_result,
    "depth": depth_result,
    "scale": scale_result,
    "ablation": ablation_result,
    "nulls": nulls_result,
}


def stored(name: str, c: dict) -> dict:
    """The result as run_controls stores it in results.json."""
    return {"architecture": "topk", **c} if get(name).per_architecture else c


def section(name: str, c: dict) -> str:
    """The control's section, as Markdown."""
    doc = Doc()
    get(name).section(doc, stored(name, c))
    return doc.markdown(Path("/"))


def test_four_cell_with_l0_free_cells_shows_each_cells_l0():
    c = four_cell_result()
    free = four_cell_result(trained=(20, 40, 80))
    for r in free["rows"]:
        r["cells"]["random/trained"]["l0"] = 250.0
    c["free_l0"] = {
        "architecture": "jumprelu",
        "sweep": {"widths": list(WIDTHS), "epochs": 1},
        **free,
    }
    md = section("four_cell", c)
    assert "With L0 free: jumprelu SAEs (1 epoch(s), widths 1,024, 2,048, 4,096)" in md
    assert "| 1024 | 20 (32.0) | 380 (250.0) |" in md
    c["free_l0"] = {"skipped": "the run's SAEs are imported and include no JumpReLU sweep"}
    assert "With L0 free: not measured: the run's SAEs are imported" in section("four_cell", c)


def paragraph(md: str) -> str:
    """The section's closing paragraph (every section ends with its text)."""
    return md.rstrip("\n").split("\n\n")[-1]


# ----------------------------------------------------------------------------- the registry


def test_every_control_has_a_hand_made_result():
    assert set(RESULTS) == set(NAMES)
    for name in NAMES:
        assert get(name).name == name


def test_hand_made_results_have_the_keys_their_compute_functions_return():
    """Where the summary is a function of plain data (or of Scores), its keys against the
    hand-made ones: the sections below read what real runs write."""
    sweep = {
        arch: {
            "epsilon": 1e-4,
            "per_width": [{"width": w, "n_causal": 5, "n_repr": 9} for w in WIDTHS],
            "wedge": {"n_causal_growth": None, "n_repr_growth": 1.5},
            "kappa": {"free": {"kappa": 9.0, "interval_95": [8, 10]}, "at_most_d": {"kappa": 9}},
        }
        for arch in ("topk", "relu")
    }
    real = architecture_invariance(sweep)
    mine = architectures_result()
    assert set(real) == set(mine) and set(real["rows"][0]) == set(mine["rows"][0])

    real = matched_l0({"topk": {1024: {"l0": 33.0}}}, 32.0)
    mine = l0_result()
    assert set(real) == set(mine) and set(real["rows"][0]) == set(mine["rows"][0])

    sigma = {
        r: {"erank_corrected": 9.0, "erank_corrected_95": [8.0, 10.0], "converged": True}
        for r in DIRECT
    }
    real = depth_summary({3: (sigma, sweep["topk"])})
    mine = depth_result()
    assert set(real) == set(mine) and set(real["rows"][0]) == set(mine["rows"][0])

    gen = torch.Generator().manual_seed(0)

    def scores(w):
        atp = torch.rand(4, w, generator=gen, dtype=torch.float64) ** 4
        return Scores(atp, torch.ones(4, w), torch.full((4,), 100.0), torch.full((4,), 800.0))

    by_width = {w: scores(w) for w in (64, 128, 256)}
    real = threshold_robustness(by_width, {}, 16, AnalysisConfig(bootstrap=0))
    mine = thresholds_result()
    assert set(real) == set(mine) and set(real["rows"][0]) == set(mine["rows"][0])

    analysis = {
        "epsilon": 1e-3,
        "per_width": [{"n_causal": 3} for _ in by_width],
        "kappa": {"free": {"kappa": 9.0}},
    }
    real = scale_comparison((by_width, analysis), (by_width, analysis), ("a", "b"), 5)
    mine = scale_result()
    assert set(real) | {"layers", "n_layers", "d_model"} == set(mine)
    assert set(real["rows"][0]) == set(mine["rows"][0])

    assert set(SyntheticSpec().to_dict()) == set(synthetic_result()["spec"])


# ----------------------------------------------------------------------------- report_controls


def test_report_controls_gives_each_control_its_heading_figure_and_section(tmp_path):
    results = {"controls": {name: stored(name, RESULTS[name]()) for name in NAMES}}
    figures = {"control_thresholds": tmp_path / "figures" / "control_thresholds.png"}
    doc = Doc()
    report_controls(doc, results, figures)
    md = doc.markdown(tmp_path)
    assert md.startswith("## Controls\n")
    headings = [line for line in md.splitlines() if line.startswith("### ")]
    assert headings == [
        "### Threshold robustness (topk)",
        "### Architecture invariance",
        "### Matched L0",
        "### Four-cell encoder/decoder ablation (topk)",
        "### Geometric privilege (topk)",
        "### Synthetic ground truth (topk)",
        "### Task-specific recovery (topk)",
        "### Depth (topk)",
        "### Scale (topk)",
        "### AtP against real ablation (topk)",
        "### Nulls: untrained networks of the same shape",
    ]
    assert (
        "### Threshold robustness (topk)\n\n"
        "![Threshold robustness](figures/control_thresholds.png)\n\n| percentile |"
    ) in md
    assert md.count("![") == 1
    for name in NAMES:  # each section as it renders alone
        body = section(name, RESULTS[name]())
        assert body in md


def test_report_controls_says_what_was_not_run():
    reason = "needs a second model of the family: pass --scale-model"
    results = {
        "controls": {
            "scale": {"architecture": "topk", "skipped": reason},
            "l0": {"skipped": "no SAEs"},
        }
    }
    figures = {"control_scale": Path("/f/control_scale.png")}  # a skipped control shows none
    doc = Doc()
    report_controls(doc, results, figures)
    assert doc.markdown(Path("/")) == (
        f"## Controls\n\n### Scale (topk)\n\nNot run: {reason}.\n\n"
        "### Matched L0\n\nNot run: no SAEs.\n"
    )


def test_report_controls_adds_nothing_without_controls():
    for results in ({}, {"controls": {}}, {"controls": None}):
        doc = Doc()
        report_controls(doc, results, {})
        assert doc.blocks == []


# ----------------------------------------------------------------------------- thresholds


def test_thresholds_where_n_causal_grows_at_every_calibration():
    md = section("thresholds", thresholds_result())
    assert (
        "| percentile | epsilon | N_causal per width | growth | kappa_hat [95%] | kappa_hat <= d |"
    ) in md
    assert "| 95 | 1.5e-05 | 41 / 117 / 301 | x7.34 | 433 [303, 692] | 433 |" in md
    assert "| 98 | 3.21e-05 | 41 / 117 / 301 | x5.12 | 512 [359, 820] | 512 |" in md
    assert "| 99.5 | 6.12e-05 | 41 / 117 / 301 | x1.88 | 700 [490, 1,121] | 576 |" in md
    assert paragraph(md) == (
        "N_causal grows with width at every calibration. kappa_hat moves by a factor 1.62 "
        "between the calibrations: epsilon is a free parameter of the SAE estimate, unlike the "
        "direct eranks."
    )


def test_thresholds_where_n_causal_grows_at_no_calibration():
    md = section("thresholds", thresholds_result(growths=(1.0, 0.8, 0.95, 0.5)))
    assert "| 95 | 1.5e-05 | 41 / 117 / 301 | x1.00 |" in md
    assert paragraph(md).startswith(
        "N_causal does not grow with width at any calibration. kappa_hat moves by a factor 1.62"
    )


def test_thresholds_where_n_causal_grows_at_some_calibrations_and_kappa_ratio_is_none():
    md = section("thresholds", thresholds_result(growths=(2.0, 1.5, 0.9, None), ratio=None))
    assert "| 99.5 | 6.12e-05 | 0 / 12 / 40 | n/a |" in md
    assert paragraph(md) == (
        "N_causal grows at 2 of 3 calibrations only, so the wedge depends on where epsilon is set."
    )


def test_thresholds_without_any_growth_ratio():
    c = thresholds_result(growths=(None,) * 4, kappas=(0.0,) * 4, ratio=None)
    assert (c["n_growths"], c["kappa_ratio"]) == (0, None)
    md = section("thresholds", c)
    assert "| 98 | 3.21e-05 | 0 / 12 / 40 | n/a | 0.0 [0, 0] | 0.0 |" in md
    assert paragraph(md) == "No growth ratios (N_causal is 0 at the smallest width)."
    # No growth ratio, but fits that move: the factor alone.
    md = section("thresholds", thresholds_result(growths=(None,) * 4))
    assert paragraph(md).startswith("kappa_hat moves by a factor 1.62 between the calibrations")


# ----------------------------------------------------------------------------- architectures


def test_architectures_with_a_kappa_spread():
    md = section("architectures", architectures_result())
    assert (
        "| architecture | epsilon | N_causal per width | N_causal growth | N_repr growth | "
        "kappa_hat [95%] |"
    ) in md
    assert "| topk | 3.21e-05 | 41 / 117 / 301 | x7.34 | x3.78 | 433 [303, 692] |" in md
    assert "| relu | 0.00011 | 41 / 117 / 301 | x0.95 | x3.78 | 1,299 [909, 2,078] |" in md
    assert paragraph(md) == (
        "N_causal grows with width for topk, jumprelu of 3 architectures; kappa_hat differs by a "
        "factor 3.34 across them (each calibrated on its own smallest width). A property of the "
        "layer should not depend on the dictionary that reads it; a large factor says the "
        "estimate does."
    )


def test_architectures_without_a_kappa_spread_or_any_growth():
    c = architectures_result(kappas=(432.7, 0.0, 0.0), growths=(None, 1.0, 0.5), spread=None)
    md = section("architectures", c)
    assert "| topk | 3.21e-05 | 41 / 117 / 301 | n/a | x3.78 | 433 [303, 692] |" in md
    assert paragraph(md) == "N_causal grows with width for none of 3 architectures."


# ----------------------------------------------------------------------------- l0


def test_l0_with_flagged_saes():
    md = section("l0", l0_result())
    assert "| architecture | width | L0 (eval) | off target | flag |" in md
    assert "| topk | 1024 | 32.00 | 0.0% |  |" in md
    assert "| topk | 4096 | 30.10 | -5.9% |  |" in md
    assert "| jumprelu | 1024 | 36.50 | 14.1% | outside tolerance |" in md
    assert "| relu | 4096 | 27.90 | -12.8% | outside tolerance |" in md
    assert paragraph(md) == (
        "Target L0 32, tolerance 10%: 2 SAE(s) outside it; their rows of the wedge compare "
        "different sparsities and should be read with that in mind."
    )


def test_l0_with_every_sae_within_tolerance():
    md = section("l0", l0_result(flag=False))
    assert "outside tolerance" not in md
    assert paragraph(md) == (
        "Target L0 32, tolerance 10%: every SAE is within it, so sparsity drift across widths "
        "cannot make the wedge."
    )


# ----------------------------------------------------------------------------- four_cell


def test_four_cell_with_an_inflation_range():
    md = section("four_cell", four_cell_result())
    assert (
        "| width | N_causal trained/trained | N_causal random/trained | N_causal trained/random "
        "| N_causal random/random | random-encoder inflation |"
    ) in md
    assert "| 1024 | 41 | 380 | 1000 | 990 | x9.27 |" in md
    assert "| 2048 | 117 | 900 | 100 | 1900 | x7.69 |" in md
    assert "| 4096 | 301 | 1500 | 3800 | 3700 | x4.98 |" in md
    assert paragraph(md).startswith(
        "At the headline epsilon (3.21e-05), a random orthonormal encoder with the trained "
        "decoder gives x4.98 to x9.27 the trained count (paper: x9.27). A random decoder counts "
        "more causal features than the trained one at 2 of 3 widths."
    )


def test_four_cell_without_an_inflation_range():
    c = four_cell_result(trained=(0, 0, 0))
    assert c["random_encoder_inflation_range"] is None
    md = section("four_cell", c)
    assert "| 1024 | 0 | 380 | 1000 | 990 | n/a |" in md
    assert paragraph(md).startswith(
        "At the headline epsilon (3.21e-05), the trained SAEs count no causal feature at any "
        "width where a random encoder could be compared, so there is no inflation factor. A "
        "random decoder counts more causal features than the trained one at 3 of 3 widths."
    )
    assert "paper: x" not in md


# ----------------------------------------------------------------------------- geometry

AUC_PREFIX = (
    "AUC = P(a causal feature's value exceeds a non-causal one's); 0.5 is no difference. "
    "Firing-matched: each causal feature against the non-causal feature nearest it in firing "
    "count (the claims decide on it: AtP selects features that fire often, which have nearer "
    "neighbours). "
)


def test_geometry_with_one_norm_and_a_width_without_causal_features():
    md = section("geometry", geometry_result())
    assert (
        "| width | causal | non-causal | norm, causal | norm, other | AUC norm [95%] | "
        "NN cos, causal | NN cos, other | AUC NN cos [95%] | AUC NN cos, firing-matched [95%] |"
    ) in md
    assert (
        "| 1024 | 41 | 969 | 1.001 | 0.999 | 0.51 [0.43, 0.59] | 0.412 | 0.346 | "
        "0.71 [0.65, 0.77] | n/a |"  # a result from before the matching
    ) in md
    assert "| 4096 | 0 | 3816 | n/a | n/a | n/a | n/a | n/a | n/a | n/a |" in md
    assert paragraph(md) == AUC_PREFIX + (
        "decoder norm: no width shows a difference whose interval excludes 0.5; "
        "nearest-neighbour cosine: the AUC interval excludes 0.5 at widths 1024, 2048; the "
        "decoder rows all have one norm (training keeps them on a sphere), so the norm "
        "comparison cannot discriminate for these SAEs; some widths have no causal feature: "
        "nothing to compare there."
    )


def test_geometry_with_few_causal_features_and_spread_norms():
    md = section(
        "geometry", geometry_result(last_n_causal=4, norm_spread=0.25, norm_differs=[4096])
    )
    assert "| 4096 | 4 | 3816 | 1.000 | 0.999 | 0.30 [0.21, 0.42] | 0.350 | 0.310 |" in md
    assert paragraph(md) == AUC_PREFIX + (
        "decoder norm: the AUC interval excludes 0.5 at widths 4096; nearest-neighbour cosine: "
        "the AUC interval excludes 0.5 at widths 1024, 2048; with as few as 4 causal feature(s) "
        "at a width, intervals are wide."
    )


def test_geometry_with_enough_causal_features_says_nothing_more():
    md = section("geometry", geometry_result(last_n_causal=10, norm_spread=1e-3))
    text = paragraph(md)
    assert "one norm" not in text and "as few as" not in text and "no causal feature" not in text
    assert text.endswith("at widths 1024, 2048.")


# ----------------------------------------------------------------------------- ablation


def test_ablation_with_misses_and_a_pooled_correlation():
    md = section("ablation", ablation_result())
    assert (
        "| width | features | Spearman real vs AtP | real vs first order | truly causal | "
        "missed by AtP | false alarms |"
    ) in md
    assert "| 1024 | 6 | 0.83 | 0.94 | 3 | 1 | 0 |" in md
    assert "| 4096 | 6 | n/a | 0.77 | 1 | 0 | 2 |" in md
    assert paragraph(md) == (
        "12 features, stratified by AtP, zeroed on 16 eval sequences (2,032 predictions); pooled "
        "Spearman correlation of the real effect with AtP: 0.75; AtP misses 25.0% of the sampled "
        "features whose real effect clears epsilon's equivalent; this is a fraction of the "
        "sample, which over-represents the top of the AtP ranking, not of all features."
    )


def test_ablation_without_misses_to_count_or_a_pooled_correlation():
    md = section("ablation", ablation_result(missed=None, pooled=None))
    assert paragraph(md) == (
        "12 features, stratified by AtP, zeroed on 16 eval sequences (2,032 predictions); no "
        "sampled feature's real effect clears epsilon's sequence-level equivalent, so AtP's "
        "misses cannot be counted here."
    )
    assert "Spearman correlation" not in paragraph(md)
    assert "AtP misses 0.0%" in section("ablation", ablation_result(missed=0.0))


# ----------------------------------------------------------------------------- synthetic


def test_synthetic_where_atp_leaves_out_what_the_saes_learned():
    md = section("synthetic", synthetic_result())
    assert (
        "A toy layer (d = 64) whose output reads a planted 8-dimensional subspace U: 8 causal "
        "features along U's columns (each firing on 25.0% of tokens) and 256 non-causal features "
        "in superposition in the other 56 dimensions (each firing on 2.4%); g = U t with t ~ "
        "N(0, I_k) per token, so Sigma = U U^T and its erank is 8 by construction. SAE sweep: "
        "topk, k = 8, 3 epoch(s) over 65,536 train tokens; AtP on 8,192 eval tokens."
    ) in md
    assert (
        "| width | N_causal | N_repr | FVE | recall (AtP-selected) | recall (any feature) | "
        "subspace capture | selected, mostly outside U |"
    ) in md
    assert "| 128 | 3 | 120 | 0.912 | 12.5% | 75.0% | 30.1% | 1 of 3 |" in md
    assert "| 512 | 12 | 490 | 0.912 | 25.0% | 87.5% | 67.9% | 5 of 12 |" in md
    assert paragraph(md) == (
        "The direct erank of Sigma (loss reading) is 8.012 against k = 8 (+0.15%, within 2%); "
        "the activations' own erank is 54.3, the directions h uses rather than those that move "
        "the output; the SAE estimate kappa_hat is 9.43 [7.10, 14.20], x1.18 the planted k; "
        "AtP-selected features recover at most 37.5% of the planted directions (at width 256) "
        "(paper: 0) and capture at most 67.9% of the planted subspace; while the SAEs do hold "
        "features for up to 87.5% of them: AtP and epsilon leave out planted directions that "
        "the dictionaries contain; epsilon, the 98th percentile of the smallest width's AtP, "
        "puts about 3 features above it at that width whatever k is (3 here), so N_causal there "
        "is set by the calibration, not by the planted dimension."
    )


def test_synthetic_where_the_saes_learned_little_and_no_kappa_was_fitted():
    c = synthetic_result(recalls=(0.0, 0.0, 0.0), learned=(0.25, 0.375, 0.125), kappa=math.nan)
    c["direct"].update(relative_error=0.05, within_2_percent=False)
    text = paragraph(section("synthetic", c))
    assert "k = 8 (+5.00%, outside 2%)" in text
    assert "; the SAE fit gave no kappa_hat; " in text
    assert "kappa_hat is" not in text
    assert "recover at most 0.0% of the planted directions (paper: 0)" in text  # no width
    assert (
        "but no SAE of the sweep has a feature within cosine 0.9 of more than 37.5% of them, so "
        "a low recall here reflects what the SAEs learned under this training budget before it "
        "reflects AtP's selection"
    ) in text
    assert "do hold features" not in text


def test_synthetic_where_atp_finds_all_that_the_saes_learned():
    c = synthetic_result(recalls=(0.5, 0.875, 0.75), learned=(0.75, 0.875, 0.875))
    text = paragraph(section("synthetic", c))
    assert "recover at most 87.5% of the planted directions (at width 256)" in text
    assert "do hold features" not in text and "no SAE of the sweep" not in text


# ----------------------------------------------------------------------------- task


def task_text(**overrides) -> str:
    return paragraph(section("task", task_result(**overrides)))


def test_task_with_ground_truth_outside_the_papers_interval_and_enriched():
    md = section("task", task_result())
    assert (
        "| prompts (verbs) | clean logit diff | clean accuracy | firing / ablated | ground truth "
        "| in top 5% of AtP | recovered [95%] | ablated features in top 5% |"
    ) in md
    assert (
        "| 64 (has/have, is/are, was/were) | 2.346 | 92.2% | 12 / 8 | 5 | 3 | "
        "60.0% [23.1%, 88.2%] | 50.0% |"
    ) in md
    assert paragraph(md) == (
        "Subject-verb agreement across a distractor of the other number, 64 generated prompts; "
        "metric: mean logit(correct) - logit(wrong) at the verb, 2.35 clean, correct verb "
        "preferred on 92.2% of prompts; 5 feature(s) move it by more than 10% of the clean "
        "metric (0.235); 3 of them (60.0%, 95% interval 23.1%-88.2%) rank in the top 5% of the "
        "width by generic-text AtP (the 51 highest); the paper's 98.2% is outside that interval; "
        "of all ablated candidates, 50.0% rank there, which is what a ranking blind to the task "
        "would recover; ground truth is enriched there x1.2; with the bar at half or twice 10%, "
        "the fraction is 60.0% or 100.0%; 4 of the 12 firing features were not ablated (cap 8, "
        "smallest first-order effects dropped); the largest first-order effect among them is "
        "0.0123, well under the bar, so, as far as first order predicts the real effect, they "
        "are unlikely to hold ground truth. Ground truth here is one generated task at one "
        "width, judged by single-feature ablations (features that matter only together are "
        "missed); it checks that AtP's top finds what this task uses, not how many features "
        "matter on generic text."
    )


def test_task_without_ground_truth():
    c = task_result(
        n_ground_truth=0,
        n_ground_truth_in_top=0,
        recovered_fraction=None,
        recovered_95=None,
        paper_inside_interval=None,
        enrichment=None,
        recovered_at_half_bar=1.0,
        recovered_at_double_bar=None,
        ground_truth=[False] * 8,
        n_dropped=0,
        largest_dropped_first_order=None,
        n_candidates=8,
    )
    md = section("task", c)
    assert "| 64 (has/have, is/are, was/were) | 2.346 | 92.2% | 8 / 8 | 0 | 0 | n/a | 50.0% |" in md
    text = paragraph(md)
    assert (
        "preferred on 92.2% of prompts; no ablated feature moves the metric by more than 10% of "
        "the clean metric (0.235), so there is no ground truth and the recovery fraction is "
        "undefined: this is not evidence either way. Ground truth here"
    ) in text
    for absent in ("paper's", "enriched", "bar at half", "not ablated"):
        assert absent not in text


def test_task_with_the_paper_inside_the_interval():
    text = task_text(
        n_ground_truth_in_top=5,
        recovered_fraction=1.0,
        recovered_95=[0.5651, 1.0],
        paper_inside_interval=True,
        enrichment=2.0,
        recovered_at_double_bar=None,
    )
    assert "5 of them (100.0%, 95% interval 56.5%-100.0%)" in text
    assert "the paper's 98.2% is inside that interval" in text
    assert "ground truth is enriched there x2.0" in text
    assert "the fraction is 60.0% or undefined (no ground truth)" in text


@pytest.mark.parametrize(
    ("recovered", "chance", "enrichment", "says"),
    [
        (0.5, 0.5, 1.0, "ground truth is there as often as the candidates are"),
        (0.25, 0.5, 0.5, "ground truth is there less often than the candidates are"),
        (0.0, 0.0, None, "ground truth is there as often as the candidates are"),
    ],
)
def test_task_without_enrichment(recovered, chance, enrichment, says):
    text = task_text(
        recovered_fraction=recovered, evaluated_in_top_fraction=chance, enrichment=enrichment
    )
    assert f"of all ablated candidates, {100 * chance:.1f}% rank there" in text
    assert says in text and "enriched" not in text


@pytest.mark.parametrize("dropped", [0.2, 0.5])  # over half the bar (0.117), and over the bar
def test_task_with_dropped_features_that_may_hold_ground_truth(dropped):
    text = task_text(largest_dropped_first_order=dropped)
    assert (
        f"the largest first-order effect among them is {dropped:.3g}, not far under the bar or "
        "above it, so ground truth may have been dropped and the fraction covers the ablated "
        "features only"
    ) in text
    assert "well under the bar" not in text


@pytest.mark.parametrize(
    ("metric", "accuracy", "warned"),
    [(-0.12, 0.45, True), (0.0, 0.7, True), (1.5, 0.55, True), (1.5, 0.6, False)],
)
def test_task_warns_where_the_model_barely_does_the_task(metric, accuracy, warned):
    text = task_text(clean_metric=metric, clean_accuracy=accuracy)
    assert ("the model barely does this task" in text) == warned


# ----------------------------------------------------------------------------- depth


def test_depth_with_an_epsilon_ratio_and_every_reading():
    md = section("depth", depth_result())
    assert (
        "| layer | epsilon | N_causal per width | growth | kappa_hat | "
        "corrected erank loss / logits / logits_uncentred / fisher |"
    ) in md
    assert "| 3 | 0.0021 | 41 117 301 | x3.10 | 210 [147, 337] | 98.7 / 150 / 120 / 140 |" in md
    assert "| 27 | 0.000105 | 41 117 301 | n/a | 88.8 [62, 142] | 111 / 180 / 60.2 / 170 |" in md
    assert paragraph(md) == (
        "epsilon at layer 3 is x20.00 that at layer 27 (paper: a 20x fall from layer 1 to 23 of "
        "Gemma-2-2B); kappa_hat ranges from 88.8 to 433 over layers 3, 15, 27; the direct "
        "kappa (gauge-invariant logits reading) from 150 to 234. Each layer has its own epsilon "
        "(its smallest SAE's percentile), so N_causal compares across layers only through that "
        "calibration; the direct eranks need no SAE and compare across layers as they are."
    )


def test_depth_without_an_epsilon_ratio_or_a_loss_reading_stars_what_has_not_converged():
    md = section("depth", depth_result(last_epsilon=0.0, loss=False, converged=False))
    assert "| 27 | 0 | 41 117 301 | n/a | 88.8 [62, 142] | n/a / 180* / 60.2 / 170 |" in md
    text = paragraph(md)
    assert text.startswith(
        "epsilon at layer 27 is 0, so no ratio is defined; kappa_hat ranges from 88.8 to 433 "
        "over layers 3, 15, 27; the direct kappa"
    )
    assert "paper" not in text
    assert text.endswith(
        "A starred erank has not converged: its layer's eval tokens hold "
        "fewer than 4 independent equivalents per dimension, so it may still be low."
    )


# ----------------------------------------------------------------------------- scale


def test_scale_compares_the_two_models_shapes():
    md = section("scale", scale_result())
    head = "| widths | KS (log AtP / epsilon) | permutation p | within-model KS (split halves) |"
    assert head in md
    assert "| 1,024 | 0.081 | 0.235 | 0.050 / 0.040 | 1,010 / 1,003 | 41 / 39 |" in md
    assert "| 4,096 | 0.153 | 0.000999 | 0.050 / 0.040 | 3,816 / 3,790 | 301 / 377 |" in md
    assert paragraph(md).startswith(
        "smollm2-135m (layer 15 of 30, d=576) against smollm2-360m (layer 23 of 32, d=960), the "
        "same widths: the normalised AtP distributions differ in shape (permutation p < 0.05) "
        "at 1 of 2 widths, beyond what splitting one model's eval tokens in halves moves it "
        "(the within-model null) at 1; kappa_hat 433 against 612. Normalising"
    )


# ----------------------------------------------------------------------------- figures

PLOTTED = [name for name in NAMES if get(name).plot is not None]


def test_the_controls_without_a_figure():
    assert sorted(set(NAMES) - set(PLOTTED)) == ["l0", "nulls"]


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG) and len(data) > 1000


@pytest.mark.parametrize("name", PLOTTED)
def test_each_control_figure_is_a_png(tmp_path, name):
    path = tmp_path / "figures" / f"control_{name}.png"
    assert get(name).plot(stored(name, RESULTS[name]()), path) == path
    assert_png(path)


RARE = {
    "thresholds": lambda: thresholds_result(growths=(None,) * 4, kappas=(0.0,) * 4, ratio=None),
    "architectures": lambda: architectures_result(kappas=(432.7, 0.0, 0.0), spread=None),
    "four_cell": lambda: four_cell_result(trained=(0, 0, 0)),
    "geometry": lambda: geometry_result(last_n_causal=0),
    "synthetic": lambda: synthetic_result(
        recalls=(0.0, 0.0, 0.0), learned=(0.25, 0.375, 0.125), kappa=math.nan
    ),
    "task": lambda: task_result(ground_truth=[False] * 8, n_ground_truth=0),
    "depth": lambda: depth_result(last_epsilon=0.0, loss=False),
    "ablation": lambda: (
        ablation_result(missed=None, pooled=None) | {"epsilon_sequence_level": None}
    ),
}


@pytest.mark.parametrize("name", sorted(RARE))
def test_each_control_figure_draws_its_rare_cases(tmp_path, name):
    c = RARE[name]()
    if name == "synthetic":
        for r in c["rows"]:
            r["selected_noncausal_fraction"] = None
    path = tmp_path / f"{name}.png"
    get(name).plot(stored(name, c), path)
    assert_png(path)
