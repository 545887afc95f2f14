"""nodedra on a real kernel that isolates a CPU: a short guest booted with ``isolcpus=3``.

The VM cluster's node boots without it: with CPU 3 isolated every one of its tests ran 1.3
to 2.7 times slower under TCG. This guest runs no cluster: its containerd runs nodedra's
image, which reads the kernel's own list of isolated CPUs and says what each policy makes of
it. What is then done with them (kept out of the shared pool, given to the claims that ask)
is tested through the real node and scheduler on a fixture (test_pinning, test_isolated_cpus).
"""

from __future__ import annotations

import json
from typing import Any

from tests.conftest import VMNodeFactory
from tests.peers.image import DEFAULT_NAME
from tests.peers.vm import VMNode

CTR = "ctr -n k8s.io"
CONFIG = "/etc/nodedra-isolated.yaml"


def topology(node: VMNode) -> dict[str, Any]:
    """``nodedra topology --json --config CONFIG`` in nodedra's image, run by the guest's
    containerd (its ``/sys`` is the guest kernel's, read-only)."""
    output = node.run(
        f"{CTR} run --rm --mount type=bind,src={CONFIG},dst={CONFIG},options=rbind:ro "
        f"{DEFAULT_NAME} topology nodedra topology --json --config {CONFIG}",
        timeout=180,
    ).check()
    data: dict[str, Any] = json.loads(output)
    return data


def test_nodedra_reads_the_cpu_the_kernel_isolates(vm_node_factory: VMNodeFactory) -> None:
    """The static devices (options are topology-aware's) and the topology-aware ones with
    ``isolatedCPUs: reserved``, from one run."""
    with vm_node_factory(kernel_args=("isolcpus=3",)) as node:
        assert node.run("cat /sys/devices/system/cpu/isolated").check().strip() == "3"
        node.run(f"printf 'options:\\n  isolatedCPUs: reserved\\n' > {CONFIG}").check()
        node.run("systemctl start containerd", timeout=180).check()

        found = topology(node)
        assert [c["id"] for c in found["cpus"] if c["isolated"]] == [3], found["cpus"]
        static = {d["name"]: d["attributes"]["isolated"] for d in found["devices"]["static"]}
        assert static == {f"cpu00{i}": {"bool": i == 3} for i in range(4)}, static
        devices = {
            d["name"]: (d["capacity"].get("cpu", {}).get("value"), d["attributes"]["isolated"])
            for d in found["devices"]["topology-aware"]
        }
        assert devices == {
            "cpudevnuma000": ("2", {"bool": False}),
            "cpudevnuma001": ("1", {"bool": False}),
            "cpudevnuma001isolated": ("1", {"bool": True}),
        }, devices
