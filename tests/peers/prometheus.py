"""Reading one sample out of the Prometheus text nodedra serves on /metrics."""

from __future__ import annotations

from collections.abc import Mapping


def sample(text: str, name: str, labels: Mapping[str, str] | None = None) -> float | None:
    """The value of the sample of metric ``name`` with exactly ``labels``; None if absent."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted((labels or {}).items()))
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        series, value = line.rsplit(" ", 1)
        metric, _, rest = series.partition("{")
        if metric != name:
            continue
        got = ",".join(sorted(p for p in rest.rstrip("}").split(",") if p))
        if got == wanted:
            return float(value)
    return None
