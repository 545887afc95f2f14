"""``nodedra status`` on a real node (kubelet, containerd or CRI-O, runc): what it says of a
pod's container, from its cgroup or else its process, is what the machine says.

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
from pathlib import Path
from typing import Any

import pytest

from nodedra.topology import format_cpu_list, parse_cpu_list
from tests.conftest import NodedraFactory, RealNodeFactory
from tests.integration.test_node_pinning import RESERVED, Pinned, pinned_node
from tests.peers.controlplane import ControlPlane
from tests.peers.pods import WORKLOAD_CONTAINER, container_id, proc_status, wait_pod_running
from tests.peers.ports import LOOPBACK
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


def _as_the_machine_says(
    kernel: dict[str, Any], seen: dict[str, Any], cid: str, pid: int, should: frozenset[int]
) -> None:
    """``kernel`` (from the cgroup) and ``seen`` (from /proc) agree with /proc/<pid>/status."""
    machine = proc_status(pid)
    assert parse_cpu_list(machine["Cpus_allowed_list"]) == should
    assert kernel["source"] == "cgroup", kernel
    assert cid in kernel["where"], kernel
    assert parse_cpu_list(kernel["cpus"]) == should
    assert parse_cpu_list(kernel["mems"]) == parse_cpu_list(machine["Mems_allowed_list"])
    assert kernel["check"] == "match"
    assert seen["source"] == "proc", seen
    assert seen["pid"] == pid
    assert seen["cpus"] == machine["Cpus_allowed_list"]
    assert seen["mems"] == machine["Mems_allowed_list"]
    assert seen["check"] == "match"


def test_status_says_where_the_pod_s_container_runs_as_proc_does(
    pinned: Pinned, tmp_path: Path
) -> None:
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

    # Each pod's container: what nodedra reports, from the container's cgroup (the runtime
    # named it in its NRI events), is what /proc says of the process the runtime started for
    # it; and where no cgroup can be read, /proc is where nodedra looks itself.
    no_cgroups = tmp_path / "no-cgroups"
    no_cgroups.mkdir()
    from_proc: dict[str, Any] = json.loads(
        nodedra_status(pinned, "--json", "--cgroup-root", str(no_cgroups))
    )
    for name, should in (("claimer", cpus), ("plain", pinned.online - cpus)):
        fetched = pinned.cp.request("GET", f"/api/v1/namespaces/{pinned.namespace}/pods/{name}")
        cid = container_id(fetched, WORKLOAD_CONTAINER)
        (container,) = [c for c in cpu_map["containers"] if c["id"] == cid]
        assert (container["pod"]["name"], container["name"]) == (name, WORKLOAD_CONTAINER)
        assert parse_cpu_list(container["cpus"]) == should
        assert container["in_sync"] is True
        (seen,) = [c["kernel"] for c in from_proc["containers"] if c["id"] == cid]
        _as_the_machine_says(
            container["kernel"], seen, cid, pinned.node.pod_pid(pinned.namespace, name), should
        )
    (on_claim,) = [c for c in cpu_map["containers"] if c["claims"]]
    assert on_claim["claims"] == {uid: [0]}
    assert parse_cpu_list(on_claim["mems"]) == mems

    text = nodedra_status(pinned)
    assert f"claim {pinned.namespace}/{claim['metadata']['name']}" in text
    assert f"pods {pinned.namespace}/claimer" in text
    assert (
        f"{pinned.namespace}/claimer {WORKLOAD_CONTAINER}  CPUs {format_cpu_list(cpus)}  "
        f"ok: its cgroup runs on {format_cpu_list(cpus)}"
    ) in text
    assert re.search(r"containers on the shared pool \((\d+)\): \1 ok\n", text), text
    assert "\x1b[" not in text, "no colour without a terminal"
    print(text)  # what an administrator sees (-s shows it)
