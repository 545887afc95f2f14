"""Percentiles and summaries of timings, in milliseconds."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), linearly interpolated between closest ranks.

    The same definition as numpy's default, so the figures can be checked with it. With
    n samples, p99 is only meaningful when n is well above 100; below that it is close to
    the maximum, which the results say by recording n.
    """
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary_ms(nanoseconds: Sequence[int]) -> dict[str, float]:
    """p50, p90, p99, mean, min and max of durations given in nanoseconds, in ms."""
    ms = [n / 1e6 for n in nanoseconds]
    return {
        "n": len(ms),
        "p50": round(percentile(ms, 50), 3),
        "p90": round(percentile(ms, 90), 3),
        "p99": round(percentile(ms, 99), 3),
        "mean": round(sum(ms) / len(ms), 3) if ms else math.nan,
        "min": round(min(ms), 3) if ms else math.nan,
        "max": round(max(ms), 3) if ms else math.nan,
    }


def ratio(numerator: float, denominator: float) -> float | None:
    """numerator / denominator rounded, or None when it means nothing."""
    if not denominator or math.isnan(numerator) or math.isnan(denominator):
        return None
    return round(numerator / denominator, 2)
