"""How numbers are written in reports: counts, fractions, intervals, growth factors
(n/a where a value is missing or undefined)."""

from __future__ import annotations

import math


def num(x, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if isinstance(x, int) or (abs(x) >= 100 and digits <= 1):
        return f"{x:,.0f}"
    return f"{x:,.{digits}f}"


def features(x, unit: bool = True) -> str:
    """A width, in features: a whole count ("< 1" where a fit saturates before one);
    unit=False for a column whose header names the unit."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if math.isinf(x):
        return "never"
    count = "< 1" if x < 1 else f"{x:,.0f}"
    return f"{count} {'feature' if x < 1 else 'features'}" if unit else count


def pct(x) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{100 * x:.1f}%"


def ci(iv, digits: int = 0) -> str:
    if not iv or any(v is None or math.isnan(v) for v in iv):
        return "[n/a]"
    return f"[{iv[0]:,.{digits}f}, {iv[1]:,.{digits}f}]"


def sci(iv) -> str:
    return f"[{iv[0]:.3g}, {iv[1]:.3g}]" if iv else "[n/a]"


def growth(x) -> str:
    return "n/a" if x is None else f"x{x:.2f}"


def ci_of(point, iv, digits: int = 0) -> str:
    """A resampled 95% interval beside its point; none where it misses the point (a
    percentile bootstrap of a count that resampling lowers, such as the features that
    fire at least once, lies below it): such an interval covers the resampling's bias,
    not the point's uncertainty, and is not printed."""
    text = ci(iv, digits)
    if text == "[n/a]" or point is None or iv[0] <= point <= iv[1]:
        return text
    side = "below" if iv[1] < point else "above"
    return f"[no interval: the resamples lie all {side} the point]"
