"""What a guest that stopped answering is doing, told from outside it.

Twice a TCG guest stopped dead with nothing on its console: once early in a boot, once
80 s after a cluster's guest had joined (its disk untouched from then on, no soft-lockup,
RCU-stall or hung-task line, each of which the kernel prints at a level ``quiet`` lets
through). Whether QEMU's virtual CPUs still run guest code or QEMU itself is stuck decides
where the fault is, so a guest that does not answer is described from this side: the state
and CPU time of each of QEMU's threads (sampled twice), and what QEMU's monitor (QMP) says of
the machine and each virtual CPU's instruction pointer.
"""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path
from typing import Any

#: How long the monitor may take to answer: a QEMU whose main loop is stuck never does.
QMP_TIMEOUT = 5.0
#: Between the two samples of the threads' CPU time.
SAMPLE_SECONDS = 2.0


def qemu_options(monitor: Path) -> list[str]:
    """What QEMU is started with so that it can be described: threads named for what they
    do ("CPU 0/TCG"), and its monitor on a Unix socket at ``monitor``."""
    return [
        "-name", "nodedra-vm,debug-threads=on",
        "-qmp", f"unix:{monitor},server=on,wait=off",
    ]  # fmt: skip


def qemu_pid(parent: int) -> int | None:
    """QEMU's pid: the child of ``timeout`` (the process the tests start)."""
    try:
        children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def _threads(pid: int) -> dict[str, tuple[str, int]]:
    """Each thread of ``pid``: name -> (state, user + system clock ticks)."""
    seen: dict[str, tuple[str, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        # The name is in parentheses and may hold spaces ("CPU 0/TCG").
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        seen[f"{name} [{task.name}]"] = (fields[0], int(fields[11]) + int(fields[12]))
    return seen


def threads_report(pid: int) -> str:
    """One line a thread: its state and the share of a host CPU it used over SAMPLE_SECONDS."""
    try:
        before = _threads(pid)
        time.sleep(SAMPLE_SECONDS)
        after = _threads(pid)
    except OSError as err:
        return f"QEMU's threads could not be read: {err}"
    ticks = SAMPLE_SECONDS * 100  # USER_HZ
    lines = [
        f"{name}: {state}, {100 * (used - before[name][1]) / ticks:.0f}% of a CPU"
        if name in before
        else f"{name}: {state}, new in the last {SAMPLE_SECONDS:g} s"
        for name, (state, used) in sorted(after.items())
    ]
    return "\n".join(lines)


class _Monitor:
    """A QMP session: one JSON object a line each way; events are skipped."""

    def __init__(self, path: Path) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(QMP_TIMEOUT)
        self._sock.connect(str(path))
        self._buffer = b""
        self._read()  # the greeting
        self.execute("qmp_capabilities")

    def _read(self) -> dict[str, Any]:
        while b"\n" not in self._buffer:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise OSError("the monitor closed its socket")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        message: dict[str, Any] = json.loads(line)
        return message

    def execute(self, command: str, **arguments: Any) -> Any:
        request = (
            {"execute": command, "arguments": arguments} if arguments else {"execute": command}
        )
        self._sock.sendall(json.dumps(request).encode() + b"\n")
        while True:
            answer = self._read()
            if "return" in answer:
                return answer["return"]
            if "error" in answer:
                raise OSError(f"{command}: {answer['error']}")

    def close(self) -> None:
        self._sock.close()


def monitor_report(path: Path) -> str:
    """The machine's run state and, for each virtual CPU, its instruction pointer and
    whether it is halted (idle), as QEMU's monitor gives them."""
    try:
        monitor = _Monitor(path)
    except (OSError, ValueError) as err:
        return f"QEMU's monitor did not answer ({err}): its main loop may be stuck"
    try:
        status = monitor.execute("query-status")
        registers = monitor.execute(
            "human-monitor-command", **{"command-line": "info registers -a"}
        )
    except (OSError, ValueError) as err:
        return f"QEMU's monitor stopped answering ({err}): its main loop may be stuck"
    finally:
        monitor.close()
    # RIP in long mode, EIP before it (a CPU still in real or protected mode).
    cpus = [
        f"CPU {n}: IP={ip} HLT={halted}"
        for n, (ip, halted) in enumerate(
            re.findall(r"[RE]IP=([0-9a-f]+) [^\n]*HLT=(\d)", str(registers))
        )
    ]
    return "\n".join([f"machine {status.get('status')}", *cpus])


def describe(parent: int, monitor: Path) -> str:
    """What QEMU (started as ``parent``'s child) and its virtual CPUs are doing."""
    pid = qemu_pid(parent)
    if pid is None:
        return "QEMU is not running"
    return f"QEMU's threads:\n{threads_report(pid)}\nQEMU's monitor:\n{monitor_report(monitor)}"
