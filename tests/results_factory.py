"""Hand-made results dicts, as a run writes them (no model, store or training): the
report's and the claims' tests build on make_results()."""

from __future__ import annotations

import copy
from pathlib import Path

from causaldim import __version__
from causaldim.config import AnalysisConfig, HarvestConfig
from causaldim.measures.analysis import ATP_EDGES
from causaldim.measures.sigma import DEFINITIONS
from causaldim.paper import PAPER
from causaldim.report.cautions import collect, headline_object, touching_headline
from causaldim.report.direct import direct_sigma
from causaldim.report.doc import Doc
from causaldim.report.results import SCHEMA
from causaldim.report.results import direct_kappa as direct_number
from causaldim.report.sweep_sections import sweeps
from causaldim.sweep_config import SweepConfig

D = 576
WIDTHS = (1024, 2048, 4096)
PNG = b"\x89PNG\r\n\x1a\n"
CODES = ["few_widths", "kappa_hat_extrapolated", "kappa_hat_above_d"]
WARNINGS = [
    "only 3 widths: a saturating fit needs at least 4 to mean much",
    "extrapolated: the fit reaches 95% of kappa_hat only at width 9,880, beyond the widest "
    "SAE (4,096)",
    "the free kappa_hat or its interval exceeds d = 576, which kappa cannot (kappa <= d): read "
    "the constrained fit beside it",
]


# ----------------------------------------------------------------------------- the results dict


CORRECTION_KEYS = (
    "n_independent",
    "converged",
    "eval_tokens_needed",
    "correlation",
    "erank_corrected",
    "erank_corrected_95",
    "erank_corrected_half",
    "erank_corrected_se",
    "eigenvalues_corrected",
    "participation_ratio_unbiased",
    "participation_ratio_unbiased_95",
)


def sigma_estimate(
    reading, erank, pr, iv, n_tokens=8192, probes=1, warning=None, boot=True, converged=True
):
    """A reading as SigmaEstimate.to_dict() writes it."""
    n = n_tokens * probes
    return {
        "reading": reading,
        "definition": DEFINITIONS[reading],
        "n_tokens": n_tokens,
        "n_samples": n,
        "samples_per_dim": n / D,
        "eigenvalues": [1.0 / (i + 1) for i in range(D)],
        "erank": erank,
        "erank_over_d": erank / D,
        "participation_ratio": pr,
        "directions_for": {"50%": 40, "90%": 220, "99%": 480},
        "split_half": {
            "first": {"erank": erank - 1.0, "participation_ratio": pr - 1.0},
            "second": {"erank": erank + 1.0, "participation_ratio": pr + 1.0},
        },
        "convergence": [
            {"n_samples": n // 4, "erank": 0.8 * erank, "participation_ratio": 0.8 * pr},
            {"n_samples": n // 2, "erank": 0.95 * erank, "participation_ratio": 0.95 * pr},
            {"n_samples": n, "erank": erank, "participation_ratio": pr},
        ],
        "warning": warning,
        "n_eff": 0.25 * n,
        "common_mode_share": 0.5 if reading == "logits_uncentred" else None,
        # the finite-sample correction: for the direct readings, 10% above the plug-in
        **(
            dict.fromkeys(CORRECTION_KEYS)
            if reading == "activations"
            else {
                "n_independent": (9.0 if converged else 3.0) * D,  # per the rule of 8 a dimension
                "converged": converged,
                "eval_tokens_needed": None if converged else 4 * n_tokens,
                "correlation": [1.0, 0.5, 0.2],
                "erank_corrected": 1.1 * erank,
                "erank_corrected_95": [1.1 * iv[0], 1.1 * iv[1]] if boot else None,
                "erank_corrected_half": 1.09 * erank,
                "erank_corrected_se": {"sampling": 2.0, "simulation": 0.5},
                "eigenvalues_corrected": [1.0 / D] * D,
                "participation_ratio_unbiased": 1.2 * pr,
                "participation_ratio_unbiased_95": [1.1 * pr, 1.3 * pr] if boot else None,
            }
        ),
    }


def fit(kappa, params, aic, iv, width_95, at_bound=None, aicc=None):
    """One form's row of KappaEstimate.to_dict()['fits'] (aicc: aic + 10 by default)."""
    return {
        "kappa": kappa,
        "params": params,
        "aic": aic,
        "aicc": aic + 10 if aicc is None else aicc,
        "interval_95": iv,
        "width_95": width_95,
        "at_bound": at_bound,
    }


def kappa_estimate(fits, form, iv, kappa_max, n_last):
    """analyze()'s entry for one bound: KappaEstimate.to_dict() with kappa_over_d and
    coverage."""
    chosen = fits[form]
    return {
        "form": form,
        "kappa": chosen["kappa"],
        "interval_95": iv,
        "width_95": chosen["width_95"],
        "at_bound": chosen["at_bound"],
        "fits": fits,
        "form_frequency": {"exponential": 0.215, "hyperbolic": 0.67, "lomax": 0.115},
        "kappa_max": kappa_max,
        "criterion": "aicc",
        "kappa_over_d": chosen["kappa"] / D,
        "coverage": n_last / chosen["kappa"],
    }


def histogram(zero):
    counts = [0] * (len(ATP_EDGES) - 1)
    counts[10], counts[20], counts[25] = 300, 500, 40
    return {
        "log10_edges": ATP_EDGES,
        "counts": counts,
        "zero": zero,
        "below_range": 0,
        "above_range": 0,
    }


def width_row(width, n_repr, n_causal, l0, fve, dead, ce, n_repr_95, n_causal_95):
    """One row of analyze()'s per_width."""
    return {
        "width": width,
        "n_repr": n_repr,
        "n_causal": n_causal,
        "inert_fraction": (n_repr - n_causal) / n_repr,
        "mean_l0": 32.0,
        "l0": l0,
        "fraction_variance_explained": fve,
        "dead_fraction": dead,
        "ce_loss_recovered": ce,
        "atp_histogram": histogram(width - n_repr),
        "atp_max": 0.0123,
        "n_causal_95": n_causal_95,
        "n_repr_95": n_repr_95,
        "atp_total": 0.5 * n_causal * 3.2109e-05 + 0.01,
        "markov_ceiling": (0.5 * n_causal * 3.2109e-05 + 0.01) / 3.2109e-05,
        "median_firings_eval": 8192 * 32 / width / 2,
        "median_firings_train": 3 * 57344 * 32 / width / 2,
        "top_firing_rate": 0.25 * 1024 / width,
        "n_causal_other": 2 * n_causal,
    }


FREE_FITS = {
    "exponential": fit(318.4, {"m0": 1402.2}, 14.52, [280.3, 371.9], 4200.6),
    "hyperbolic": fit(432.7, {"m0": 520.0}, 9.87, [311.2, 698.4], 9880.0),
    "lomax": fit(4321.0, {"m0": 9000.0, "a": 0.05}, 11.03, [350.0, 9999.0], 2.5e6, "a"),
}
BOUNDED_FITS = {
    "exponential": FREE_FITS["exponential"],
    "hyperbolic": FREE_FITS["hyperbolic"],
    "lomax": fit(576.0, {"m0": 8000.0, "a": 0.06}, 11.91, [350.0, 576.0], 2.1e6, "kappa"),
}


def architecture(binds=True):
    """analyze()'s dict for one architecture's sweep of WIDTHS."""
    rows = [
        width_row(1024, 1010, 41, 31.87, 0.8123, 0.0703, 0.9134, [998.0, 1022.0], [35.0, 48.0]),
        width_row(2048, 1987, 117, 32.14, 0.8456, 0.1172, 0.9387, [1970.0, 2003.0], [101.0, 130.0]),
        width_row(4096, 3816, 301, 31.62, 0.8711, 0.1113, 0.9521, [3790.0, 3840.0], [270.0, 333.0]),
    ]
    bounded = BOUNDED_FITS if binds else copy.deepcopy(FREE_FITS)
    return {
        "reference_width": 1024,
        "percentile": 98.0,
        "epsilon": 3.2109e-05,
        "epsilon_95": [2.9e-05, 3.5e-05],
        "n_eval_tokens": 8192,
        "blocks": 32,
        "bootstrap": 200,
        "per_width": rows,
        "wedge": {
            "width_ratio": 4.0,
            "n_repr_growth": 3.7782,
            "n_causal_growth": 7.3415,
            "n_repr_loglog_slope": 0.9589,
            "n_causal_loglog_slope": 1.4372,
            "n_repr_loglog_widths": 3,
            "n_causal_loglog_widths": 3,
            "widths": 3,
            "n_causal_growth_95": [5.9, 8.8],
        },
        "normalisation": "all",
        "seeds": 1,
        "estimable": True,
        "not_estimable": None,
        "regime": {
            "reference_over_d": 1024 / D,
            "widest_over_d": 4096 / D,
            "paper_reference_over_d": 16384 / 2304,
            "paper_widest_over_d": 1048576 / 2304,
        },
        "sensitivity": {
            "normalisation": "firing",
            "epsilon": 0.0123,
            "n_causal": [82, 234, 602],
            "n_causal_growth": 602 / 82,
        },
        "splits": [
            {
                "width": w,
                "parents": 41,
                "best_cosine": c,
                "children": n,
                "top_child_share": share,
                "children_firings_over_parent": kept,
            }
            for w, c, n, share, kept in (
                (2048, 0.93, 2.0, 0.61, 0.98),
                (4096, 0.88, 3.0, 0.45, 0.97),
            )
        ],
        "attributed": {
            "per_width": [
                {"width": 1024, "erank": 101.2, "erank_95": [95.1, 108.3]},
                {"width": 2048, "erank": 120.4, "erank_95": [112.0, 129.9]},
                {"width": 4096, "erank": 126.6, "erank_95": [118.2, 135.5]},
            ],
            "widest": 126.6,
            "widest_95": [118.2, 135.5],
            "change_at_widest": 126.6 / 120.4 - 1,
            "resamples": 50,
        },
        "kappa": {
            "free": kappa_estimate(FREE_FITS, "hyperbolic", [311.2, 698.4], None, 301),
            "at_most_d": kappa_estimate(bounded, "hyperbolic", [311.2, 576.0], float(D), 301),
        },
        "constraint_binds": binds,
        "warnings": list(WARNINGS),
        "cautions": [[code, w] for code, w in zip(CODES, WARNINGS, strict=True)],
    }


IDENTITY = {
    "name": "smollm2-135m",
    "family": "llama",
    "files": {"model.safetensors": "sha256:aa11", "config.json": "sha256:bb22"},
}


def make_results(**overrides) -> dict:
    """A complete results.json dict as build_results() assembles it, by hand; top-level keys
    replaced by overrides. A fresh dict on every call, free to modify."""
    results = {
        "schema": SCHEMA,
        "causaldim_version": __version__,
        "preset": "default",
        "config": {
            "harvest": HarvestConfig(device="cpu", dtype="float32", batch_size=8).to_dict(),
            "sweep": SweepConfig(widths=list(WIDTHS), sae_dtype="float32").to_dict(),
            "analysis": AnalysisConfig().to_dict(),
        },
        "seed": 7,
        "inputs": {
            "model": dict(IDENTITY),
            "corpus": {
                "id": "builtin-py3.11",
                "sha256": "c0ffee42",
                "n_docs": 812,
                "n_chars": 1_234_567,
                "sequences_available": 600,
            },
            "store": {
                "path": "store/L15-3fa9",
                "manifest_sha256": "deadbeef99",
                "key": {"logit_probes": 1, "fisher_probes": 1},
            },
        },
        "store": {
            "reused": False,
            "model": {
                "identity": dict(IDENTITY),
                "kind": "hf",
                "n_layers": 30,
                "d_model": D,
                "vocab_size": 49152,
            },
            "layer": 15,
            "site": "output of block 15 (model.layers[15])",
            "seq_len": 128,
            "tokens": {"train": 57344, "eval": 8192},
            "throughput_tokens_per_second": {"train": 5000.0, "eval": 900.0},
            "outliers": {
                "factor": 10.0,
                "median_norm": 3.1,
                "threshold": 31.0,
                "n_outliers": 1234,
                "n_tokens": 65536,
                "variance_share": 0.4567,
            },
            "eval_mean_loss": 3.21,
            "probes": {"logits": 1, "fisher": 1},
        },
        "sigma": {
            "loss": sigma_estimate("loss", 123.4, 45.6, [110.2, 131.8]),
            "logits": sigma_estimate("logits", 234.5, 78.9, [220.1, 249.9]),
            "logits_uncentred": sigma_estimate("logits_uncentred", 134.5, 48.9, [120.1, 149.9]),
            "fisher": sigma_estimate(
                "fisher", 210.9, 66.6, [199.3, 230.4], warning="not converged: erank changed"
            ),
            "activations": sigma_estimate("activations", 301.2, 12.3, [290.4, 310.6]),
        },
        "ce": {"clean_loss": 3.2109, "mean_ablated_loss": 7.6543, "n_predictions": 8128},
        "saes": {
            f"topk-w{w}": {
                "folder": f"saes/topk-w{w}",
                "reused": False,
                "seconds": 12.0,
                "steps": 96,
            }
            for w in WIDTHS
        },
        "sweep": {"topk": architecture()},
        "controls": {},
        "headline": {},
        "paper": copy.deepcopy(PAPER),
        "versions": {"causaldim": __version__, "torch": "2.4.0", "python": "3.11.7"},
        "started": "2025-01-02T03:04:05Z",
        "seconds": {"harvest": 100.31, "sweep": 400.02, "report": 11.44, "total": 611.77},
    }
    results.update(overrides)
    return with_warnings(results)


def with_warnings(results: dict) -> dict:
    """The headline object and the warnings list, as build_results derives them."""
    results.setdefault("direct_kappa", direct_number(results["sigma"]))
    results["headline"] = headline_object(results, "topk")
    results["warnings"] = collect(results)
    results["headline"]["warnings"] = touching_headline(results["warnings"], "topk")
    return results


def text(*sections, results=None, figures=None) -> str:
    """The Markdown of a Doc holding the given sections of results."""
    doc = Doc()
    for section in sections:
        if section in (sweeps, direct_sigma):
            section(doc, results, figures or {})
        else:
            section(doc, results)
    return doc.markdown(Path("/"))


def lines_with(md: str, needle: str) -> list[str]:
    return [line for line in md.splitlines() if needle in line]


# ----------------------------------------------------------------------------- fmt and Doc
