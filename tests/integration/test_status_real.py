"""``nodedra status`` on a real node (kubelet, containerd or CRI-O, runc): what it says of a
pod's container is what the machine says.

nodedra reads this machine's topology and pins through the node's runtime, as in
test_node_pinning.py. The command runs as an administrator would run it on the node
(``python -m nodedra status`` against the instance's status address); the ground truth is
the runtime's own PID for the container and ``/proc/<pid>/status``, found without nodedra.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest

from nodedra.topology import format_cpu_list, parse_cpu_list
from tests.conftest import NodedraFactory, RealNodeFactory
from tests.integration.test_node_pinning import RESERVED, Pinned, pinned_node
from tests.peers.controlplane import LOOPBACK, ControlPlane
from tests.peers.pods import WORKLOAD_CONTAINER, container_id, proc_status, wait_pod_running
from tests.peers.runtime import NODE_RUNTIMES

POLICY = "topology-aware"


@pytest.fixture(params=NODE_RUNTIMES)
def pinned(
    request: pytest.FixtureRequest,
    workload_controllers: ControlPlane,
    namespace: str,
    real_node_factory: RealNodeFactory,
    nodedra_factory: NodedraFactory,
) -> Pinned:
    return pinned_node(
        workload_controllers,
        namespace,
        real_node_factory,
        nodedra_factory,
        runtime=request.param,
        policy=POLICY,
    )


def nodedra_status(pinned: Pinned, *args: str) -> str:
    """``nodedra status`` against the running instance, as run on the node: its output."""
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "nodedra",
            "status",
            "--address",
            f"{LOOPBACK}:{pinned.nodedra.status_port}",
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_status_says_where_the_pod_s_container_runs_as_proc_does(pinned: Pinned) -> None:
    pinned.create("plain")
    wait_pod_running(pinned.cp, pinned.namespace, "plain")
    pod = pinned.run_claim_pod("claimer")
    claim = pinned.claim_of(pod)
    uid = claim["metadata"]["uid"]
    cpus, mems = pinned.grants(uid)
    pinned.wait_runs_on("claimer", cpus)
    pinned.wait_runs_on("plain", pinned.online - cpus)

    cpu_map: dict[str, Any] = json.loads(nodedra_status(pinned, "--json"))

    # The claim: its CPUs in the grid, its name, and the pod it is reserved for.
    (entry,) = [c for c in cpu_map["claims"] if c["uid"] == uid]
    assert (entry["namespace"], entry["name"]) == (pinned.namespace, claim["metadata"]["name"])
    assert [p["name"] for p in entry["pods"]] == ["claimer"]
    assert parse_cpu_list(entry["cpus"]) == cpus
    grid = [c for n in cpu_map["numa_nodes"] for core in n["cores"] for c in core["cpus"]]
    assert {c["id"] for c in grid} == pinned.online
    assert {c["id"] for c in grid if c.get("claim") == uid} == cpus
    assert {c["id"] for c in grid if c["state"] == "reserved"} == parse_cpu_list(RESERVED)
    assert cpu_map["runtime_connected"] is True

    # Each pod's container: what nodedra reports is what /proc says of the process the
    # runtime started for it.
    for name, should in (("claimer", cpus), ("plain", pinned.online - cpus)):
        fetched = pinned.cp.request("GET", f"/api/v1/namespaces/{pinned.namespace}/pods/{name}")
        (container,) = [
            c for c in cpu_map["containers"] if c["id"] == container_id(fetched, WORKLOAD_CONTAINER)
        ]
        assert (container["pod"]["name"], container["name"]) == (name, WORKLOAD_CONTAINER)
        pid = pinned.node.pod_pid(pinned.namespace, name)
        machine = proc_status(pid)
        assert container["process"]["pid"] == pid
        assert container["process"]["cpus"] == machine["Cpus_allowed_list"]
        assert container["process"]["mems"] == machine["Mems_allowed_list"]
        assert parse_cpu_list(machine["Cpus_allowed_list"]) == should
        assert parse_cpu_list(container["cpus"]) == should
        assert container["process"]["check"] == "match"
        assert container["in_sync"] is True
    (on_claim,) = [c for c in cpu_map["containers"] if c["claims"]]
    assert on_claim["claims"] == {uid: [0]}
    assert parse_cpu_list(on_claim["mems"]) == mems

    text = nodedra_status(pinned)
    claimer_pid = pinned.node.pod_pid(pinned.namespace, "claimer")
    assert f"claim {pinned.namespace}/{claim['metadata']['name']}" in text
    assert f"pods {pinned.namespace}/claimer" in text
    assert (
        f"{pinned.namespace}/claimer {WORKLOAD_CONTAINER}  CPUs {format_cpu_list(cpus)}  "
        f"ok: pid {claimer_pid} runs on {format_cpu_list(cpus)}"
    ) in text
    assert re.search(r"containers on the shared pool \((\d+)\): \1 ok\n", text), text
    assert "\x1b[" not in text, "no colour without a terminal"
    print(text)  # what an administrator sees (-s shows it)
