"""Devices a claim would take whole are withheld where the server drops consumable capacity.

Against the ClusterAPI fake, which drops what DRAConsumableCapacity adds when told the gate
is off, as a real API server does; the same against real API servers with the gate on and
off is tests/integration/test_whole_numa_nodes.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodedra.dra import KubeAPIError, Plugin, Withheld
from nodedra.dra.probes import GateProbe
from nodedra.dra.withheld import WholeDevices
from tests.unit.dra.fakes import DRIVER, NODE, FakeCluster, devices
from tests.unit.dra.test_plugin import Rig

GATE = "DRAConsumableCapacity"


def shared(name: str) -> dict[str, Any]:
    """A device offered in parts, as the topology-aware policy's NUMA nodes are."""
    return {
        "name": name,
        "capacity": {"cpu": {"value": "14", "requestPolicy": {"default": "1"}}},
        "allowMultipleAllocations": True,
    }


def rig_with(tmp: Path, *, gate: bool, allowed: bool) -> tuple[Rig, list[Withheld]]:
    rig = Rig(tmp)
    rig.cluster.keeps_consumable_capacity = gate
    told: list[Withheld] = []
    rig.options.whole_devices_allowed = allowed
    rig.options.on_withheld = told.append
    rig.plugin = Plugin(DRIVER, rig.options)
    return rig, told


def publish_and_resync(rig: Rig, given: list[dict[str, Any]]) -> None:
    """Publish ``given``, then check the slices again three times (each a pass)."""
    rig.plugin.publish(given)
    rig.plugin.start()
    try:
        assert rig.plugin.wait_published(10) is not None
        for _ in range(3):
            rig.plugin.resync()
            assert rig.plugin.wait_published(10) is not None
    finally:
        rig.plugin.stop()


def test_with_the_gate_off_devices_offered_in_parts_are_withheld(tmp_path: Path) -> None:
    """Only those: a device whole by nature (a static CPU) is published; what is withheld is
    told once, not on every pass, and kept for readiness and the metrics."""
    rig, told = rig_with(tmp_path, gate=False, allowed=False)
    publish_and_resync(rig, [shared("numa0"), *devices(1), shared("numa1")])
    assert rig.cluster.pool_devices() == devices(1)
    withheld = Withheld(GATE, ("numa0", "numa1"))
    assert rig.plugin.withheld() == withheld
    assert told == [withheld]
    assert str(withheld) == (
        "2 devices withheld (numa0, numa1): the API server has feature gate "
        "DRAConsumableCapacity off, so a claim of one would take all of it, however little "
        "it asks for"
    )
    assert rig.plugin.feature_gates() == {GATE: False}


def test_with_the_gate_off_and_whole_devices_allowed_they_are_published_whole(
    tmp_path: Path,
) -> None:
    rig, told = rig_with(tmp_path, gate=False, allowed=True)
    publish_and_resync(rig, [shared("numa0")])
    assert rig.cluster.pool_devices() == [{"name": "numa0", "capacity": {"cpu": {"value": "14"}}}]
    assert rig.plugin.withheld() is None
    assert told == []


@pytest.mark.parametrize("allowed", [False, True])
def test_with_the_gate_on_nothing_is_withheld(tmp_path: Path, *, allowed: bool) -> None:
    rig, told = rig_with(tmp_path, gate=True, allowed=allowed)
    publish_and_resync(rig, [shared("numa0")])
    assert rig.cluster.pool_devices() == [shared("numa0")]
    assert rig.plugin.withheld() is None
    assert told == []


def test_devices_whole_by_nature_ask_nothing(tmp_path: Path) -> None:
    rig, told = rig_with(tmp_path, gate=False, allowed=False)
    publish_and_resync(rig, devices(2))
    assert rig.cluster.pool_devices() == devices(2)
    assert (rig.plugin.withheld(), told, rig.plugin.feature_gates()) == (None, [], {})


def test_withheld_devices_that_change_are_told_again_and_none_clears(tmp_path: Path) -> None:
    """A reconfiguration that changes the devices: what is withheld is what the last pass
    withheld (nothing, once the policy offers none in parts)."""
    rig, told = rig_with(tmp_path, gate=False, allowed=False)
    rig.plugin.publish([shared("numa0")])
    rig.plugin.start()
    try:
        assert rig.plugin.wait_published(10) is not None
        rig.plugin.publish([shared("numa0"), shared("numa1")])
        assert rig.plugin.wait_published(10) is not None
        assert rig.plugin.withheld() == Withheld(GATE, ("numa0", "numa1"))
        rig.plugin.publish(devices(1))
        assert rig.plugin.wait_published(10) is not None
        assert rig.plugin.withheld() is None
    finally:
        rig.plugin.stop()
    assert told == [Withheld(GATE, ("numa0",)), Withheld(GATE, ("numa0", "numa1"))]
    assert rig.cluster.pool_devices() == devices(1)


def test_a_server_that_cannot_tell_fails_the_pass_naming_the_gate() -> None:
    """Nothing is published, whole or in parts, until the probe has an answer; the error is
    what readiness shows ("publishing ResourceSlices failed: ...")."""
    cluster = FakeCluster()
    cluster.fail_next = [KubeAPIError(503, "etcd leader changed")]
    whole = WholeDevices(GateProbe(cluster, NODE, DRIVER), allowed=False)
    with pytest.raises(KubeAPIError) as raised:
        whole.adapt([shared("numa0")])
    assert raised.value.status == 503
    assert str(raised.value) == (
        "(503) cannot tell whether the API server has feature gate DRAConsumableCapacity on, "
        "so devices a claim could take whole are not published until it can: (503) etcd "
        "leader changed"
    )
    assert whole.withheld() is None
    assert whole.adapt([shared("numa0")]) == [shared("numa0")]  # asked again: on
