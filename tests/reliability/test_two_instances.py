"""Two nodedra processes share one node's state for thousands of requests, as during a
rolling update: no acknowledged claim is lost, no CPU is ever held by two claims.

One process prepares and unprepares its claims in a loop; the other does too, and between
its requests reads the books through every path that does not take the instance lock (the
committed view, the CPU map, a runtime event's lock, the metrics), which is where a read
could meet the other's commit half written. Each process logs when each of its claims
surely held its CPU; the test checks that no two claims' times on one CPU overlap, and
that the checkpoint both leave behind holds exactly the claims acknowledged and not
released.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodedra.resmgr import Checkpoint
from nodedra.resmgr.checkpoint import FILE_NAME
from nodedra.topology import parse_cpu_list
from tests.reliability.helpers import ROOT, short_dir

ROUNDS = 5000
"""Requests per process."""
NODE = [sys.executable, "-m", "tests.reliability.sharing_node"]


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_dir("nd-two-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_both(root: Path) -> dict[str, list[dict[str, Any]]]:
    """Both processes, started together; each one's JSON lines once both ended."""
    roles = {"pod-writes": [], "pod-reads": ["--reader"]}
    processes = {
        uid: subprocess.Popen(
            [*NODE, str(root), uid, str(ROUNDS), str(seed), *extra],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed, (uid, extra) in enumerate(roles.items())
    }
    lines = {}
    for uid, process in processes.items():
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, f"{uid} failed:\n{err[-3000:]}"
        lines[uid] = [json.loads(line) for line in out.splitlines()]
        assert lines[uid][-1] == {"event": "stopped"}, f"{uid} did not stop cleanly"
    return lines


def test_two_instances_never_lose_a_claim_nor_grant_a_cpu_twice(root: Path) -> None:
    lines = run_both(root)
    held: dict[str, tuple[float, frozenset[int]]] = {}
    """Claim -> since when it surely held which CPUs."""
    times: dict[int, list[tuple[float, float, str]]] = {}
    """CPU -> when each claim surely held it."""
    for instance in lines.values():
        failed = [line for line in instance if "unprepare_failed" in line]
        assert failed == [], "an unprepare failed"
        for line in instance:
            if "prepared" in line:
                held[line["prepared"]] = (line["at"], frozenset(parse_cpu_list(line["cpus"])))
            elif "unpreparing" in line:
                since, cpus = held.pop(line["unpreparing"])
                for cpu in cpus:
                    times.setdefault(cpu, []).append((since, line["at"], line["unpreparing"]))
    for uid, (since, cpus) in held.items():
        for cpu in cpus:
            times.setdefault(cpu, []).append((since, float("inf"), uid))
    for cpu, spans in times.items():
        spans.sort()
        for (_, end, first), (start, _, second) in itertools.pairwise(spans):
            assert end <= start, f"CPU {cpu} was held by claims {first} and {second} at once"

    saved = Checkpoint(root / "state" / FILE_NAME).load()
    assert saved is not None
    assert set(saved.claims) == set(held), "the checkpoint left lost or kept claims"
    prepared = sum(1 for instance in lines.values() for line in instance if "prepared" in line)
    assert prepared > ROUNDS // 2, "too few claims were prepared to tell anything"
