"""What the benchmarks ran on: hardware, kernel, toolchains and the code's version.

Numbers from a benchmark mean little without the machine; they mean even less without
knowing whether the machine was busy, so the load average is recorded too.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

import nodedra
from tests.peers.build import PeerBinaries
from tests.peers.peer_groups import kubernetes_version

ROOT = Path(__file__).resolve().parents[1]


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return match.group(1).strip() if match else platform.processor() or "unknown"


def _memory_bytes() -> int:
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return 0
    match = re.search(r"^MemTotal:\s+(\d+) kB", text, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else 0


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _go_version(binary: Path) -> str:
    """The Go release a binary was built with (``go version <binary>``), else the toolchain's."""
    built = _run(["go", "version", str(binary)])
    if built:
        return built.rsplit(" ", 1)[-1]
    return _run(["go", "env", "GOVERSION"]) or "unknown"


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (a busy machine skews every figure)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def describe(binaries: PeerBinaries) -> dict[str, Any]:
    """The machine and versions, as recorded in the results."""
    commit = _run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    dirty = bool(_run(["git", "-C", str(ROOT), "status", "--porcelain"]))
    return {
        "cpu_model": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "memory_gib": round(_memory_bytes() / 2**30, 1),
        "kernel": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "go": _go_version(binaries.go_driver),
        "kubernetes": kubernetes_version(),
        "nodedra": nodedra.__version__,
        "git_commit": (commit + ("+dirty" if dirty else "")) if commit else "unknown",
        "load_average_at_start": load_average(),
    }
