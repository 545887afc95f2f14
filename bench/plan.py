"""How much each benchmark does: the full run and ``--quick``.

The full run is sized to take about 6 minutes on a 2-core machine and to give p99s from
hundreds of samples where that is cheap (one claim per request); ``--quick`` checks that
everything works in under 3 minutes and its percentiles are rough.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Case:
    """One prepare/unprepare case: ``claims`` per request, ``parallel`` concurrent streams."""

    claims: int
    parallel: int
    iterations: int
    """Timed rounds of prepare then unprepare, per stream."""
    warmup: int

    @property
    def label(self) -> str:
        """How the tables name the case."""
        if self.parallel == 1:
            return f"{self.claims}"
        return f"{self.claims} x {self.parallel} concurrent"

    @property
    def total_claims(self) -> int:
        """Claims the case needs (each stream has its own)."""
        return self.claims * self.parallel


FULL_CASES = (Case(1, 1, 900, 30), Case(8, 1, 240, 6), Case(64, 1, 60, 3), Case(1, 8, 150, 6))
QUICK_CASES = (Case(1, 1, 60, 5), Case(8, 1, 20, 2), Case(64, 1, 6, 1), Case(1, 8, 15, 2))


@dataclass(frozen=True)
class Plan:
    """Sizes, repeat counts and time windows of one run."""

    quick: bool = False
    prepare_cases: tuple[Case, ...] = FULL_CASES
    rounds: int = 6
    """Each driver's iterations are split into this many rounds, the drivers alternating, so
    that a burst of noise on the machine hits both rather than one."""
    slice_sizes: tuple[int, ...] = (1, 128, 1024, 4096)
    slice_repeats: int = 3
    settle_seconds: float = 10.0
    idle_seconds: float = 20.0
    operator_iterations: Mapping[int, int] = field(default_factory=lambda: {1: 150, 64: 12})
    watch_claims: int = 1000
    status_readers: int = 16
    """Clients reading ``/status`` in a loop while one-claim prepares are timed."""
    status_prepares: int = 300
    """One-claim prepares timed alone, and as many with the readers."""
    nri_iterations: int = 300
    """Containers with a claim (and as many without) created per NRI plugin."""
    nri_syncs: int = 5
    scale_nodes: int = 20
    """``--scale``: nodedra instances, each with a node of its own."""
    scale_claims: int = 20000
    scale_baseline_claims: int = 2000
    """Claims created before any instance runs: the API server's cost without watchers."""
    scale_prepares: int = 300
    churn_rate: float = 100.0
    """Claims deleted and created again per second, while prepares are timed."""
    churn_seconds: float = 60.0

    @classmethod
    def make(cls, quick: bool) -> Plan:
        """The full plan, or the quick one."""
        if not quick:
            return cls()
        return cls(
            quick=True,
            prepare_cases=QUICK_CASES,
            rounds=2,
            slice_repeats=1,
            settle_seconds=4.0,
            idle_seconds=6.0,
            operator_iterations={1: 30, 64: 3},
            status_prepares=40,
            nri_iterations=40,
            nri_syncs=2,
            scale_nodes=4,
            scale_claims=1200,
            scale_baseline_claims=300,
            scale_prepares=50,
            churn_rate=30.0,
            churn_seconds=10.0,
        )
