"""Imports point down the layers of docs/architecture.md: checked in fresh interpreters."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

LOADED = "import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"


def loaded_by(module: str) -> set[str]:
    """The modules importing ``module`` loads, in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", LOADED.format(module=module)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return set(json.loads(out))


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        (
            "nodedra.lib",
            {"nodedra.topology", "nodedra.policy", "nodedra.dra", "grpc", "kopf", "kubernetes"},
        ),
        ("nodedra.topology", {"nodedra.policy", "nodedra.dra", "grpc", "kopf", "kubernetes"}),
        ("nodedra.policy", {"nodedra.dra", "nodedra.resmgr", "grpc", "kopf", "kubernetes"}),
        # The host's work off claimed CPUs: kernel files and a record, nothing of the cluster.
        (
            "nodedra.quiet",
            {"nodedra.policy", "nodedra.dra", "nodedra.resmgr", "grpc", "kopf", "kubernetes"},
        ),
        ("nodedra.dra", {"nodedra.policy", "nodedra.resmgr", "nodedra.handlers", "kopf"}),
        (
            "nodedra.nri",
            {"nodedra.dra", "nodedra.policy", "nodedra.resmgr", "kopf", "kubernetes", "grpc"},
        ),
        ("nodedra.resmgr", {"nodedra.handlers", "nodedra.runtime", "kopf"}),
        ("nodedra.claims", {"nodedra.handlers", "nodedra.runtime", "kopf"}),
        (
            "nodedra.nodeevents",
            {"nodedra.handlers", "nodedra.runtime", "nodedra.resmgr", "nodedra.policy", "kopf"},
        ),
        # The checks and what `nodedra run` keeps of them: below the runtime and the handlers.
        ("nodedra.preflight", {"nodedra.handlers", "nodedra.runtime", "nodedra.resmgr", "kopf"}),
        ("nodedra.status", {"nodedra.handlers", "nodedra.runtime", "nodedra.cli", "kopf"}),
        # `nodedra cleanup` removes files: nothing of what runs the operator.
        ("nodedra.cleanup", {"nodedra.handlers", "nodedra.runtime", "kopf"}),
        (
            # `nodedra status` reads the map over HTTP: none of what serves it.
            "nodedra.cpumap",
            {"nodedra.resmgr", "nodedra.policy", "nodedra.dra", "nodedra.nri", "grpc", "kopf"},
        ),
        # `nodedra claim-template` writes YAML: nothing of what runs on the node.
        ("nodedra.spreadclaim", {"nodedra.resmgr", "nodedra.handlers", "nodedra.nri", "kopf"}),
        # `nodedra gather` loads the rest part by part, as each needs it; never the operator.
        ("nodedra.gather", {"nodedra.resmgr", "nodedra.handlers", "nodedra.runtime", "kopf"}),
    ],
)
def test_imports_point_down(module: str, forbidden: set[str]) -> None:
    assert loaded_by(module) & forbidden == set()
