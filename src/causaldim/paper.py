"""Every number quoted from the paper (Sarkar & Deka, arXiv 2605.08740; METHOD.md section
3), in one place: results.json carries them, and the report sets each beside this run's."""

from __future__ import annotations

# Gemma-2-2B layer 12, widths 16,384..1,048,576.
PAPER = {
    "source": "Sarkar & Deka, arXiv 2605.08740, Gemma-2-2B layer 12, widths 16,384..1,048,576",
    "d_model": 2304,
    "reference_width": 16_384,  # 7.1 d
    "widest_width": 1_048_576,  # 455 d
    "width_ratio": 64,
    "n_repr_growth": 15.6,
    "n_causal_growth": 4.35,
    "inert_fraction": 0.979,
    "kappa_hat": 1990,
    "kappa_hat_95": [545, 5130],
    "kappa_over_d": 0.86,
    "kappa_pr": 280,
    "coverage": 0.72,
    "width_full_recovery": 2_600_000,
}

# The controls' figures (METHOD.md sections 3 and 4).
TASK_RECOVERY = 0.982  # share of task ground truth in the top 5% of AtP features
RANDOM_ENCODER_INFLATION = 9.27  # N_causal with a random orthonormal encoder / trained
EPSILON_FALL = 20  # epsilon at layer 1 over epsilon at layer 23 of Gemma-2-2B
SYNTHETIC_RECALL = 0.0  # AtP recall of planted causal directions in the toy model

# The claims' layer: where the paper measured (layer 12 of Gemma-2-2B's 26)
MIDDLE_DEPTH = 12 / 25


def depth_layer(depth: float, n_layers: int) -> int:
    """The layer nearest a relative depth (layer / (layers - 1))."""
    return round(depth * (n_layers - 1))


# The conditions the paper measured under, set beside a run's own wherever a verdict is.
CONDITIONS = {
    "model": "Gemma-2-2B, a base model (Gemma-2-9B for the scale control), weights as released",
    "corpus": "generic text",
    "seq_len": 512,
    "left_out": "not stated",
}
