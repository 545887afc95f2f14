"""Where the generated sysfs trees are, and the names of their shapes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "sysfs"
"""tests/fixtures/sysfs: generate.py and one tree per shape."""

GENERATOR = FIXTURES / "generate.py"

SHAPES = (
    "epyc-2s-nps1",
    "epyc-2s-nps4",
    "hybrid-pe",
    "offline-cpus",
    "single-socket-nosmt",
    "snc-memory-only",
    "two-socket-smt2-numa4",
    "vm-nonuma-legacy",
)

CopyTree = Callable[[str], Path]
"""The sysfs_copy fixture: copies the named shape's tree somewhere writable, returns its root."""
