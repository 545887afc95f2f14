"""Keeping the host's work off the CPUs that claims hold, as claims come and go.

Opt-in per node (the configuration's ``quietCPUs``): device interrupts, unbound kernel work
(:mod:`nodedra.quiet.kernelwork`) and the host's processes (:mod:`nodedra.quiet.slices`) are
narrowed to the CPUs no claim holds. A thread of
its own makes the writes, off the kubelet's time, whenever the committed claims change and
whenever the configuration does; turning a kind off gives its sources back at once.

Crash safety. Before a source is first written, its original CPUs go into a record in the
state directory, with the boot's id: what nodedra writes back at release is always the
original, never something it wrote itself. A nodedra killed while claims hold CPUs leaves the
sources narrowed (as good as they were); the next start reads the record and goes on from the
originals it holds, and ``nodedra cleanup`` (uninstalling) writes them back. A reboot gives
the kernel its defaults again, so a record of another boot is dropped unread.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nodedra.lib.durable import replace_file
from nodedra.topology.cpulist import format_cpu_list, parse_cpu_list

from .work import HostWork, QuietKinds, Steered

log = logging.getLogger(__name__)

RECORD = "quiet-cpus.json"
"""The record of the sources' originals, in the state directory."""
PERIOD = 10.0
"""Seconds between two passes when nothing changed: interrupts set up since (a device
hot-plugged) are steered too, and a source someone else widened again is narrowed again
(the old instance of a rolling update gives everything back as it stops)."""


BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
"""The running kernel's boot id: the host's, in a container too."""


def read_boot_id(path: Path = BOOT_ID) -> str:
    """The id of this boot."""
    return path.read_text().strip()


def read_record(path: Path, boot_id: str) -> dict[str, frozenset[int]]:
    """The originals of ``path`` if this boot wrote it; {} if none (or another boot's)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    if data.get("bootId") != boot_id:
        log.info("%s is of another boot: the kernel's sources are as it set them", path)
        return {}
    return {source: parse_cpu_list(cpus) for source, cpus in data["originals"].items()}


def write_record(path: Path, boot_id: str, originals: Mapping[str, frozenset[int]]) -> None:
    """Record ``originals``, or remove the record if there are none.

    A process crash leaves the old record or this one whole; a power cut needs neither,
    since the next boot starts from the kernel's defaults.
    """
    if not originals:
        path.unlink(missing_ok=True)
        return
    data = {
        "bootId": boot_id,
        "originals": {source: format_cpu_list(cpus) for source, cpus in originals.items()},
    }
    replace_file(path, json.dumps(data, indent=1).encode(), survive_power_cut=False)


class QuietKeeper:
    """Steers the sources of ``work`` as ``kinds()`` asks, off the CPUs of ``claimed()``."""

    def __init__(
        self,
        work: HostWork,
        record: Path,
        boot_id: str,
        *,
        online: frozenset[int],
        claimed: Callable[[], frozenset[int]],
        kinds: Callable[[], QuietKinds],
        on_status: Callable[[], None] = lambda: None,
    ) -> None:
        self._work = work
        self._record = record
        self._boot_id = boot_id
        self._online = online
        self._claimed = claimed
        self._kinds = kinds
        self._on_status = on_status
        """Called when :meth:`status` changed (the ``/status`` copy takes it)."""
        self._originals: dict[str, frozenset[int]] = {}
        self._status: dict[str, Any] = {}
        self._due = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._mu = threading.Lock()
        """Held by a pass over the sources: one at a time."""
        self._broken = ""
        """Why nothing is steered (a record that cannot be read), if so."""
        self.passes = 0
        """Passes over the sources made (:meth:`update`)."""
        self.pass_seconds = 0.0
        """The time they took: how long after a claim's change its CPUs are quiet."""

    def start(self) -> None:
        """Take over what an earlier instance of this boot recorded, then steer.

        A record that cannot be read is left as it is and nothing is steered (what the
        sources had before is in it): ``/status`` and the log say why.
        """
        try:
            self._originals = read_record(self._record, self._boot_id)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            self._broken = (
                f"cannot read {self._record}: {err}; nothing is steered until it is fixed "
                "or removed"
            )
            log.error("quietCPUs: %s", self._broken)
            self._status = {"error": self._broken}
            return
        self._thread = threading.Thread(target=self._run, name="quiet-cpus", daemon=True)
        self._thread.start()
        self.request_update()

    def request_update(self) -> None:
        """The claims or the configuration changed: steer again soon."""
        self._due.set()

    def stop(self) -> None:
        """Give every source its original back and forget the record (if started)."""
        if self._thread is None:
            return  # never started: the record, if any, is another instance's to act on
        self._stopping = True
        self._due.set()
        self._thread.join(timeout=30)
        with self._mu:
            self._originals = self._give_back(self._originals)
            write_record(self._record, self._boot_id, self._originals)
            self._work.close()

    def update(self) -> Steered:
        """One pass over the sources.

        Give back those of kinds turned off (or gone), record the originals of new ones,
        then narrow every source recorded to the CPUs no claim holds. A source that could
        not be given back stays on record, and is tried again at the next pass.
        """
        with self._mu:
            if self._broken:
                return Steered()
            started = time.monotonic()
            kinds = self._kinds()
            wanted = set(self._work.sources(kinds))
            off = {s: cpus for s, cpus in self._originals.items() if s not in wanted}
            if off:
                kept = self._give_back(off)
                self._originals = {
                    s: c for s, c in self._originals.items() if s in wanted or s in kept
                }
            new = {}
            for source in sorted(wanted - set(self._originals)):
                cpus = self._work.original(source)
                if cpus is not None:
                    new[source] = cpus
            if off or new or (self._originals and not self._record.exists()):
                # Also when another instance removed it (the old one of a rolling update,
                # stopping): what is narrowed must always be on record.
                write_record(self._record, self._boot_id, self._originals | new)
                self._originals |= new
            claimed = self._claimed()
            steered = self._work.steer(
                {s: c for s, c in self._originals.items() if s in wanted}, self._online - claimed
            )
            status = self._report(kinds, claimed, steered)
            if status != self._status:
                for left in status["left"]:
                    log.info(
                        "%s still may run on CPUs %s: %s", left["source"], left["cpus"], left["why"]
                    )
                self._status = status
                self._on_status()
            self.passes += 1
            self.pass_seconds += time.monotonic() - started
            return steered

    def status(self) -> dict[str, Any]:
        """For ``/status``: the kinds kept off claimed CPUs, and what is left on them.

        ``left`` names each source that may still run on a claimed CPU, on which, and why:
        the host refused to move it, or what it was allowed before has no CPU outside the
        claims (nodedra only narrows). ``unavailable`` names each kind turned on that this
        node cannot steer, and why.
        """
        return self._status

    def _report(
        self, kinds: QuietKinds, claimed: frozenset[int], steered: Steered
    ) -> dict[str, Any]:
        left = []
        for source in self._originals:
            # Read again only those not written in this pass (given back, kept on record).
            cpus = steered.reach[source] if source in steered.reach else self._work.reach(source)
            on_claims = (cpus or frozenset()) & claimed
            if not on_claims:
                continue
            why = steered.refused.get(source) or "allowed no CPU outside the claims before"
            left.append(
                {
                    "source": self._work.describe(source),
                    "cpus": format_cpu_list(on_claims),
                    "why": why,
                }
            )
        return {
            "interrupts": kinds.interrupts,
            "unboundWork": kinds.unbound_work,
            "hostProcesses": kinds.host_processes,
            "unavailable": self._work.unavailable(kinds),
            "claimed": format_cpu_list(claimed),
            "sources": len(self._originals),
            "left": left,
        }

    def _give_back(self, originals: Mapping[str, frozenset[int]]) -> dict[str, frozenset[int]]:
        """Give ``originals`` back; those that could not be (kept on record)."""
        refused = self._work.restore(originals)
        for source, why in refused.items():
            log.warning("could not give %s its CPUs back: %s", self._work.describe(source), why)
        return {s: originals[s] for s in refused}

    def _run(self) -> None:
        while True:
            self._due.wait(PERIOD)
            self._due.clear()
            if self._stopping:
                return
            try:
                self.update()
            except Exception:
                log.exception("keeping host work off the claimed CPUs failed; tried again later")
