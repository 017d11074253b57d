"""The atlas's claims per model: the level, spectrum and depth of one cell's layers by the
claims tables' rules, the first and last of the model's blocks left out of the depth (not
the first and last layer the cell happened to measure)."""

from __future__ import annotations

from causaldim.claims import FAILS, HOLDS, UNTESTABLE
from causaldim.claims.atlas import atlas_claims

D, LAYERS = 64, 18


def estimate(kappa: float, converged: bool = True) -> dict:
    return {
        "n_samples": 100 * D,
        "erank_corrected": kappa,
        "erank_corrected_95": [kappa * 0.99, kappa * 1.01],
        "participation_ratio_unbiased": kappa / 2,
        "participation_ratio_unbiased_95": [kappa / 2 * 0.99, kappa / 2 * 1.01],
        "n_independent": (9.0 if converged else 3.0) * D,
        "converged": converged,
    }


def cell(kappas: dict[int, float], converged: bool = True) -> dict:
    """A cell of a model with LAYERS blocks, measured at the layers given."""
    return {
        "cell": {"model": "m", "corpus": "speeches", "seq_len": 128},
        "corpus": "speeches",
        "model": {"d_model": D, "n_layers": LAYERS, "family": "gemma3_text", "vocab_size": 999},
        "layers": {
            str(i): {"left out": {"logits": estimate(k, converged)}} for i, k in kappas.items()
        },
    }


def row(cells: list[dict], key: str) -> tuple[str, str, str]:
    (found,) = [r for r in atlas_claims(cells) if r[0] == f"{key}, m on speeches, seq 128"]
    return found[2], found[1], found[3]


def test_depth_over_the_cells_layers_leaves_out_the_models_first_and_last_block():
    five = {0: 10.0, 4: 60.0, 8: 50.0, 13: 45.0, 17: 5.0}  # 0 and 17: the model's ends
    verdict, shown, _ = row([cell(five)], "kappa_depth")
    assert verdict == HOLDS and "over 3 layers" in shown  # 4, 8 and 13: x1.33
    verdict, _, why = row([cell({**five, 13: 20.0})], "kappa_depth")
    assert verdict == FAILS and "3.00" in why
    verdict, _, why = row([cell(five, converged=False)], "kappa_depth")
    assert verdict == UNTESTABLE


def test_each_model_gets_its_level_and_spectrum_at_the_middle_layer():
    verdict, shown, _ = row([cell({4: 60.0, 8: 50.0, 13: 45.0})], "kappa_level (0.86 d)")
    assert verdict == HOLDS and "kappa 50.0" in shown  # 50 / 64 = 0.78 d
    verdict, _, _ = row([cell({8: 10.0})], "kappa_level (0.86 d)")
    assert verdict == FAILS
    verdict, _, why = row([cell({8: 50.0})], "kappa_spectrum")
    assert verdict == FAILS and "flatter" in why  # PR / kappa = 0.5 against 0.14
