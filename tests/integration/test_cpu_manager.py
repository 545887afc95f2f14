"""The kubelet's static CPU manager on a real node: nodedra holds pinning, says why, and
proceeds once the node is moved off it (docs/troubleshooting.md's steps), without a restart.

The kubelet runs with cpuManagerPolicy: static (and the reservedSystemCPUs the policy needs);
nodedra reads the kubelet's state file and configuration file as its pod would (here at their
paths on the machine). A claim's pod then waits with the refusal in its events, and nodedra is
not Ready with the conflict and its fix. The admin's steps (stop the kubelet, set none, remove
the state file, start the kubelet) make nodedra Ready and the same pod run on its claim's CPUs.
Meanwhile a Guaranteed pod keeps the CPU the kubelet's CPU manager gave it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nodedra.dra import driver_name
from nodedra.preflight.keeper import CPU_MANAGER, REASONS
from nodedra.topology import parse_cpu_list
from tests.conftest import NodedraFactory, RealNodeFactory
from tests.peers.cluster import poll
from tests.peers.controlplane import ControlPlane
from tests.peers.nodedra_node import NodedraProcess, claim_template
from tests.peers.pods import create_pod, pod_events, wait_pod_running, wait_reports, workload_pod
from tests.peers.runtime import NODE_RUNTIMES

POLICY = "static"
DRIVER = driver_name(POLICY)
STATIC_KUBELET = {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0"}
"""The static policy needs CPUs reserved for the system; nodedra reserves the same one."""
CONFLICT = "the kubelet's CPU manager policy is static"


def preflight(nodedra: NodedraProcess, state_file: Path, kubelet_config: Path) -> tuple[int, Any]:
    """``nodedra preflight --json`` with the instance's settings: its exit status and report."""
    return nodedra.preflight(
        "--kubelet-cpu-manager-state", str(state_file), "--kubelet-config", str(kubelet_config)
    )


def readiness(nodedra: NodedraProcess) -> tuple[int, dict[str, Any]]:
    status, body = nodedra.readyz()
    return status, json.loads(body)


def node_events(cp: ControlPlane, node: str) -> list[dict[str, Any]]:
    found = cp.request("GET", "/apis/events.k8s.io/v1/namespaces/default/events")
    return [
        e
        for e in found["items"]
        if (e.get("regarding") or {}).get("kind") == "Node" and e["regarding"]["name"] == node
    ]


def test_a_static_cpu_manager_holds_pinning_until_the_node_is_moved_off_it(
    workload_controllers: ControlPlane,
    namespace: str,
    real_node_factory: RealNodeFactory,
    nodedra_factory: NodedraFactory,
) -> None:
    cp = workload_controllers
    node = real_node_factory(
        runtime=NODE_RUNTIMES[0], cdi_dir=nodedra_factory.dirs.cdi, kubelet_config=STATIC_KUBELET
    )
    state_file = node.root_dir / "cpu_manager_state"
    assert json.loads(state_file.read_text())["policyName"] == "static", state_file.read_text()
    nodedra_factory.write_config({"policy": POLICY, "reservedCPUs": "0"})
    nodedra = nodedra_factory(
        node,
        sysfs=Path("/sys"),
        pinning="required",
        nri_socket=node.nri_socket,
        env={
            "NODEDRA_KUBELET_CPU_MANAGER_STATE": str(state_file),
            "NODEDRA_KUBELET_CONFIG": str(node.kubelet.config_path),
            "NODEDRA_CONFIG_POLL": "1",
        },
    )

    # Not Ready, saying why and what to do.
    nodedra.process.wait_until(
        lambda: readiness(nodedra)[1].get("preflight", {}).get("kubelet-cpu-manager") == "fail",
        60,
        "/readyz reporting the kubelet's CPU manager",
    )
    status, checks = readiness(nodedra)
    assert (status, checks["ready"]) == (503, False)
    (problem,) = [p for p in checks["problems"] if CONFLICT in p]
    assert "set cpuManagerPolicy: none" in problem
    assert "docs/troubleshooting.md" in problem
    assert checks["preflight"]["reserved-cpus"] == "ok", checks
    assert (
        nodedra.metric(
            "nodedra_preflight_checks", {"check": "kubelet-cpu-manager", "status": "fail"}
        )
        == 1
    )
    event = poll(
        lambda: next(
            (
                e
                for e in node_events(cp, node.node_name)
                if e["reason"] == REASONS["kubelet-cpu-manager"]
            ),
            None,
        ),
        30,
        lambda: f"a CPU manager Event on the Node: {node_events(cp, node.node_name)}",
    )
    assert CONFLICT in event["note"]
    assert event["type"] == "Warning"

    code, report = preflight(nodedra, state_file, node.kubelet.config_path)
    verdicts = {c["name"]: c["status"] for c in report["checks"]}
    assert (code, report["failed"], verdicts["kubelet-cpu-manager"]) == (1, True, "fail"), report
    assert verdicts["container-runtime"] == "ok", report

    # A Guaranteed pod keeps the CPU the kubelet's CPU manager gives it: nodedra leaves it.
    create_pod(
        cp,
        namespace,
        workload_pod(
            "guaranteed",
            node_selector={"kubernetes.io/hostname": node.node_name},
            resources={
                "requests": {"cpu": "1", "memory": "32Mi"},
                "limits": {"cpu": "1", "memory": "32Mi"},
            },
        ),
    )
    wait_pod_running(cp, namespace, "guaranteed", timeout=120)
    (report, *_) = wait_reports(cp, namespace, "guaranteed")
    assert parse_cpu_list(report["cpus_allowed_list"]) == {1}, report
    cp.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/guaranteed?gracePeriodSeconds=0")
    poll(
        lambda: (
            True
            if not any(
                p["metadata"]["name"] == "guaranteed"
                for p in cp.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
            )
            else None
        ),
        60,
        lambda: "pod guaranteed gone",
    )

    # A claim's pod is refused, with the conflict in its events.
    cp.request(
        "POST",
        f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates",
        claim_template("claimer", DRIVER, None),
    )
    create_pod(
        cp,
        namespace,
        workload_pod(
            "claimer",
            node_selector={"kubernetes.io/hostname": node.node_name},
            report_interval="200ms",
            claims=[{"name": "cpus", "resourceClaimTemplateName": "claimer"}],
        ),
    )
    refused = poll(
        lambda: next(
            (e for e in pod_events(cp, namespace, "claimer") if "claims are refused" in e), None
        ),
        90,
        lambda: (
            f"the claim refused in pod claimer's events: {pod_events(cp, namespace, 'claimer')}"
        ),
    )
    assert CONFLICT in refused

    # The steps of docs/troubleshooting.md (no pod to drain but the one waiting).
    node.stop_kubelet()
    config = json.loads(node.kubelet.config_path.read_text())
    config["cpuManagerPolicy"] = "none"
    node.kubelet.config_path.write_text(json.dumps(config, indent=2))
    state_file.unlink()
    node.start_kubelet()
    node.wait_ready()

    nodedra.wait_ready(cp, node.node_name, DRIVER, timeout=90)
    # Between the state file's removal and the kubelet writing its new one the check can
    # only warn (the policy is unreadable and the kubelet had asked for cpusets), which no
    # longer holds claims: ready comes first, ok once the new state file is read.
    poll(
        lambda: True if readiness(nodedra)[1]["preflight"][CPU_MANAGER] == "ok" else None,
        60,
        lambda: f"the CPU manager check ok: {readiness(nodedra)[1]}",
    )
    code, report = preflight(nodedra, state_file, node.kubelet.config_path)
    assert (code, report["failed"]) == (0, False), report
    wait_pod_running(cp, namespace, "claimer", timeout=120)
    (report, *_) = wait_reports(cp, namespace, "claimer")
    assert parse_cpu_list(report["cpus_allowed_list"]) == parse_cpu_list("1"), report
    nodedra.wait_for_log("preflight ok again: kubelet-cpu-manager")
