"""The saturating fits: exact recovery without noise, honest intervals with it."""

from __future__ import annotations

import numpy as np
import pytest

from causaldim.measures.fit import FORMS, estimate_kappa, fit_form, grid_fits

WIDTHS = np.array([256, 512, 1024, 2048, 4096, 8192, 16384], float)
TRUE = {  # kappa, then the form's own parameters; between 85% and 98% saturated at 16,384
    "exponential": (1000.0, 4000.0),
    "hyperbolic": (1000.0, 3000.0),
    "lomax": (1000.0, 3000.0, 2.0),
}


@pytest.mark.parametrize("form", FORMS)
def test_noiseless_curves_are_recovered(form):
    counts = FORMS[form].curve(WIDTHS, *TRUE[form])
    fit = fit_form(form, WIDTHS, counts)
    assert fit.kappa == pytest.approx(TRUE[form][0], rel=1e-3)
    assert fit.at_bound is None
    width_95 = FORMS[form].width_at(0.95, *TRUE[form][1:])
    assert FORMS[form].curve(width_95, *TRUE[form]) == pytest.approx(950.0)
    assert fit.width_95 == pytest.approx(width_95, rel=1e-2)
    est = estimate_kappa(WIDTHS, counts)
    assert est.form in FORMS and est.kappa == pytest.approx(1000.0, rel=0.05)


@pytest.mark.parametrize("form", FORMS)
def test_the_95_interval_covers_the_true_kappa(form):
    """100 noisy sweeps per form: counts measured on 32 blocks of data (Poisson noise plus
    4% extra spread), the interval from resampling the blocks, as the pipeline does."""
    rng = np.random.default_rng(0)
    mean = FORMS[form].curve(WIDTHS, *TRUE[form])
    blocks, covered, chosen_right = 32, 0, 0
    for _ in range(100):
        spread = np.sqrt(mean + (0.04 * mean) ** 2) * np.sqrt(blocks)
        data = mean + rng.normal(size=(blocks, len(WIDTHS))) * spread
        resamples = data[rng.integers(0, blocks, (200, blocks))].mean(1)
        est = estimate_kappa(WIDTHS, data.mean(0), resamples)
        lo, hi = est.interval_95
        covered += lo <= TRUE[form][0] <= hi
        chosen_right += est.form == form
    print(f"{form}: covered {covered}/100, form chosen right {chosen_right}/100")
    assert covered >= 90


SWEEP8 = np.array([256 * 2**i for i in range(8)], float)
DRAWN = {  # kappa 400 at widths 256..32,768; lomax with a heavy tail (a = 0.4)
    "exponential": (400.0, 1500.0),
    "hyperbolic": (400.0, 1500.0),
    "lomax": (400.0, 1500.0, 0.4),
}


def test_the_form_is_identified_on_sweeps_drawn_from_each_form():
    """40 Poisson sweeps of 8 widths drawn from each form, the form chosen by AICc.
    Measured (60 draws each): exponential 92%, hyperbolic 80%, lomax 17% (plain AIC:
    88%, 67%, 53%); at 5 widths 55%, 60% and 0%. A true lomax is rarely told apart from
    the 2-parameter forms at these widths; what AICc buys is that a 2-parameter truth is
    rarely taken for lomax."""
    rng = np.random.default_rng(1)
    chosen = {truth: [] for truth in DRAWN}
    for truth, params in DRAWN.items():
        mean = FORMS[truth].curve(SWEEP8, *params)
        for _ in range(40):
            chosen[truth].append(estimate_kappa(SWEEP8, rng.poisson(mean)).form)
    rate = {truth: forms.count(truth) / len(forms) for truth, forms in chosen.items()}
    print(f"identified: {rate}")
    assert rate["exponential"] >= 0.8 and rate["hyperbolic"] >= 0.65
    assert rate["lomax"] >= 0.05  # found sometimes, not never
    two = chosen["exponential"] + chosen["hyperbolic"]
    assert two.count("lomax") / len(two) <= 0.1


def test_the_constraint_holds_and_a_linear_curve_is_flagged():
    linear = 0.2 * WIDTHS  # no saturation at all within the sweep
    free = estimate_kappa(WIDTHS, linear)
    bounded = estimate_kappa(WIDTHS, linear, kappa_max=576.0)
    assert free.kappa > 3 * linear[-1] or free.at_bound  # it extrapolates, and says so
    assert bounded.kappa <= 576.0 and bounded.kappa_max == 576.0
    assert all(fit["kappa"] <= 576.0 for fit in bounded.fits.values())


def test_grid_fits_match_the_polished_fit():
    counts = FORMS["lomax"].curve(WIDTHS, *TRUE["lomax"])
    (grid,) = grid_fits("lomax", WIDTHS, counts[None])
    assert grid.kappa == pytest.approx(fit_form("lomax", WIDTHS, counts).kappa, rel=0.02)
