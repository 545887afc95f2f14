"""Smoke tests of the real node (tests.peers.node): pods really run on this machine.

For every runtime the node runs (NODE_RUNTIMES): the kubelet registers a Ready Node; a pod runs
the probe, whose log (read through the API server, from the kubelet) says which CPUs it may
use, and the machine agrees (/proc/<pid>/status, the container's cpuset cgroup); restarting
the runtime and then the kubelet leaves the pod's container running; a DRA claim prepared by a
driver gives the container the environment of the CDI spec the driver wrote into the node's
CDI directory; and a stopped node leaves no process, cgroup, mount or kernel setting behind.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import GoDriverFactory, RealNodeFactory
from tests.peers.cgroups import hierarchies
from tests.peers.cluster import get_pod, wait_for_slices, wait_pod_scheduled
from tests.peers.controlplane import APIError, ControlPlane
from tests.peers.mountns import KUBELET_SYSCTLS
from tests.peers.netns import NODE_ADDRESS
from tests.peers.node import RealNode
from tests.peers.node_kubelet import NOT_READY_TAINT
from tests.peers.peer_groups import kubernetes_version
from tests.peers.pods import (
    PAUSE_IMAGE,
    WORKLOAD_CONTAINER,
    WORKLOAD_IMAGE,
    container_id,
    cpuset_cgroup,
    create_pod,
    online_cpus,
    online_mems,
    pod_log,
    proc_status,
    wait_pod_running,
    wait_reports,
    workload_pod,
)
from tests.peers.runtime import NODE_RUNTIMES

runtimes = pytest.mark.parametrize("runtime", NODE_RUNTIMES)
real_nodes = pytest.mark.parametrize("real_node", NODE_RUNTIMES, indirect=True)


def _run_probe(
    cp: ControlPlane, node: RealNode, namespace: str, name: str = "probe", **options: Any
) -> tuple[dict[str, Any], int]:
    """Run the probe on ``node``; the running pod and the PID of its container."""
    create_pod(cp, namespace, workload_pod(name, node_name=node.node_name, **options))
    pod = wait_pod_running(cp, namespace, name)
    return pod, node.container_pid(container_id(pod))


def _container_state(cp: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    (status,) = get_pod(cp, namespace, name)["status"]["containerStatuses"]
    return dict(status)


@real_nodes
def test_node_registers_and_becomes_ready(real_node: RealNode, control_plane: ControlPlane) -> None:
    node = real_node.node()
    conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert conditions["Ready"] == "True"
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == kubernetes_version()
    runtime = info["containerRuntimeVersion"]
    kind, version = runtime.split("://")
    assert (kind, version.lstrip("v")) == (real_node.runtime.kind, real_node.runtime.version[1:])
    assert {"type": "InternalIP", "address": NODE_ADDRESS} in node["status"]["addresses"]
    # Registered with the node's own credentials: the Node authorizer let it create itself.
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == real_node.node_name
    assert NOT_READY_TAINT not in {t["key"] for t in node["spec"].get("taints") or []}
    # The runtime serves NRI where the node says, for plugins such as nodedra.
    assert real_node.nri_socket.is_socket()
    # Both images are on the node, and the kubelet reports them.
    assert set(real_node.images) == {PAUSE_IMAGE, WORKLOAD_IMAGE}
    images = {n for image in node["status"].get("images") or [] for n in image["names"]}
    assert WORKLOAD_IMAGE in images or f"docker.io/{WORKLOAD_IMAGE}" in images, images


@real_nodes
def test_pod_runs_and_reports_the_cpus_it_may_use(
    real_node: RealNode, control_plane: ControlPlane, namespace: str
) -> None:
    pod, pid = _run_probe(control_plane, real_node, namespace)
    assert pod["spec"]["nodeName"] == real_node.node_name

    (report,) = wait_reports(control_plane, namespace, "probe")
    assert report["event"] == "start"
    assert not report.get("errors"), report
    # Nothing pins the container: it may use every CPU and memory node of the machine.
    assert report["cpus_allowed_list"] == online_cpus()
    assert report["mems_allowed_list"] == online_mems()
    assert report["cgroup"]["cpus"] == online_cpus()

    # The machine's view of the same process agrees.
    status = proc_status(pid)
    assert status["Cpus_allowed_list"] == report["cpus_allowed_list"]
    assert status["Mems_allowed_list"] == report["mems_allowed_list"]
    cgroup = cpuset_cgroup(pid)
    assert cgroup.path == report["cgroup"]["path"]
    assert cgroup.path.startswith(f"{real_node.cgroups.path}/kubepods/")
    assert cgroup.path.endswith(container_id(pod))
    assert (cgroup.cpus, cgroup.mems) == (report["cgroup"]["cpus"], report["cgroup"]["mems"])


@real_nodes
def test_pod_survives_restarts_of_the_runtime_and_the_kubelet(
    real_node: RealNode, control_plane: ControlPlane, namespace: str
) -> None:
    pod, pid = _run_probe(control_plane, real_node, namespace, report_interval="500ms")
    before = len(wait_reports(control_plane, namespace, "probe", 2))

    real_node.restart_runtime()
    assert real_node.container_pid(container_id(pod)) == pid  # the runtime finds it again
    real_node.restart_kubelet()
    real_node.wait_ready()

    state = _container_state(control_plane, namespace, "probe")
    assert state["restartCount"] == 0
    assert "running" in state["state"], state
    os.kill(pid, 0)  # the same process, still alive
    assert real_node.container_pid(container_id(pod)) == pid
    # It went on running (and logging) throughout, and the new kubelet serves its log.
    reports = wait_reports(control_plane, namespace, "probe", before + 2)
    assert {r["pid"] for r in reports} == {reports[0]["pid"]}
    assert [r["seq"] for r in reports] == list(range(1, len(reports) + 1))


@real_nodes
def test_container_gets_the_cdi_spec_a_driver_wrote_into_the_node_cdi_dir(
    real_node: RealNode,
    control_plane: ControlPlane,
    namespace: str,
    go_driver_factory: GoDriverFactory,
) -> None:
    """The whole DRA path on a real node: the scheduler allocates the claim, the kubelet has
    the driver (registered in the node's registry dir) prepare it, passes the CDI device it
    got to the runtime, which applies the spec found in the node's CDI directory."""
    driver = go_driver_factory(real_node, devices=1, cdi_dir=real_node.cdi_dir)
    wait_for_slices(control_plane, real_node.node_name, driver.driver_name, 1)
    control_plane.create_if_absent(
        "/apis/resource.k8s.io/v1/deviceclasses",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": driver.driver_name},
            "spec": {
                "selectors": [{"cel": {"expression": f'device.driver == "{driver.driver_name}"'}}]
            },
        },
    )
    claim = control_plane.request(
        "POST",
        f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "device"},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "dev", "exactly": {"deviceClassName": driver.driver_name}}
                    ]
                }
            },
        },
    )
    create_pod(
        control_plane,
        namespace,
        workload_pod(
            "probe",
            node_selector={"kubernetes.io/hostname": real_node.node_name},
            claims=[{"name": "device", "resourceClaimName": "device"}],
            env_prefixes=["DRA_", "GO_DRIVER_"],
        ),
    )
    wait_pod_scheduled(control_plane, namespace, "probe")
    wait_pod_running(control_plane, namespace, "probe")

    spec_path = driver.spec_path(claim["metadata"]["uid"])
    assert spec_path.parent == real_node.cdi_dir
    spec = yaml.safe_load(spec_path.read_text())
    (device,) = spec["devices"]
    expected = dict(e.split("=", 1) for e in device["containerEdits"]["env"])
    assert expected == {
        f"GO_DRIVER_{claim['metadata']['uid'].replace('-', '_')}_0_DEVICE": (
            f"{real_node.node_name}/dev-0"
        )
    }
    (report,) = wait_reports(control_plane, namespace, "probe")
    assert report["env"] == expected


@runtimes
def test_a_stopped_node_leaves_the_machine_as_it_was(
    runtime: str,
    real_node_factory: RealNodeFactory,
    control_plane: ControlPlane,
    namespace: str,
) -> None:
    sysctls = {name: Path("/proc/sys", name).read_text() for name in KUBELET_SYSCTLS}
    node = real_node_factory(runtime=runtime)
    _pod, container = _run_probe(control_plane, node, namespace)
    daemons = [p.pid for p in (node.runtime.process, node.kubelet.process) if p is not None]
    in_namespace = node.namespace.processes()  # holder, runtime, kubelet, shims or conmons
    assert set(daemons) <= set(in_namespace)
    assert len(in_namespace) > len(daemons) + 1, "no shim in the node's mount namespace"
    assert node.cgroups.pids() >= {container}

    # While it runs: the kubelet found the values it wants (inside its mount namespace), and
    # the machine's stayed as they were.
    inside = node.namespace.run(["cat", *(f"/proc/sys/{n}" for n in KUBELET_SYSCTLS)]).stdout
    assert inside.split() == list(KUBELET_SYSCTLS.values())
    assert {name: Path("/proc/sys", name).read_text() for name in KUBELET_SYSCTLS} == sysctls
    # Its mounts (overlay root filesystems, /run, /var/lib) are not the machine's.
    assert node.host_mounts() == []
    assert "nodedra-run" not in Path("/proc/self/mountinfo").read_text()

    node.stop()  # raises if it finds anything left

    for pid in (container, *in_namespace):
        assert _zombie(pid), pid
    assert not [d for d in node.cgroups.directories() if d.exists()]
    assert not [h for h in hierarchies() if (h.mount / node.cgroups.name).exists()]
    assert node.namespace.processes() == []
    assert {name: Path("/proc/sys", name).read_text() for name in KUBELET_SYSCTLS} == sysctls
    assert node.host_mounts() == []
    nodes = control_plane.request("GET", "/api/v1/nodes")["items"]
    assert node.node_name not in {n["metadata"]["name"] for n in nodes}
    # No kubelet answers for the pod any more.
    with pytest.raises(APIError):
        pod_log(control_plane, namespace, "probe", WORKLOAD_CONTAINER)


def _zombie(pid: int) -> bool:
    """Whether ``pid`` is dead: gone, or a zombie its parent has yet to reap."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
