"""What an interval covers: the bias the notes under the tables quote is the stress
suite's own figure, read from its table."""

from __future__ import annotations

from pathlib import Path

import pytest

from causaldim.claims.conditions import ESTIMATOR_BIAS, kappa_intervals
from causaldim.measures.debias import MIN_INDEPENDENT_PER_DIM

SUITE = Path(__file__).resolve().parents[2] / "docs/stress-suite.txt"


def converged_errors() -> list[float]:
    """|corrected error| of every stress-suite cell at the convergence rule's count."""
    errors = []
    for line in SUITE.read_text().splitlines():
        p = line.split()
        converged = len(p) >= 13 and p[-1] == "ok" and p[11] != "n/a"
        if converged and float(p[7]) >= MIN_INDEPENDENT_PER_DIM:  # est ind/d
            errors.append(abs(float(p[11].rstrip("%"))) / 100)
    return errors


def test_the_quoted_bias_is_the_stress_suites_largest_at_convergence():
    errors = converged_errors()
    assert len(errors) >= 20
    assert max(errors) == pytest.approx(ESTIMATOR_BIAS)
    assert f"{100 * ESTIMATOR_BIAS:.1f}%" in kappa_intervals()
