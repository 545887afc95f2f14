"""How a guest that stopped answering is described (tests/peers/vm_freeze.py), told from a
real QEMU started as the VM node starts it (under ``timeout``, with vm_freeze's options):
a machine held before its first instruction (nothing to boot, no guest code), then QEMU
itself stopped, then gone."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.peers.cluster import poll
from tests.peers.vm import QEMU
from tests.peers.vm_freeze import describe, monitor_report, qemu_options, qemu_pid
from tests.peers.vm_image import ensure_host_tools

CPUS = 2


@pytest.fixture
def held_machine(peer_workdir: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """QEMU (the child of ``timeout``) with a machine of CPUS virtual CPUs, held (-S)."""
    ensure_host_tools(sys.stderr)
    monitor = peer_workdir / "qmp.sock"
    argv = [
        "timeout", "-s", "KILL", "300",
        QEMU, "-nodefaults", "-no-user-config", "-display", "none",
        "-accel", "tcg,thread=multi", "-smp", str(CPUS), "-m", "64", "-S",
        *qemu_options(monitor),
    ]  # fmt: skip
    process = subprocess.Popen(argv, stderr=subprocess.DEVNULL)
    try:
        # The monitor answers once QEMU's main loop runs: the machine and its CPUs' threads
        # are made before it (its socket, earlier: a CI run described a QEMU whose threads
        # were not there yet).
        poll(
            lambda: monitor_report(monitor).startswith("machine prelaunch") or None,
            60,
            lambda: f"QEMU's monitor at {monitor} to answer",
        )
        yield process, monitor
    finally:
        _signal_qemu(process, signal.SIGKILL)  # timeout, killed, would leave QEMU running
        process.kill()
        process.wait()


def _signal_qemu(process: subprocess.Popen[bytes], signum: signal.Signals) -> bool:
    """Send QEMU (``timeout``'s child) ``signum``; False when it is not running."""
    pid = qemu_pid(process.pid)
    if pid is None:
        return False
    os.kill(pid, signum)
    return True


def test_a_held_machine_is_described_by_its_threads_and_its_monitor(
    held_machine: tuple[subprocess.Popen[bytes], Path],
) -> None:
    process, monitor = held_machine
    report = describe(process.pid, monitor)
    assert "QEMU's threads:" in report, report
    for cpu in range(CPUS):
        # Waiting to be let run: asleep, using no CPU.
        assert re.search(rf"^CPU {cpu}/TCG \[\d+\]: S, 0% of a CPU$", report, re.M), report
    assert "machine prelaunch" in report, report
    # Each virtual CPU at the reset vector (real mode: EIP); the first is to run from there,
    # the others are halted until it starts them.
    at_reset = re.findall(r"^CPU (\d+): IP=0*fff0 HLT=(\d)$", report, re.M)
    assert at_reset == [(str(cpu), "0" if cpu == 0 else "1") for cpu in range(CPUS)], report


def test_a_stopped_qemu_is_told_by_its_silent_monitor(
    held_machine: tuple[subprocess.Popen[bytes], Path],
) -> None:
    process, monitor = held_machine
    assert _signal_qemu(process, signal.SIGSTOP)
    try:
        report = describe(process.pid, monitor)
    finally:
        _signal_qemu(process, signal.SIGCONT)
    assert re.search(r"^CPU 0/TCG \[\d+\]: T, 0% of a CPU$", report, re.M), report
    assert "QEMU's monitor did not answer (timed out): its main loop may be stuck" in report


def test_a_qemu_that_is_gone_is_said_to_be(
    held_machine: tuple[subprocess.Popen[bytes], Path],
) -> None:
    process, monitor = held_machine
    assert _signal_qemu(process, signal.SIGKILL)
    poll(lambda: process.poll() is not None or None, 30, lambda: "timeout to end with QEMU")
    assert describe(process.pid, monitor) == "QEMU is not running"
