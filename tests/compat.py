"""The compatibility runs (``tox -e compat``): the integration tests at the other Kubernetes
releases, and with every DRA gate that is not GA off.

    python -m tests.compat               # every run
    python -m tests.compat -- -x -q      # pytest's arguments, passed to each run

Which tests run where (tests/peers/README.md says why): at every release but the newest, the
tests that talk to the control plane or the kubelet's DRA code (``TESTS``) with every gate
nodedra uses, and their core (``GA_CORE``) with only GA DRA; at the oldest, also the real
node's core (``NODE_CORE``); at the newest, ``TESTS`` and the static policy's pinning with
only GA DRA.

A run without a real node leaves the CPUs mostly idle (it waits on a control plane), so up
to ``PARALLEL`` of them run at once, each a pytest process of its own with its own network
namespace and temporary directory, its output kept until it ends and printed then. The runs
with a real node come after them, one at a time: their nodes share the machine's cgroups.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tests.peers.peer_groups import KUBERNETES_VERSIONS, OLDEST_NODE_RELEASE
from tests.peers.profile import GATES_ENV, KUBERNETES_ENV

TESTS = (
    "tests/integration/test_peers_smoke.py",
    "tests/integration/test_slices_real.py",
    "tests/integration/test_plugin_integration.py",
    "tests/integration/test_claim_api_real.py",
    "tests/integration/test_operator.py",
    "tests/integration/test_node_allocatable.py",
    "tests/integration/test_whole_cores.py",
    "tests/integration/test_wide_claims.py",
    # The NUMA attribute beside another driver's device: the scalar, and the list's fallback.
    "tests/integration/test_numa_attribute.py",
    # docs/lifecycle.md's feature gates for each release, against its API server.
    "tests/integration/test_lifecycle.py::test_the_gates_are_those_of_this_release",
)
#: With only GA DRA at the older releases: registration, publication, prepare, the node's
#: allocatable and device health.
GA_CORE = (
    "tests/integration/test_peers_smoke.py",
    "tests/integration/test_plugin_integration.py",
    "tests/integration/test_node_allocatable.py",
)
#: The real node's core at the oldest release: a pinned pod beside the shared pool, nodedra
#: killed, the kubelet and containerd restarted.
NODE_CORE = (
    "tests/integration/test_node_pinning.py",
    "-k",
    "containerd-v2.4.2 and (runs_on_the_cpus or SIGKILL or kubelet)",
)
#: The static policy's pinning with only GA DRA, at the newest release.
NODE_GA = ("tests/integration/test_node_pinning.py", "-k", "containerd-v2.4.2 and static")

#: How many runs without a real node at once.
PARALLEL = 3


@dataclass(frozen=True)
class Run:
    """One pytest process: a release, a gate mode and what to run."""

    release: str
    only_ga: bool
    what: str
    """Which of the lists above, in words."""
    args: tuple[str, ...]
    node: bool = False

    @property
    def name(self) -> str:
        return f"{self.release}, {'only GA DRA' if self.only_ga else 'every gate'}: {self.what}"

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in (KUBERNETES_ENV, GATES_ENV)}
        env[KUBERNETES_ENV] = self.release
        if self.only_ga:
            env[GATES_ENV] = "ga"
        return env


def runs() -> list[Run]:
    """Every compatibility run, in the order of KUBERNETES_VERSIONS after the newest (the
    order tox's py311 builds their peers in), then the newest's."""
    newest, *older = KUBERNETES_VERSIONS
    found = []
    for release in older:
        found += [Run(release, False, "tests", TESTS), Run(release, True, "GA core", GA_CORE)]
        if release == OLDEST_NODE_RELEASE:
            found.append(Run(release, False, "the real node's core", NODE_CORE, node=True))
    return [
        *found,
        Run(newest, True, "tests", TESTS),
        Run(newest, True, "the real node, static policy", NODE_GA, node=True),
    ]


@dataclass(frozen=True)
class Outcome:
    run: Run
    returncode: int
    seconds: float
    output: str


def _pytest(run: Run, pytest_args: Sequence[str], basetemp: Path) -> Outcome:
    command = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--basetemp={basetemp}",
        *run.args, *pytest_args,
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(
        command,
        check=False,
        env=run.environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return Outcome(run, done.returncode, time.monotonic() - started, done.stdout)


def _report(outcome: Outcome) -> None:
    print(f"\n===== compat: {outcome.run.name} =====", flush=True)
    print(outcome.output, end="", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.compat", description=__doc__)
    parser.add_argument("pytest_args", nargs="*", help="passed to each pytest run")
    args = parser.parse_args(argv)
    every = runs()
    started = time.monotonic()
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="nodedra-compat-") as tmp:
        basetemps = {run: Path(tmp) / f"run-{i}" for i, run in enumerate(every)}
        with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
            futures = [
                pool.submit(_pytest, run, args.pytest_args, basetemps[run])
                for run in every
                if not run.node
            ]
            for future in futures:  # in order: a run's output once it and those before end
                outcomes.append(future.result())
                _report(outcomes[-1])
        for run in every:
            if run.node:
                outcomes.append(_pytest(run, args.pytest_args, basetemps[run]))
                _report(outcomes[-1])
    print("\n===== compat: summary =====")
    for outcome in outcomes:
        verdict = "ok" if outcome.returncode == 0 else f"FAILED (exit {outcome.returncode})"
        print(f"{outcome.run.name}: {verdict} in {outcome.seconds:.0f}s")
    print(f"{len(outcomes)} runs in {time.monotonic() - started:.0f}s")
    return 0 if all(o.returncode == 0 for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
