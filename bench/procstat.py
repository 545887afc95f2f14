"""CPU time and memory of a process, read from /proc (no dependency beyond Linux).

Benchmarks compare processes that live side by side on one small machine, so the figures
must be per process: CPU time is the process's own user + system time (all its threads),
RSS is its resident set now, and a sampler thread catches the peak in between.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
MIB = 1024 * 1024


@dataclass(frozen=True)
class Usage:
    """What a process has used so far, at one moment."""

    cpu_seconds: float
    """User + system CPU time since the process started, all threads."""
    rss_bytes: int
    """Resident set size now."""
    hwm_bytes: int
    """The largest resident set size the process ever had (VmHWM)."""
    at: float
    """time.monotonic() when read."""


def usage(pid: int) -> Usage:
    """The usage of process ``pid`` now; OSError if it is gone."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        stat = f.read()
    # The command name (field 2) may hold spaces and parentheses: split after the last ")".
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])
    rss = hwm = 0
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
    return Usage((utime + stime) / CLOCK_TICKS, rss, hwm, time.monotonic())


@dataclass(frozen=True)
class Window:
    """What a process used over a stretch of time."""

    seconds: float
    cpu_seconds: float
    rss_start: int
    rss_end: int
    rss_peak: int
    """The largest RSS sampled in the window (sampling every ``interval``)."""
    rss_mean: float

    @property
    def cpu_percent(self) -> float:
        """CPU time as a share of one core over the window."""
        return 100.0 * self.cpu_seconds / self.seconds if self.seconds > 0 else 0.0

    def as_json(self) -> dict[str, float]:
        """The window in the units the results use (seconds, MiB, percent of one core)."""
        return {
            "seconds": round(self.seconds, 3),
            "cpu_seconds": round(self.cpu_seconds, 3),
            "cpu_percent": round(self.cpu_percent, 2),
            "rss_start_mib": round(self.rss_start / MIB, 1),
            "rss_end_mib": round(self.rss_end / MIB, 1),
            "rss_peak_mib": round(self.rss_peak / MIB, 1),
            "rss_mean_mib": round(self.rss_mean / MIB, 1),
        }


class Sampler:
    """Samples one process's RSS in a thread while a ``with`` block runs.

    CPU time needs no sampling (the kernel accumulates it); RSS does, because a peak
    in the middle of a window is what a memory limit would hit.
    """

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.pid = pid
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._first: Usage | None = None
        self._samples: list[int] = []
        self.window: Window | None = None

    def __enter__(self) -> Sampler:
        self._first = usage(self.pid)
        self._samples = [self._first.rss_bytes]
        self._thread = threading.Thread(target=self._run, name=f"sampler-{self.pid}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._samples.append(usage(self.pid).rss_bytes)
            except OSError:
                return

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if exc_type is not None or self._first is None:
            return
        last = usage(self.pid)
        samples = [*self._samples, last.rss_bytes]
        self.window = Window(
            seconds=last.at - self._first.at,
            cpu_seconds=last.cpu_seconds - self._first.cpu_seconds,
            rss_start=self._first.rss_bytes,
            rss_end=last.rss_bytes,
            rss_peak=max(samples),
            rss_mean=sum(samples) / len(samples),
        )

    def result(self) -> Window:
        """The window measured by the finished ``with`` block."""
        if self.window is None:
            raise RuntimeError("the sampler has not finished a window")
        return self.window


def measure(pid: int, seconds: float, interval: float = 0.1) -> Window:
    """Sample process ``pid`` for ``seconds`` while it does whatever it does."""
    with Sampler(pid, interval) as sampler:
        time.sleep(seconds)
    return sampler.result()


def wait_quiet(
    pid: int, *, window: float = 2.0, max_cpu: float = 0.04, timeout: float = 60.0
) -> float:
    """Wait until the process used less than ``max_cpu`` CPU seconds over ``window`` seconds.

    How benchmarks tell that a process has finished reacting to something (start-up, a
    burst of watch events) without guessing a fixed delay. Returns the seconds waited;
    on timeout returns as well (the caller records how long it took, noise included).
    """
    started = time.monotonic()
    last = usage(pid)
    while time.monotonic() - started < timeout:
        time.sleep(window)
        now = usage(pid)
        if now.cpu_seconds - last.cpu_seconds < max_cpu:
            break
        last = now
    return time.monotonic() - started


def settle(pids: Iterable[int], seconds: float, timeout: float = 60.0) -> float:
    """Let processes finish start-up (or a burst): each until quiet, then ``seconds`` more.

    Returns the seconds waited.
    """
    started = time.monotonic()
    for pid in pids:
        wait_quiet(pid, timeout=timeout)
    time.sleep(seconds)
    return time.monotonic() - started


def _busy_seconds() -> float:
    """CPU seconds the whole machine spent busy since boot (all cores, /proc/stat)."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


def _descendants(root: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def _own_seconds() -> float:
    """CPU seconds of this process and every process it started (running or reaped)."""
    times = os.times()
    total = times.user + times.system + times.children_user + times.children_system
    for pid in _descendants(os.getpid()):
        try:
            total += usage(pid).cpu_seconds
        except OSError:
            continue
    return total


class Noise:
    """How much CPU processes other than the benchmark's took while it ran.

    The benchmarks share the machine with whatever else runs on it; on 2 cores a test
    suite running beside them moves every figure. This says how much of that there was,
    so a reader can tell a quiet run from a noisy one.
    """

    def __init__(self) -> None:
        self._at = time.monotonic()
        self._busy = _busy_seconds()
        self._own = _own_seconds()

    def result(self) -> dict[str, float]:
        """Other processes' CPU over the time since creation, in cores and seconds."""
        seconds = time.monotonic() - self._at
        foreign = max(0.0, (_busy_seconds() - self._busy) - (_own_seconds() - self._own))
        return {
            "seconds": round(seconds, 1),
            "other_cpu_seconds": round(foreign, 1),
            "other_cores_busy": round(foreign / seconds, 2) if seconds > 0 else 0.0,
        }
