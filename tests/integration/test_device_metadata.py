"""nodedra's device metadata files as Kubernetes' own reader sees them.

The reader is ``k8s.io/dynamic-resource-allocation/devicemetadata`` (v0.37), run by the Go
driver peer (``go-driver decode-metadata``): each object of the file's stream decoded into
its API version with the API's validation. What nodedra writes must be valid, in both
versions, and decode to exactly what was written (a misnamed field would be dropped).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from nodedra.dra import ClaimRef, MetadataStore, driver_name
from nodedra.dra.claims import AllocationResult
from nodedra.dra.metadata import POD_CLAIM_NAME_ANNOTATION
from nodedra.policy import make_policy, parse_config
from nodedra.topology import read_topology
from tests.peers.build import PeerBinaries
from tests.reliability.helpers import SYSFS
from tests.unit.dra.test_metadata import stream
from tests.unit.policy.conftest import Host

REF = ClaimRef("team-a", "db-cpus-x7k2q", "0f1e2d3c-4b5a-6978-8695-a4b3c2d1e0f9")
VERSIONS = ["metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1"]


def results(policy: str, driver: str) -> list[AllocationResult]:
    """Two requests: one of two devices, and one chosen as a subrequest."""
    if policy == "static":
        consumed: list[dict[str, str]] = [{}, {}, {}]
        devices = ["core001", "core002", "core003"]
    else:
        consumed = [{"cpu": "2", "memory": "1Gi"}, {"cpu": "2"}, {"cpu": "4", "memory": "64Mi"}]
        devices = ["cpudevnuma000", "cpudevnuma001", "cpudevnuma002"]
    requests = ["cpus", "cpus", "spare/big"]
    return [
        AllocationResult(request, driver, "node-a", device, consumed_capacity=capacity)
        for request, device, capacity in zip(requests, devices, consumed, strict=True)
    ]


def decode(binaries: PeerBinaries, path: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        [str(binaries.go_driver), "decode-metadata", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.mark.parametrize("policy", ["static", "topology-aware"])
def test_the_official_reader_takes_every_file_valid_and_whole(
    peer_binaries: PeerBinaries, tmp_path: Path, policy: str
) -> None:
    driver = driver_name(policy)
    config = parse_config({"policy": policy, "reservedCPUs": "0", "fullPhysicalCores": True})
    granting = make_policy(read_topology(SYSFS), config)
    granting.start(Host(), {})
    claim = {"metadata": {"uid": REF.uid, "annotations": {POD_CLAIM_NAME_ANNOTATION: "cpus"}}}
    allocated = results(policy, driver)
    granting.allocate_claim(claim, allocated)
    store = MetadataStore(driver, tmp_path)
    made = store.claim_metadata(REF, claim, allocated, granting.result_attributes(REF.uid))
    store.write(made)
    assert [f.path.parent.name for f in made.files] == ["cpus", "spare"]
    for file in made.files:
        written = stream(file.path.read_bytes())
        read = decode(peer_binaries, file.path)
        assert [r["apiVersion"] for r in read] == VERSIONS
        for ours, theirs in zip(written, read, strict=True):
            assert theirs["invalid"] == "", theirs["invalid"]
            assert theirs["decoded"] == ours
    (spare,) = stream(made.files[1].path.read_bytes())[0]["requests"]
    assert spare["name"] == "spare/big"
