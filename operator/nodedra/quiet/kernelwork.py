"""Device interrupts and unbound kernel work, steered by the kernel's own files.

Each device interrupt's ``/proc/irq/N/smp_affinity_list``, the affinity of interrupts set up
later (``/proc/irq/default_smp_affinity``) and the unbound workqueues' CPUs
(``/sys/devices/virtual/workqueue/cpumask``) are *sources* of work on a CPU, each with the
CPUs it may use. Steering one narrows what it had before nodedra touched it (its original:
the admin's or the kernel's) to the CPUs no claim holds; where that would leave none, it
keeps its original and says so. Some interrupts refuse (EIO: the kernel manages those of
multi-queue devices and moves them itself): they are reported with the devices they serve.

Where irqbalance runs (``balanced``), it places the interrupts and is told to keep off
claimed CPUs (:mod:`nodedra.quiet.irqbalance`); an interrupt is then only moved off claimed
CPUs at once (to where it was, less those), never back to its original while claims hold
CPUs: irqbalance would move it, and nodedra back, at every pass.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Mapping
from pathlib import Path

from nodedra.topology.cpulist import format_cpu_list, parse_cpu_list

from .cpumask import format_mask, parse_mask
from .work import QuietKinds, Steered, Written, restore_each, steer_each

DEFAULT_AFFINITY = "irq/default"
"""The source of interrupts set up later."""
WORKQUEUE = "workqueue"
"""The source of the unbound workqueues."""


def irq_source(number: str) -> str:
    """The source of interrupt ``number``."""
    return f"irq/{number}"


def is_interrupt(source: str) -> bool:
    """Whether ``source`` is one device interrupt (not the default affinity)."""
    return source.startswith("irq/") and source != DEFAULT_AFFINITY


class KernelWork:
    """The sources of ``irq_dir`` (``/proc/irq``) and ``workqueue_dir``; either may be None."""

    def __init__(
        self,
        irq_dir: Path | None,
        workqueue_dir: Path | None,
        balanced: Callable[[], bool] = lambda: False,
    ) -> None:
        self._irq_dir = irq_dir
        self._workqueue_dir = workqueue_dir
        self._balanced = balanced
        """Whether irqbalance places the interrupts now."""

    def owns(self, source: str) -> bool:
        """Interrupts and the workqueues are this kind's."""
        return source.startswith("irq/") or source == WORKQUEUE

    def sources(self, kinds: QuietKinds) -> list[str]:
        """The sources there are now, of the kinds asked for."""
        found = []
        if kinds.interrupts and self._irq_dir is not None and self._irq_dir.is_dir():
            numbers = [p.name for p in self._irq_dir.iterdir() if p.name.isdigit()]
            found += [irq_source(n) for n in sorted(numbers, key=int)]
            found.append(DEFAULT_AFFINITY)
        if kinds.unbound_work and self._workqueue_dir is not None:
            found.append(WORKQUEUE)
        return found

    def unavailable(self, kinds: QuietKinds) -> dict[str, str]:
        """The interrupts, if asked for and the host's ``/proc/irq`` is not there."""
        if kinds.interrupts and (self._irq_dir is None or not self._irq_dir.is_dir()):
            return {"interrupts": f"{self._irq_dir} is not there (NODEDRA_IRQ_DIR)"}
        return {}

    def original(self, source: str) -> frozenset[int] | None:
        """What the kernel has now: an interrupt's or the workqueues' CPUs."""
        return self.read(source)

    def reach(self, source: str) -> frozenset[int] | None:
        """The same as :meth:`original`: the kernel's files say where the work may run."""
        return self.read(source)

    def read(self, source: str) -> frozenset[int] | None:
        """The CPUs ``source`` may use now; None if it is gone (an interrupt freed)."""
        path, is_mask = self._file(source)
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        return parse_mask(text) if is_mask else parse_cpu_list(text.strip())

    def steer(self, originals: Mapping[str, frozenset[int]], allowed: frozenset[int]) -> Steered:
        """Narrow each source of ``originals`` to its original CPUs that are ``allowed``.

        Under irqbalance each interrupt is only moved off the CPUs that are not.
        """
        if not self._balanced():
            return steer_each(originals, allowed, self._write)
        placed = {s: c for s, c in originals.items() if is_interrupt(s)}
        steered = steer_each(
            {s: c for s, c in originals.items() if s not in placed}, allowed, self._write
        )
        for source, original in placed.items():
            self._evict(source, original, allowed, steered)
        return steered

    def _evict(
        self, source: str, original: frozenset[int], allowed: frozenset[int], steered: Steered
    ) -> None:
        """Move interrupt ``source`` off the CPUs not ``allowed``, if it may run there.

        It goes to those of its CPUs (else of its original) that are ``allowed``, and is kept
        where neither has one.
        """
        current = self.read(source)
        steered.reach[source] = current
        if current is None:
            return
        if current <= allowed:
            steered.narrowed.append(source)
            return
        target = (current & allowed) or (original & allowed)
        if not target:
            steered.kept.append(source)
            return
        reach, why = self._write(source, target)
        steered.reach[source] = reach
        if why is not None:
            steered.refused[source] = why
        else:
            steered.narrowed.append(source)

    def restore(self, originals: Mapping[str, frozenset[int]]) -> dict[str, str]:
        """Give each source its original CPUs back; the sources that refused, and why.

        An interrupt freed since has nothing to give back; a directory that is not there
        (the host's not mounted) refuses every source in it.
        """
        refused = {}
        for source in originals:
            directory = self._irq_dir if source.startswith("irq/") else self._workqueue_dir
            if directory is None or not directory.is_dir():
                refused[source] = f"{directory} is not there"
        there = {s: c for s, c in originals.items() if s not in refused}
        return refused | restore_each(there, self._write)

    def close(self) -> None:
        """Nothing is held open: each file is opened for one read or write."""

    def _write(self, source: str, cpus: frozenset[int]) -> Written:
        """Write ``cpus`` to ``source`` unless it has them already."""
        current = self.read(source)
        if current is None or current == cpus:
            return current, None
        path, is_mask = self._file(source)
        try:
            self._put(path, format_mask(cpus) if is_mask else format_cpu_list(cpus))
        except FileNotFoundError:
            return None, None
        except OSError as err:
            kept = " (the kernel keeps it where it is)" if err.errno == errno.EIO else ""
            return current, f"{err.strerror or err}{kept}"
        return cpus, None

    def _put(self, path: Path, text: str) -> None:
        """One write of ``text``, as the kernel wants it (OSError if it refuses)."""
        path.write_text(text)

    def describe(self, source: str) -> str:
        """``source`` for people: an interrupt with the devices it serves."""
        if is_interrupt(source) and self._irq_dir:
            number = source.removeprefix("irq/")
            devices = sorted(p.name for p in (self._irq_dir / number).glob("*") if p.is_dir())
            return f"IRQ {number} ({', '.join(devices) or 'no device'})"
        return source

    def _file(self, source: str) -> tuple[Path, bool]:
        """The file of ``source`` and whether it holds a hex mask (else a CPU list)."""
        if source == WORKQUEUE and self._workqueue_dir is not None:
            return self._workqueue_dir / "cpumask", True
        if source == DEFAULT_AFFINITY and self._irq_dir is not None:
            return self._irq_dir / "default_smp_affinity", True
        if source.startswith("irq/") and self._irq_dir is not None:
            return self._irq_dir / source.removeprefix("irq/") / "smp_affinity_list", False
        raise ValueError(f"no file for {source!r}")
