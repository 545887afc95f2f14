"""Isolated CPUs (``isolcpus=``) and the topology-aware policy's ``isolatedCPUs``, through the
real API server, scheduler and the kubelet's DRA code, with the DeviceClasses of manifests/.

nodedra reads the two-socket fixture, which isolates cores 26 and 27 (CPUs 26, 27, 54, 55),
all of NUMA node 3 (CPUs 21-27, 49-55); CPU 0 is reserved, and the devices map none of the
node's allocatable (the test node has 8 CPUs, the fixture 56).
"""

from __future__ import annotations

from typing import Any

from nodedra.spreadclaim import spread_template
from tests.conftest import NodedraFactory
from tests.integration.test_docs_examples import examples
from tests.integration.test_l3_caches import create_template_pod, prepared_grants
from tests.integration.test_node_allocatable import (
    kubelet,  # noqa: F401 (fixture)
    published_devices,
    start_nodedra,
    wait_unschedulable,
)
from tests.peers.controlplane import ControlPlane
from tests.peers.kubelet import KubeletHarness
from tests.peers.nodedra_node import TOPOLOGY_AWARE, granted

ISOLATED = frozenset({26, 27, 54, 55})
NODE_3 = frozenset({*range(21, 28), *range(49, 56)})
ON_NODE_3 = {"cel": {"expression": 'device.attributes["resource.kubernetes.io"].numaNode == 3'}}


def request(name: str, device_class: str, **capacity: str) -> dict[str, Any]:
    return {
        "name": name,
        "exactly": {
            "deviceClassName": device_class,
            "selectors": [ON_NODE_3],
            "capacity": {"requests": capacity},
        },
    }


def template(name: str, *requests: dict[str, Any]) -> dict[str, Any]:
    """A claim template of ``requests``, on one NUMA node (spread_template's frame)."""
    frame = spread_template(name, 1, 1)
    frame["spec"]["spec"]["devices"] = {
        "requests": list(requests),
        "constraints": [
            {
                "requests": [r["name"] for r in requests],
                "matchAttribute": "resource.kubernetes.io/numaNode",
            }
        ],
    }
    return frame


def start(
    factory: NodedraFactory,
    cp: ControlPlane,
    kubelet: KubeletHarness,  # noqa: F811 (fixture)
    mode: str,
) -> None:
    config = {"policy": "topology-aware", "nodeAllocatable": False}
    start_nodedra(factory, cp, kubelet, config | {"options": {"isolatedCPUs": mode}})


def test_reserved_isolated_cpus_go_only_to_claims_of_their_class(
    workload_controllers: ControlPlane,
    namespace: str,
    kubelet: KubeletHarness,  # noqa: F811 (fixture)
    nodedra_factory: NodedraFactory,
) -> None:
    """The latency page's DPDK claim gets two isolated CPUs for its workers and two others with
    memory of the same node for its main thread; a claim of the default class then takes
    the rest of node 3 but never an isolated CPU, and one more finds none left, though two
    isolated CPUs are free."""
    cp = workload_controllers
    start(nodedra_factory, cp, kubelet, "reserved")
    names = {d["name"] for d in published_devices(cp, kubelet.node_name, TOPOLOGY_AWARE)}
    assert "cpudevnuma003isolated" in names

    def prepare(name: str, *requests: dict[str, Any]) -> list[dict[str, Any]]:
        spec = template(name, *requests)
        return prepared_grants(cp, namespace, kubelet, nodedra_factory, name=name, template=spec)

    (dpdk,) = [e for e in examples() if e.get("metadata", {}).get("name") == "dpdk"]
    workers, main = prepared_grants(
        cp, namespace, kubelet, nodedra_factory, name="dpdk", template=dpdk
    )
    assert granted([workers]) <= ISOLATED
    assert len(granted([workers])) == 2
    assert granted([main]) <= NODE_3 - ISOLATED
    assert len(granted([main])) == 2
    assert granted([workers], "mems") == granted([main], "mems") == {3}
    (rest,) = prepare("rest", request("cpus", TOPOLOGY_AWARE, cpu="8"))
    assert granted([rest]) == NODE_3 - ISOLATED - granted([main])
    spill = template("spill", request("cpus", TOPOLOGY_AWARE, cpu="2"))
    create_template_pod(cp, namespace, kubelet.node_name, spill)
    assert "cannot allocate all claims" in wait_unschedulable(cp, namespace, "spill")


def test_preferred_isolated_cpus_go_first_to_any_claim(
    workload_controllers: ControlPlane,
    namespace: str,
    kubelet: KubeletHarness,  # noqa: F811 (fixture)
    nodedra_factory: NodedraFactory,
) -> None:
    cp = workload_controllers
    start(nodedra_factory, cp, kubelet, "preferred")
    spec = template("first", request("cpus", TOPOLOGY_AWARE, cpu="2"))
    (grant,) = prepared_grants(cp, namespace, kubelet, nodedra_factory, name="first", template=spec)
    assert granted([grant]) in ({26, 54}, {27, 55}), "a whole isolated core"
