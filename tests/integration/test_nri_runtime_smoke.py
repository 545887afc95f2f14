"""Smoke tests of the NRI runtime harness against the official plugin library.

The harness (tests/peers/nri/cmd/nri-runtime) is containerd's NRI integration around the
official pkg/adaptation; the plugin here is the Go reference plugin on the official
pkg/stub (cmd/nri-stub-plugin). Both come from upstream code at each NRI version in
NRI_VERSIONS, so these tests check the harness itself: that it relays events, applies
adjustments and updates to its model, splits big syncs and survives restarts as
containerd does. The tests of nodedra's own NRI plugin can then trust what it reports.
"""

from __future__ import annotations

import socket

import pytest

from tests.peers.nri_protocol import (
    BulkSpec,
    ContainerSpec,
    PodSpec,
    Resources,
    cdi_device,
    env_name,
)
from tests.peers.nri_runtime import NRIFactory, NRIRuntime
from tests.peers.peer_groups import NRI_CONTAINERD, NRI_VERSIONS

ONLINE = "0-15"
CLAIM = "0b6f3a8e-5d1c-4e2a-9f7b-2c4d6e8f0a1b"
OTHER_CLAIM = "7c9e1f3a-2b4d-4c6e-8a0b-1d3f5a7c9e2f"
DRIVER = "topology-aware.nri.io"
STUB = "10-stub"

pytestmark = pytest.mark.parametrize(
    "version", NRI_VERSIONS, ids=[f"{v}-{NRI_CONTAINERD[v].replace(' ', '')}" for v in NRI_VERSIONS]
)


def _runtime_with_pod(factory: NRIFactory, version: str, pod: str = "pod-a") -> NRIRuntime:
    runtime = factory(version, online_cpus=ONLINE)
    runtime.run_pod(PodSpec(pod, namespace="ns"))
    return runtime


def test_harness_embeds_the_nri_version_it_stands_for(
    nri_runtime_factory: NRIFactory, version: str
) -> None:
    runtime = nri_runtime_factory(version)
    info = runtime.ping()
    assert info.nri_version == version
    assert info.containerd == NRI_CONTAINERD[version]
    # containerd fills Container.CDI_devices from 2.3 on (NRI v0.12); 2.0-2.2 drop them.
    assert info.fills_cdi_devices == (version == "v0.12.5")
    assert (info.registration_timeout_ms, info.request_timeout_ms) == (5000, 2000)
    assert len(str(runtime.socket)) <= 107


def test_silent_connection_is_refused_after_the_registration_timeout(
    nri_runtime_factory: NRIFactory, version: str
) -> None:
    runtime = nri_runtime_factory(version, registration_timeout=0.5)
    assert runtime.ping().registration_timeout_ms == 500
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(runtime.socket))  # and never registers
        (refusal,) = runtime.wait_refused(1)
        assert "timed out" in refusal.error
        assert refusal.plugin == ""
        conn.settimeout(10)
        assert conn.recv(1) == b"", "the runtime did not close the connection"
    # A plugin that does register afterwards is taken.
    nri_runtime_factory.stub_plugin(runtime)
    assert [p.name for p in runtime.plugins()] == [STUB]


def test_registration_configure_and_synchronize(
    nri_runtime_factory: NRIFactory, version: str
) -> None:
    runtime = nri_runtime_factory(version, online_cpus=ONLINE)
    runtime.add(
        pods=[PodSpec("pod-a", namespace="ns")],
        containers=[
            ContainerSpec("held", "pod-a", env=[f"{env_name(CLAIM, 0)}=2-3"]),
            ContainerSpec("free", "pod-a"),
        ],
    )
    nri_runtime_factory.stub_plugin(runtime, claims={CLAIM: ("2-3", "0")})

    (plugin,) = runtime.plugins()
    assert (plugin.name, plugin.index, plugin.base) == (STUB, "10", "stub")
    assert plugin.synchronized
    assert not plugin.closed
    for event in ("CREATE_CONTAINER", "UPDATE_CONTAINER", "STOP_CONTAINER", "REMOVE_CONTAINER"):
        assert plugin.subscribed(event), event
    assert not plugin.subscribed("RUN_POD_SANDBOX")

    (sync,) = runtime.syncs()
    assert (sync.plugin, sync.pods, sync.containers, sync.updates) == (STUB, 1, 2, 2)
    assert sync.done
    assert not sync.error
    assert not sync.split
    assert all(o.applied for o in sync.outcomes)
    model = {c.id: c for c in runtime.containers()}
    assert (model["held"].cpus, model["held"].mems) == ("2-3", "0")
    assert model["free"].cpus == "0-1,4-15"


def test_synchronize_of_1000_containers_is_split_into_chunks(
    nri_runtime_factory: NRIFactory, version: str
) -> None:
    runtime = nri_runtime_factory(version, online_cpus=ONLINE)
    # 5 KiB of annotations each make the whole state about 5 MiB, above ttrpc's 4 MiB.
    bulk = BulkSpec(containers=1000, pods=20, annotation_bytes=5000)
    runtime.add(bulk=bulk)
    runtime.add(containers=[ContainerSpec("held", "bulk-pod-0", env=[f"{env_name(CLAIM, 0)}=x"])])
    nri_runtime_factory.stub_plugin(runtime, claims={CLAIM: ("4-7", "0")})

    (sync,) = runtime.wait_sync(1)
    assert (sync.pods, sync.containers) == (20, 1001)
    assert sync.split, f"one message for {sync.containers} containers: {sync.chunks}"
    assert any("exceed" in c.error for c in sync.chunks), "no oversized attempt came first"
    messages = sync.messages
    assert [m.more for m in messages] == [True] * (len(messages) - 1) + [False]
    assert sum(m.containers for m in messages) == 1001
    assert sum(m.pods for m in messages) == 20
    # The stub answers every "more" chunk with nothing and all updates at the end.
    assert [m.updates for m in messages[:-1]] == [0] * (len(messages) - 1)
    assert sync.updates == messages[-1].updates == 1001
    assert "(more: true)" in runtime.log_text()

    model = {c.id: c for c in runtime.containers()}
    assert {model[i].cpus for i in bulk.container_ids()} == {"0-3,8-15"}
    assert (model["held"].cpus, model["held"].mems) == ("4-7", "0")


def test_created_container_holding_a_claim_by_env_marker_gets_its_cpus(
    nri_runtime_factory: NRIFactory, version: str
) -> None:
    runtime = _runtime_with_pod(nri_runtime_factory, version)
    nri_runtime_factory.stub_plugin(runtime, claims={CLAIM: ("2-3", "0"), OTHER_CLAIM: ("5", "")})
    result = runtime.create_container(
        ContainerSpec(
            "ctr-1",
            "pod-a",
            env=[f"{env_name(CLAIM, 0)}=2-3", f"{env_name(OTHER_CLAIM, 0)}=5"],
            resources=Resources(shares=512, memory_limit=1 << 30),
        ),
        start=True,
    )
    assert result.adjust is not None
    assert (result.adjust.cpus, result.adjust.mems) == ("2-3,5", "0")
    assert result.started
    assert not result.start_error
    assert result.updates == ()
    assert result.evictions == ()
    ctr = runtime.container("ctr-1")
    assert (ctr.state, ctr.cpus, ctr.mems) == ("running", "2-3,5", "0")
    # What the kubelet asked for stays, beside what the plugin set.
    assert (ctr.resources.shares, ctr.resources.memory_limit) == (512, 1 << 30)
    assert ctr.env_map()[env_name(CLAIM, 0)] == "2-3"


def test_cdi_device_names_reach_the_plugin_only_from_nri_v012(
    nri_runtime_factory: NRIFactory, version: str
) -> None:
    runtime = _runtime_with_pod(nri_runtime_factory, version)
    nri_runtime_factory.stub_plugin(runtime, claims={CLAIM: ("2-3", "0")}, driver=DRIVER)
    result = runtime.create_container(
        ContainerSpec("ctr-cdi", "pod-a", cdi_devices=[cdi_device(DRIVER, CLAIM, 0)]),
        start=True,
    )
    ctr = result.container
    assert ctr.cdi_devices == (cdi_device(DRIVER, CLAIM, 0),)
    if version == "v0.12.5":
        assert (ctr.cpus, ctr.mems) == ("2-3", "0")
    else:
        # containerd 2.0-2.2 do not pass CDI names to plugins: no claim to be seen.
        assert (ctr.cpus, ctr.mems) == ("0-1,4-15", "")


def test_container_lifecycle_without_claims(nri_runtime_factory: NRIFactory, version: str) -> None:
    runtime = _runtime_with_pod(nri_runtime_factory, version)
    nri_runtime_factory.stub_plugin(runtime, claims={CLAIM: ("2-3", "0")})
    created = runtime.create_container(ContainerSpec("plain", "pod-a"), start=True)
    assert created.container.cpus == "0-1,4-15"

    # The kubelet (CPU manager "none", a resize) asks for all CPUs and new shares; the
    # plugin keeps its pinning, the shares go through.
    update = runtime.update_container("plain", Resources(cpus=ONLINE, shares=2048))
    assert update.plugins_changed
    assert (update.requested.cpus, update.applied.cpus) == (ONLINE, "0-1,4-15")
    assert (update.container.cpus, update.container.resources.shares) == ("0-1,4-15", 2048)

    stopped = runtime.stop_container("plain", exit_code=3)
    assert stopped.container is not None
    assert (stopped.container.state, stopped.container.exit_code) == ("stopped", 3)
    runtime.remove_container("plain")
    assert [c.id for c in runtime.containers()] == []
    runtime.remove_pod("pod-a")
    assert runtime.pods() == []

    events = [(e.method, e.event) for e in runtime.events() if e.container == "plain"]
    removal = (
        ("RemoveContainer", "REMOVE_CONTAINER")
        if version == "v0.12.5"
        else ("StateChange", "REMOVE_CONTAINER")  # NRI < v0.12 has no dedicated RPC
    )
    assert events == [
        ("CreateContainer", "CREATE_CONTAINER"),
        ("UpdateContainer", "UPDATE_CONTAINER"),
        ("StopContainer", "STOP_CONTAINER"),
        removal,
    ]
    assert all(not e.error for e in runtime.events())


def test_claims_change_sends_unsolicited_updates_into_the_model(
    nri_runtime_factory: NRIFactory, version: str
) -> None:
    runtime = _runtime_with_pod(nri_runtime_factory, version)
    plugin = nri_runtime_factory.stub_plugin(runtime, claims={CLAIM: ("2-3", "0")})
    runtime.create_container(
        ContainerSpec("held", "pod-a", env=[f"{env_name(CLAIM, 0)}=x"]), start=True
    )
    runtime.create_container(ContainerSpec("free", "pod-a"), start=True)

    plugin.set_claims({CLAIM: ("8-11", "0")})
    (call,) = runtime.wait_unsolicited(1)
    assert call.updates == 2
    assert call.failed == ()
    assert not call.error
    assert {o.container_id for o in call.outcomes if o.applied} == {"held", "free"}
    model = {c.id: c for c in runtime.containers()}
    assert model["held"].cpus == "8-11"
    assert model["free"].cpus == "0-7,12-15"


def test_failed_unsolicited_update_leaves_the_container_and_fails_the_call(
    nri_runtime_factory: NRIFactory, version: str
) -> None:
    runtime = _runtime_with_pod(nri_runtime_factory, version)
    plugin = nri_runtime_factory.stub_plugin(runtime, claims={CLAIM: ("2-3", "0")})
    runtime.create_container(
        ContainerSpec("held", "pod-a", env=[f"{env_name(CLAIM, 0)}=x"]), start=True
    )
    runtime.create_container(ContainerSpec("free", "pod-a"), start=True)
    runtime.fail_updates(["held"], "runc update: device or resource busy")

    plugin.set_claims({CLAIM: ("4-5", "0")})
    (call,) = runtime.wait_unsolicited(1)
    # containerd reports the update back as failed and fails the whole call.
    assert call.failed == ("held",)
    assert "failed" in call.error
    outcomes = {o.container_id: o.outcome for o in call.outcomes}
    assert outcomes["free"] == "applied"
    assert outcomes["held"].startswith("failed:")
    model = {c.id: c for c in runtime.containers()}
    assert model["held"].cpus == "2-3"  # unchanged
    assert model["free"].cpus == "0-3,6-15"


def test_failed_update_marked_ignore_failure_is_not_reported(
    nri_runtime_factory: NRIFactory, version: str
) -> None:
    runtime = _runtime_with_pod(nri_runtime_factory, version)
    plugin = nri_runtime_factory.stub_plugin(
        runtime, claims={CLAIM: ("2-3", "0")}, ignore_failure=True
    )
    runtime.create_container(
        ContainerSpec("held", "pod-a", env=[f"{env_name(CLAIM, 0)}=x"]), start=True
    )
    runtime.fail_updates(["held"])

    plugin.set_claims({CLAIM: ("4-5", "0")})
    (call,) = runtime.wait_unsolicited(1)
    assert call.failed == ()
    assert not call.error
    (outcome,) = call.outcomes
    assert outcome.ignore_failure
    assert outcome.outcome.startswith("ignored failure:")
    assert runtime.container("held").cpus == "2-3"  # unchanged all the same


def test_runtime_restart_plugin_reconnects_and_resynchronizes(
    nri_runtime_factory: NRIFactory, version: str
) -> None:
    runtime = _runtime_with_pod(nri_runtime_factory, version)
    plugin = nri_runtime_factory.stub_plugin(runtime, claims={CLAIM: ("2-3", "0")})
    runtime.create_container(
        ContainerSpec("held", "pod-a", env=[f"{env_name(CLAIM, 0)}=x"]), start=True
    )
    before = runtime.containers()

    generation = runtime.restart(down=0.3)
    assert generation == 2
    record = runtime.wait_plugin(STUB)
    assert record.generation == 2
    assert record.synchronized
    assert plugin.alive()
    # The first connection was closed by the restart; the plugin made a new one.
    assert [(p.generation, p.closed) for p in runtime.plugins()] == [(1, True), (2, False)]

    syncs = runtime.wait_sync(2)
    assert [s.generation for s in syncs] == [1, 2]
    assert (syncs[1].pods, syncs[1].containers) == (1, 1)
    assert syncs[1].updates == 0  # the model kept what the plugin had set
    assert runtime.containers() == before

    created = runtime.create_container(ContainerSpec("after", "pod-a"), start=True)
    assert created.container.cpus == "0-1,4-15"
