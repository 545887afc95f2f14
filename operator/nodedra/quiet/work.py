"""What the keeper steers: *sources* of the host's work, each with the CPUs it may use.

A source is named by a string (``irq/24``, ``workqueue``, ``unit/system.slice``); a kind of
host work (:class:`HostWork`) knows its own sources, reads and writes their CPUs. The keeper
(:mod:`nodedra.quiet.keeper`) only sees this interface, so interrupts, workqueues and
systemd's slices are kept off claimed CPUs by one loop with one record.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class QuietKinds:
    """Which kinds of host work are kept off claimed CPUs."""

    interrupts: bool = False
    unbound_work: bool = False
    host_processes: bool = False


@dataclass
class Steered:
    """What one pass over the sources did."""

    narrowed: list[str] = field(default_factory=list)
    """Sources now kept off the claimed CPUs (as before, or changed in this pass)."""
    kept: list[str] = field(default_factory=list)
    """Sources whose original has no CPU outside the claims: left on it."""
    refused: dict[str, str] = field(default_factory=dict)
    """Sources the host would not change, and why."""
    reach: dict[str, frozenset[int] | None] = field(default_factory=dict)
    """The CPUs each source steered may run on after the pass (None: it is gone), as the
    write found or left them: the report needs no second read."""

    def add(self, other: Steered) -> None:
        """Take in what ``other`` did."""
        self.narrowed += other.narrowed
        self.kept += other.kept
        self.refused |= other.refused
        self.reach |= other.reach


Written = tuple[frozenset[int] | None, str | None]
"""What one write did: the CPUs the source may run on now (None: it is gone), and why the
host refused it (None: it did not)."""


def steer_each(
    originals: Mapping[str, frozenset[int]],
    allowed: frozenset[int],
    write: Callable[[str, frozenset[int]], Written],
    unrestricted: frozenset[int] = frozenset(),
) -> Steered:
    """Narrow each source to what of its original is ``allowed``.

    ``write`` sets a source's CPUs (:data:`Written`). An empty original means no
    restriction, ``unrestricted`` (a slice without ``AllowedCPUs``); where nothing is taken
    away the original itself is written, so such a source is unrestricted again, not set to
    every CPU by name. A source whose original has no CPU ``allowed`` keeps it.
    """
    steered = Steered()
    for source, original in originals.items():
        base = original or unrestricted
        target = base & allowed
        if not target:
            steered.kept.append(source)
        reach, why = write(source, target if target and target != base else original)
        steered.reach[source] = reach
        if why is not None:
            steered.refused[source] = why
        elif target:
            steered.narrowed.append(source)
    return steered


def restore_each(
    originals: Mapping[str, frozenset[int]], write: Callable[[str, frozenset[int]], Written]
) -> dict[str, str]:
    """Write each source's original back; the sources that refused, and why."""
    refused = {}
    for source, original in originals.items():
        _, why = write(source, original)
        if why is not None:
            refused[source] = why
    return refused


class HostWork(Protocol):
    """One kind (or several) of the host's work, as sources with CPUs."""

    def owns(self, source: str) -> bool:
        """Whether ``source`` is one of this kind's."""

    def sources(self, kinds: QuietKinds) -> list[str]:
        """The sources there are now, of the kinds asked for."""

    def unavailable(self, kinds: QuietKinds) -> dict[str, str]:
        """The kinds asked for that cannot be steered on this node, and why."""

    def original(self, source: str) -> frozenset[int] | None:
        """What ``source`` is set to now, to be recorded before its first write (None: gone).

        An empty set means "not restricted" where the source has such a setting (a slice
        without ``AllowedCPUs``): given back, it is unset again.
        """

    def reach(self, source: str) -> frozenset[int] | None:
        """The CPUs ``source`` may run on now (None: gone)."""

    def steer(self, originals: Mapping[str, frozenset[int]], allowed: frozenset[int]) -> Steered:
        """Narrow each source of ``originals`` to what of its original is ``allowed``."""

    def restore(self, originals: Mapping[str, frozenset[int]]) -> dict[str, str]:
        """Give each source its original back; the sources that refused, and why."""

    def describe(self, source: str) -> str:
        """``source`` for people."""

    def close(self) -> None:
        """Let go of what the kind holds open (a connection), once nodedra stops."""


class AllWork:
    """Several kinds of host work as one: each source goes to the kind that owns it."""

    def __init__(self, works: Sequence[HostWork]) -> None:
        self._works = tuple(works)

    def owns(self, source: str) -> bool:
        return any(w.owns(source) for w in self._works)

    def sources(self, kinds: QuietKinds) -> list[str]:
        return [s for w in self._works for s in w.sources(kinds)]

    def unavailable(self, kinds: QuietKinds) -> dict[str, str]:
        return {k: why for w in self._works for k, why in w.unavailable(kinds).items()}

    def original(self, source: str) -> frozenset[int] | None:
        return self._owner(source).original(source)

    def reach(self, source: str) -> frozenset[int] | None:
        return self._owner(source).reach(source)

    def steer(self, originals: Mapping[str, frozenset[int]], allowed: frozenset[int]) -> Steered:
        steered = Steered()
        for work, part in self._split(originals):
            steered.add(work.steer(part, allowed))
        return steered

    def restore(self, originals: Mapping[str, frozenset[int]]) -> dict[str, str]:
        refused: dict[str, str] = {}
        for work, part in self._split(originals):
            refused |= work.restore(part)
        return refused

    def describe(self, source: str) -> str:
        return self._owner(source).describe(source)

    def close(self) -> None:
        for work in self._works:
            work.close()

    def _owner(self, source: str) -> HostWork:
        for work in self._works:
            if work.owns(source):
                return work
        raise ValueError(f"no kind of host work has the source {source!r}")

    def _split(
        self, originals: Mapping[str, frozenset[int]]
    ) -> list[tuple[HostWork, dict[str, frozenset[int]]]]:
        """``originals`` by the kind that owns each (a source no kind owns is an error)."""
        for source in originals:
            self._owner(source)
        return [
            (w, {s: c for s, c in originals.items() if w.owns(s)})
            for w in self._works
            if any(w.owns(s) for s in originals)
        ]
