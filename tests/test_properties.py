"""Property-based checks: the config reader, the fits and the rank functions never crash
on valid input and give sane outputs; invalid input gives a clean UsageError."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from causaldim.errors import UsageError
from causaldim.measures.fit import FORMS, estimate_kappa
from causaldim.measures.sigma import spectrum
from causaldim.presets import field_types, preset_configs, read_config_file

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TYPES = field_types()
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


@FAST
@given(st.dictionaries(st.text(max_size=12), json_values, max_size=5))
def test_any_json_object_is_read_or_refused_cleanly(tmp_path_factory, obj):
    path = tmp_path_factory.mktemp("cfg") / "c.json"
    path.write_text(json.dumps(obj))
    try:
        flat = read_config_file(path)
    except UsageError as exc:
        assert "\n" not in str(exc) and str(exc)
        return
    assert set(flat) <= set(TYPES)


@FAST
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "tokens": st.integers(-5, 10**6),
            "seq_len": st.integers(-5, 4096),
            "eval_fraction": st.floats(-1, 2, allow_nan=False),
            "widths": st.lists(st.integers(-4, 10**5), max_size=6),
            "k": st.integers(-2, 200),
            "percentile": st.floats(-10, 110, allow_nan=False),
            "blocks": st.integers(-2, 100),
            "bootstrap": st.integers(-5, 500),
            "lr": st.floats(-1, 1, allow_nan=False),
            "controls": st.lists(st.sampled_from(["all", "depth", "thresholds", "nope"])),
        },
    )
)
def test_any_typed_setting_is_checked_without_crashing(overrides):
    """Typed but possibly impossible values: each config either checks out or says why."""
    try:
        harvest, sweep, analysis = preset_configs("smoke", **overrides)
        sweep.check()
        analysis.check()
        sweep.check_reference(analysis.reference_width)
    except UsageError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert sweep.widths == sorted(set(sweep.widths)) and all(w > 0 for w in sweep.widths)
    assert 1 <= sweep.k <= sweep.widths[0] and 0 < analysis.percentile < 100


@FAST
@given(st.dictionaries(st.sampled_from(sorted(TYPES)), json_values, min_size=1, max_size=3))
def test_wrongly_typed_settings_are_refused_by_name(tmp_path_factory, obj):
    path = tmp_path_factory.mktemp("cfg") / "c.json"
    path.write_text(json.dumps(obj))
    try:
        read_config_file(path)
    except UsageError as exc:
        assert any(repr(k) in str(exc) for k in obj)


@FAST
@given(
    st.lists(st.integers(0, 5000), min_size=3, max_size=7),
    st.sampled_from([None, 576.0]),
)
def test_fits_of_any_counts_are_finite_and_within_bounds(counts, kappa_max):
    widths = 256.0 * 2.0 ** np.arange(len(counts))
    est = estimate_kappa(widths, counts, kappa_max=kappa_max)
    assert est.form in FORMS
    assert math.isfinite(est.kappa) and est.kappa >= 0
    if kappa_max is not None:
        assert est.kappa <= kappa_max * (1 + 1e-9)
    for fit in est.fits.values():
        assert math.isfinite(fit["aic"]) or fit["aic"] == math.inf


@FAST
@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=64))
def test_erank_lies_between_one_and_the_number_of_nonzero_eigenvalues(values):
    s = spectrum(torch.tensor(values, dtype=torch.float64))
    nonzero = sum(v > 0 for v in values)
    if sum(values) == 0:
        assert s.erank == 0.0 and s.participation_ratio == 0.0
        return
    assert 1.0 - 1e-9 <= s.participation_ratio <= s.erank * (1 + 1e-9)
    assert s.erank <= nonzero * (1 + 1e-9)
    assert 1 <= s.directions_for["50%"] <= s.directions_for["90%"] <= s.directions_for["99%"]
    assert s.directions_for["99%"] <= len(values)


@pytest.mark.parametrize("k", [1, 3, 17])
def test_erank_of_k_equal_eigenvalues_is_k(k):
    assert spectrum(torch.ones(k)).erank == pytest.approx(k)
