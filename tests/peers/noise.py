"""The noise probe on the VM node: how quiet a claimed CPU is while the node is loaded.

Inside the guest only (never on the test machine: its interrupts and tasks are shared with
other work). For one window, with the node loaded, :func:`measure`:

- starts the load: one spinning transient service per CPU in ``system.slice`` (host daemons),
  a disk reader (``dd`` with O_DIRECT: the virtio disk's interrupts) and TCP connections to the
  API server from nodedra's own container (a pod on the shared pool: the NIC's interrupts);
- runs ``workload noise SECONDS`` (tests/peers/workloads/cmd/workload/noise.go) in the claim's
  container with ``ctr task exec``, so it runs where the claim's container does;
- records on that CPU, with the kernel's tracer (``sched_switch`` on that CPU alone, on the
  ``mono`` clock the probe's window is given in), every task that ran there but the probe and
  the idle task, and for how long; and ``/proc/interrupts`` before and after, per line.

Per-CPU kernel threads bound to that CPU (``ksoftirqd/2``, ``kworker/2:1``, ``migration/2``)
are counted apart: the kernel needs them there, and they are named.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.peers.pods import container_id
from tests.peers.vm_cluster import CTR, VMCluster

TRACING = "/sys/kernel/tracing"
LOAD_UNITS = "nodedra-noise-*"
"""The load's units (transient, in system.slice), stopped after each window."""
DISK_READER = (
    "while :; do dd if=/dev/vda of=/dev/null bs=64k count=256 iflag=direct 2>/dev/null; done"
)
#: TCP connections to the API server for a while, run by Python in nodedra's container (one
#: line: the guest's shell passes it on as one argument).
NETWORK = (
    "import itertools, os, socket, time; "
    'host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]; '
    "end = time.monotonic() + {seconds}; "
    "[socket.create_connection((host, int(port)), 5).close() for _ in "
    "itertools.takewhile(lambda _: time.monotonic() < end, itertools.count())]"
)
OWN = frozenset({"workload"})
"""The claim's container's processes (its command and the probe): not foreign there."""


@dataclass
class Window:
    """What ran on the claimed CPU during one probe window."""

    cpu: int
    probe: dict[str, Any]
    """The probe's report (noise.go): iterations, max_gap_ns, gaps_over, switches."""
    device_interrupts: dict[str, int] = field(default_factory=dict)
    """Device interrupts delivered to the CPU, by line of ``/proc/interrupts`` (``24 vda``)."""
    other_interrupts: dict[str, int] = field(default_factory=dict)
    """The CPU's own (the local timer, IPIs: LOC, RES, CAL, TLB...), by line."""
    foreign: dict[str, float] = field(default_factory=dict)
    """Tasks that ran on the CPU in the window, neither the probe nor idle: ms, by name."""
    kernel_threads: dict[str, float] = field(default_factory=dict)
    """Of those, kernel threads (PF_KTHREAD, still there after the window): ms, by name."""
    cpu_kernel_threads: dict[str, float] = field(default_factory=dict)
    """Of those, the CPU's own (bound to it: ``ksoftirqd/2``...): ms, by name."""
    load_interrupts: dict[str, int] = field(default_factory=dict)
    """Device interrupts on every CPU in the window: the load's evidence."""

    def summary(self) -> dict[str, Any]:
        """The figures, for people and for bench/results."""
        return {
            "cpu": self.cpu,
            "seconds": (self.probe["end_ns"] - self.probe["start_ns"]) / 1e9,
            "device_interrupts": sum(self.device_interrupts.values()),
            "device_interrupts_by_line": self.device_interrupts,
            "other_interrupts": self.other_interrupts,
            "foreign_tasks_ms": round(sum(self.foreign.values()), 3),
            "foreign_tasks": self.foreign,
            "kernel_threads_ms": round(sum(self.kernel_threads.values()), 3),
            "kernel_threads": self.kernel_threads,
            "cpu_kernel_threads_ms": round(sum(self.cpu_kernel_threads.values()), 3),
            "probe_involuntary_switches": self.probe["involuntary_switches"],
            "probe_max_gap_us": round(self.probe["max_gap_ns"] / 1000, 1),
            "probe_gaps_over": self.probe["gaps_over"],
            "load_device_interrupts": sum(self.load_interrupts.values()),
        }


def interrupts(text: str) -> tuple[list[int], dict[str, list[int]]]:
    """``/proc/interrupts``: the CPUs of its columns, and each line's counts by column.

    A line is named by its first field and, for devices, its last (``24 virtio1-req.0``).
    """
    lines = text.splitlines()
    cpus = [int(name.removeprefix("CPU")) for name in lines[0].split()]
    counts = {}
    for line in lines[1:]:
        fields = line.split()
        if not fields or not fields[0].endswith(":"):
            continue
        number = fields[0].removesuffix(":")
        values = [int(v) for v in fields[1 : 1 + len(cpus)] if v.isdigit()]
        if len(values) < len(cpus):
            continue  # ERR:, MIS: (one total)
        name = f"{number} {fields[-1]}" if number.isdigit() else number
        counts[name] = values
    return cpus, counts


def interrupt_deltas(
    before: str, after: str, cpu: int
) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """(device interrupts on ``cpu``, the CPU's own on it, device interrupts on every CPU)."""
    cpus, first = interrupts(before)
    _, second = interrupts(after)
    column = cpus.index(cpu)
    devices: dict[str, int] = {}
    own: dict[str, int] = {}
    everywhere: dict[str, int] = {}
    for name, values in second.items():
        old = first.get(name, [0] * len(values))
        delta = values[column] - old[column]
        total = sum(values) - sum(old)
        device = name.split()[0].isdigit()
        if device and total:
            everywhere[name] = total
        if delta:
            (devices if device else own)[name] = delta
    return devices, own, everywhere


SWITCH = re.compile(
    r"\s(?P<ts>\d+\.\d+): sched_switch: prev_comm=(?P<prev>.+?) prev_pid=(?P<prev_pid>\d+) "
    r".*==> next_comm=(?P<next>.+?) next_pid=(?P<next_pid>\d+) "
)


def ran_on_cpu(trace: str, start_ns: int, end_ns: int) -> dict[tuple[str, int], float]:
    """Milliseconds each task (name, pid) ran in [start, end], from sched_switch events of one
    CPU: from the switch to it to the switch away, cut to the window. The claim container's
    own processes (:data:`OWN`) and the idle task (pid 0) are left out."""
    ran: dict[tuple[str, int], float] = {}
    current: tuple[str, int] | None = None
    since = start_ns
    for match in SWITCH.finditer(trace):
        seconds, fraction = match["ts"].split(".")
        at = int(seconds) * 1_000_000_000 + int(fraction.ljust(9, "0"))
        prev = (match["prev"], int(match["prev_pid"]))
        if current is None:
            current = prev
        stop = min(max(at, start_ns), end_ns)
        if stop > since and _foreign(current):
            ran[current] = ran.get(current, 0.0) + (stop - since) / 1e6
        current = (match["next"], int(match["next_pid"]))
        since = stop
    if current is not None and end_ns > since and _foreign(current):
        ran[current] = ran.get(current, 0.0) + (end_ns - since) / 1e6
    return ran


def _foreign(task: tuple[str, int]) -> bool:
    return task[1] != 0 and task[0] not in OWN


def is_cpu_kernel_thread(name: str, cpu: int) -> bool:
    """A kernel thread bound to ``cpu`` by its name: ``ksoftirqd/2``, ``kworker/2:1H``..."""
    return re.search(rf"/{cpu}(?::\d+H?)?$", name) is not None


def measure(cluster: VMCluster, container: str, cpu: int, seconds: float) -> Window:
    """One probe window of ``seconds`` in ``container`` (pinned to ``cpu``), the node loaded."""
    online = int(cluster.vm.run("nproc --all").check())
    spinners = "\n".join(
        f"systemd-run --quiet --unit=nodedra-noise-spin-{i} sh -c 'while :; do :; done'"
        for i in range(online)
    )
    (nodedra,) = cluster.nodedra_pods()
    nodedra_container = container_id(nodedra, "nodedra")
    network = NETWORK.format(seconds=seconds + 5)
    script = f"""
set -e
T={TRACING}
[ -e $T/trace ] || mount -t tracefs nodev $T
echo 0 > $T/tracing_on
echo mono > $T/trace_clock
printf '%x' {1 << cpu} > $T/tracing_cpumask
echo > $T/trace
echo 1 > $T/events/sched/sched_switch/enable
{spinners}
systemd-run --quiet --unit=nodedra-noise-disk sh -c '{DISK_READER}'
{CTR} task exec --exec-id noise-net-$$ {nodedra_container} python -c '{network}' &
sleep 1
cat /proc/interrupts > /tmp/noise-before
echo 1 > $T/tracing_on
{CTR} task exec --exec-id noise-$$ {container} /workload noise {seconds} > /tmp/noise-probe
echo 0 > $T/tracing_on
cat /proc/interrupts > /tmp/noise-after
systemctl stop '{LOAD_UNITS}'
wait || true
echo 0 > $T/events/sched/sched_switch/enable
printf '%x' {(1 << online) - 1} > $T/tracing_cpumask
cat /tmp/noise-probe; echo ===; cat /tmp/noise-before; echo ===; cat /tmp/noise-after; echo ===
grep sched_switch $T/trace || true
echo > $T/trace
"""
    try:
        output = cluster.vm.run(script, timeout=seconds + 180).check()
    finally:
        cluster.vm.run(f"systemctl stop '{LOAD_UNITS}' 2>/dev/null; true")
    probe_text, before, after, trace = output.split("===\n")
    probe = json.loads(probe_text)
    if probe["cpu"] != cpu:
        raise AssertionError(f"the probe ran on CPU {probe['cpu']}, not the claim's {cpu}")
    devices, own, everywhere = interrupt_deltas(before, after, cpu)
    window = Window(cpu, probe, devices, own, load_interrupts=everywhere)
    ran = ran_on_cpu(trace, probe["start_ns"], probe["end_ns"])
    kernel = kernel_threads(cluster, {pid for _, pid in ran})
    for (name, pid), ms in ran.items():
        key = f"{name}[{pid}]"
        window.foreign[key] = round(ms, 3)
        if pid in kernel:
            window.kernel_threads[key] = round(ms, 3)
            if is_cpu_kernel_thread(name, cpu):
                window.cpu_kernel_threads[key] = round(ms, 3)
    return window


PF_KTHREAD = 0x00200000
"""The flag of a kernel thread in ``/proc/<pid>/stat`` (field 9)."""


def kernel_threads(cluster: VMCluster, pids: set[int]) -> set[int]:
    """Which of ``pids`` are kernel threads in the guest (one that has exited is not known
    as one: counted as a user-space task)."""
    if not pids:
        return set()
    listing = " ".join(f"/proc/{pid}/stat" for pid in sorted(pids))
    output = cluster.vm.run(f"cat {listing} 2>/dev/null; true").check()
    found = set()
    for line in output.splitlines():
        pid, _, rest = line.partition(" (")
        fields = rest.rsplit(") ", 1)[-1].split()
        if int(fields[6]) & PF_KTHREAD:
            found.add(int(pid))
    return found


def _gaps(summary: Mapping[str, Any]) -> str:
    over = summary["probe_gaps_over"]
    return f"{over['10us']} / {over['100us']} / {over['1ms']}"


ROWS: tuple[tuple[str, Callable[[Mapping[str, Any]], object]], ...] = (
    ("device interrupts on the CPU", lambda s: s["device_interrupts"]),
    ("tasks but the claim's on the CPU, ms", lambda s: s["foreign_tasks_ms"]),
    ("of which kernel threads, ms", lambda s: s["kernel_threads_ms"]),
    ("of which the CPU's own kernel threads, ms", lambda s: s["cpu_kernel_threads_ms"]),
    ("the probe's involuntary context switches", lambda s: s["probe_involuntary_switches"]),
    ("the probe's longest gap, µs", lambda s: s["probe_max_gap_us"]),
    ("the probe's gaps over 10 µs / 100 µs / 1 ms", _gaps),
    ("device interrupts on every CPU (the load)", lambda s: s["load_device_interrupts"]),
)
"""The table's rows: a title and how a window's summary gives it."""


def write_results(directory: Path, windows: Mapping[str, Window], about: Mapping[str, Any]) -> None:
    """``quiet.json`` (every figure) and ``quiet.md`` (the windows side by side)."""
    summaries = {name: window.summary() for name, window in windows.items()}
    directory.mkdir(parents=True, exist_ok=True)
    data = {**about, "windows": summaries}
    (directory / "quiet.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    names = list(summaries)
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for title, value in ROWS:
        lines.append(f"| {title} | " + " | ".join(str(value(summaries[n])) for n in names) + " |")
    lines.append("")
    for name in names:
        summary = summaries[name]
        lines.append(
            f"- {name}: tasks {summary['foreign_tasks'] or 'none'}; device interrupts "
            f"{summary['device_interrupts_by_line'] or 'none'}"
        )
    (directory / "quiet.md").write_text("\n".join(lines) + "\n")
