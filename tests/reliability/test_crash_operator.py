"""Crash safety of what users run: ``nodedra run`` SIGKILLed at every crash point.

The in-process crash tests (test_crash.py) kill a manager on a file of claims; these kill
the whole operator while the kubelet's own DRA code (the kubelet harness) drives it over its
real socket, with claims the real scheduler allocated on the real API server. Then the
operator is started again, as the DaemonSet would, and the kubelet retries: nothing held is
lost or given twice, the retry gets the CDI devices a clean prepare gives, and what the crash
left half done (a spec nobody holds, a temporary file) is swept.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from typing import Any

import pytest

from nodedra.lib import faults
from nodedra.policy import load_config
from nodedra.resmgr import Checkpoint
from tests.conftest import KubeletFactory, NodedraFactory
from tests.peers.controlplane import ControlPlane
from tests.peers.kubelet import KubeletError, KubeletHarness
from tests.peers.nodedra_node import TOPOLOGY_AWARE, NodedraProcess, start_claim_pod
from tests.reliability.helpers import AFTER_CRASH, POD_UID, check_state, state_on_disk

DEVICES = 4
"""The topology-aware devices of the fixture machine (four NUMA nodes)."""
GRACE = 20.0


@pytest.fixture
def kubelet(ready_node: str, kubelet_factory: KubeletFactory) -> KubeletHarness:
    harness = kubelet_factory(ready_node)
    harness.wait_slice_wipe("")
    return harness


def books(factory: NodedraFactory) -> dict[str, Any]:
    """The node's books as its files say."""
    dirs = factory.dirs
    return state_on_disk(dirs.checkpoint, dirs.cdi, dirs.plugin, load_config(factory.config))


def serve(
    factory: NodedraFactory,
    kubelet: KubeletHarness,
    cp: ControlPlane,
    env: Mapping[str, str] | None = None,
) -> NodedraProcess:
    """A new instance of nodedra on the node, serving: in the same pod as the one before
    (a pod UID, as deployed, and the same one: a crash restarts the container)."""
    nodedra = factory(kubelet, env=env, pod_uid=POD_UID)
    nodedra.wait_serving(cp, kubelet, TOPOLOGY_AWARE, DEVICES)
    return nodedra


@pytest.mark.parametrize("point", faults.POINTS)
def test_nodedra_run_killed_at_crash_point(
    workload_controllers: ControlPlane,
    namespace: str,
    kubelet: KubeletHarness,
    nodedra_factory: NodedraFactory,
    point: str,
) -> None:
    """Pod b holds a claim; nodedra dies in the middle of pod a's prepare (or unprepare)."""
    cp = workload_controllers
    node = kubelet.node_name
    unprepare = point.startswith("unprepare-")
    first = serve(nodedra_factory, kubelet, cp)
    claim_b = start_claim_pod(cp, namespace, node, "b", {"cpu": "4", "memory": "64Mi"})
    claim_a = start_claim_pod(cp, namespace, node, "a", {"cpu": "3", "memory": "32Mi"})
    uid_a, uid_b = claim_a["metadata"]["uid"], claim_b["metadata"]["uid"]
    kubelet.prepare(namespace, "b")
    clean_a = {"demo": [f"{TOPOLOGY_AWARE}/device=claim-{uid_a}-0"]}
    if unprepare:
        assert kubelet.prepare(namespace, "a") == clean_a
    before = books(nodedra_factory)
    check_state(before)
    spec_b = nodedra_factory.dirs.spec_path(TOPOLOGY_AWARE, uid_b).read_bytes()
    assert first.terminate(timeout=GRACE) == 0

    crashing = serve(nodedra_factory, kubelet, cp, env={faults.CRASH_AT: point})
    with pytest.raises(KubeletError):
        (kubelet.unprepare if unprepare else kubelet.prepare)(namespace, "a")
    assert crashing.wait_exit(30) == -signal.SIGKILL, crashing.log_text()[-2000:]
    in_checkpoint, has_spec = AFTER_CRASH[point]
    saved = Checkpoint(nodedra_factory.dirs.checkpoint).load()
    assert saved is not None
    assert (uid_a in saved.claims) is in_checkpoint
    assert nodedra_factory.dirs.spec_path(TOPOLOGY_AWARE, uid_a).exists() is has_spec
    assert saved.claims[uid_b] == before["claims"][uid_b]

    # Started again, as the DaemonSet would: what the crash left half done is swept.
    restarted = serve(nodedra_factory, kubelet, cp)
    started = books(nodedra_factory)
    check_state(started, every_claim_has_a_spec=(in_checkpoint, has_spec) != (True, False))
    assert (uid_a in started["claims"]) is in_checkpoint

    # The kubelet retries; it gets what a run without the crash gives.
    if unprepare:
        kubelet.unprepare(namespace, "a")
        assert not nodedra_factory.dirs.spec_path(TOPOLOGY_AWARE, uid_a).exists()
    else:
        assert kubelet.prepare(namespace, "a") == clean_a
    after = books(nodedra_factory)
    check_state(after)
    assert set(after["claims"]) == ({uid_b} if unprepare else {uid_a, uid_b})
    assert after["claims"][uid_b] == before["claims"][uid_b]
    assert nodedra_factory.dirs.spec_path(TOPOLOGY_AWARE, uid_b).read_bytes() == spec_b
    assert restarted.metric("nodedra_claims_held") == len(after["claims"])
    assert restarted.terminate(timeout=GRACE) == 0
