"""nodedra's kubelet plugin against the real peers: the API server validates its slices, the
kubelet's own plugin manager registers it, and the kubelet's DRA manager prepares pods'
claims through it. The resource manager and both policies are the real ones."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from kubernetes.client import ApiClient

from nodedra.dra import KubeAPIError, KubeClusterAPI, Options, Plugin, driver_name
from nodedra.grpc_gen import dra_v1_pb2, dra_v1_pb2_grpc
from nodedra.lib.quantity import parse_quantity
from nodedra.policy import make_policy, parse_config
from nodedra.resmgr import ManagerOptions, ResourceManager
from nodedra.topology import parse_cpu_list, read_topology
from tests.conftest import GoDriverFactory, KubeletFactory, admin_client
from tests.peers.build import PeerBinaries
from tests.peers.cluster import (
    create_ready_node,
    delete_node,
    get_claim,
    pod_claim_name,
    pod_on,
    poll,
    resource_slices,
    wait_for_slices,
    wait_pod_scheduled,
)
from tests.peers.controlplane import APIError, ControlPlane, feature_gates_flag
from tests.peers.kubelet import KubeletHarness
from tests.peers.profile import ClusterProfile, settable_gates
from tests.unit.dra.fakes import FakeOwner, FakePolicy, devices

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sysfs"
SHAPE = FIXTURES / "two-socket-smt2-numa4"
TA = driver_name("topology-aware")
STATIC = driver_name("static")


class Nodedra:
    """nodedra's resource manager and plugin for one node, on the harness's registry."""

    def __init__(
        self, api: ApiClient, node: str, registry: Path, workdir: Path, policy: str
    ) -> None:
        self.workdir = workdir
        self.config = parse_config({"policy": policy})
        self.options = ManagerOptions(
            node_name=node,
            registrar_dir=registry,
            plugin_data_dir=workdir / "plugin",
            cdi_dir=workdir / "cdi",
            state_dir=workdir / "state",
            resync_period=1.0,
            whole_devices_allowed=True,  # the fallback where the gate is off, as it says
        )
        self.api = api
        self.shutdowns: list[str] = []
        self.manager = self.new()

    def new(self) -> ResourceManager:
        """A manager as a (re)started process builds it."""
        return ResourceManager(
            make_policy(read_topology(SHAPE), self.config),
            KubeClusterAPI(self.api),
            self.options,
            self.shutdowns.append,
        )

    @property
    def driver(self) -> str:
        return self.manager.driver


NodedraFactory = Callable[..., Nodedra]


@pytest.fixture
def nodedra(
    control_plane: ControlPlane, admin_api: ApiClient, peer_workdir: Path
) -> Iterator[NodedraFactory]:
    """Starts nodedra on a kubelet's node and waits until it is registered and published."""
    started: list[Nodedra] = []

    def start(kubelet: KubeletHarness, policy: str = "topology-aware") -> Nodedra:
        node = Nodedra(
            admin_api,
            kubelet.node_name,
            kubelet.registry_dir,
            peer_workdir / f"nodedra-{len(started)}",
            policy,
        )
        node.manager.start()
        started.append(node)
        kubelet.wait_registered(node.driver)
        devices = len(node.manager.policy.devices())
        wait_for_slices(control_plane, kubelet.node_name, node.driver, devices)
        return node

    yield start
    for node in started:
        node.manager.stop()


def started_kubelet(kubelet_factory: KubeletFactory, node: str) -> KubeletHarness:
    kubelet = kubelet_factory(node)
    kubelet.wait_slice_wipe("")  # the kubelet wipes the node's slices once, at start
    return kubelet


# --- registration ---------------------------------------------------------------------


def test_registers_with_v1_and_again_after_a_restart(
    ready_node: str, kubelet_factory: KubeletFactory, nodedra: NodedraFactory
) -> None:
    kubelet = started_kubelet(kubelet_factory, ready_node)
    node = nodedra(kubelet)
    plugin = kubelet.wait_registered(TA)
    assert plugin.chosen_service == "v1.DRAPlugin"
    assert plugin.versions == ("v1.DRAPlugin", "v1beta1.DRAPlugin")
    assert plugin.endpoint == str(node.manager.plugin.sockets.dra)

    node.manager.stop()
    kubelet.wait_unregistered(TA)
    assert not node.manager.plugin.sockets.registration.exists()

    node.manager = node.new()
    node.manager.start()
    again = kubelet.wait_registered(TA)
    assert again.chosen_service == "v1.DRAPlugin"


HEALTH_OBSERVED = 7.0
"""Seconds a kubelet is watched for a health stream it would ask again: more than the 5 s
after which its releases up to 1.36 retry a failed one."""


def test_a_kubelet_asking_for_device_health_waits_and_asks_nothing_more(
    control_plane: ControlPlane,
    ready_node: str,
    *,
    kubelet_factory: KubeletFactory,
    nodedra: NodedraFactory,
    peer_binaries: PeerBinaries,
    cluster_profile: ClusterProfile,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With ResourceHealthStatus on, kubelets up to 1.36 open a health stream to every
    driver; refused, they log an error and ask again every 5 s. nodedra's stream stays
    open and says nothing: one stream, no error. 1.37 asks only a driver that advertises
    the service, and nodedra does not."""
    gates = dict(control_plane.feature_gates)
    if "ResourceHealthStatus" in settable_gates(peer_binaries.kube_apiserver):
        gates["ResourceHealthStatus"] = True
    caplog.set_level(logging.INFO, logger="nodedra.dra.service")
    kubelet = kubelet_factory(ready_node, feature_gates=feature_gates_flag(gates))
    kubelet.wait_slice_wipe("")
    nodedra(kubelet)
    asks = cluster_profile.minor < 37

    def log() -> str:
        return kubelet.log_path.read_text(errors="replace")

    if asks:
        poll(
            lambda: "Successfully started WatchResources" in log() or None,
            30,
            lambda: f"the kubelet opening a health stream; its log: {kubelet.log_tail()}",
        )
    time.sleep(HEALTH_OBSERVED)  # the time in which a refused stream is asked again
    seen = log()
    assert seen.count("Attempting to start WatchResources") == int(asks), kubelet.log_tail()
    assert "Error receiving from WatchResources" not in seen
    opened = [r for r in caplog.records if "opened a device health stream" in r.getMessage()]
    assert len(opened) == int(asks)


# --- ResourceSlices -------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["topology-aware", "static"])
def test_policy_devices_pass_real_validation_unchanged(
    control_plane: ControlPlane,
    ready_node: str,
    *,
    cluster_profile: ClusterProfile,
    kubelet_factory: KubeletFactory,
    nodedra: NodedraFactory,
    policy: str,
) -> None:
    """What the policy publishes, less what this cluster's gates leave out, is stored as is."""
    kubelet = started_kubelet(kubelet_factory, ready_node)
    node = nodedra(kubelet, policy)
    expected = cluster_profile.as_published(node.manager.policy.devices())
    stored = wait_for_slices(control_plane, ready_node, node.driver, len(expected))
    assert stored == expected, "the API server kept every field as nodedra wrote it"
    mapped = cluster_profile.on("DRANodeAllocatableResources")
    assert all((cluster_profile.node_allocatable_field in d) is mapped for d in stored)


def plain_plugin(api: ApiClient, node: str, workdir: Path, driver: str) -> Plugin:
    """A plugin with fakes of our own Owner and policy: only publishing matters here."""
    return Plugin(
        driver,
        Options(
            node_name=node,
            kube_client=KubeClusterAPI(api),
            owner=FakeOwner(),
            policy=FakePolicy(),
            registrar_dir=workdir / "registry",
            plugin_data_dir=workdir / "plugin",
            cdi_dir=workdir / "cdi",
            resync_period=1.0,
            whole_devices_allowed=True,  # the fallback where the gate is off, as it says
        ),
    )


@pytest.fixture
def publisher(admin_api: ApiClient, ready_node: str, peer_workdir: Path) -> Iterator[Plugin]:
    plugin = plain_plugin(admin_api, ready_node, peer_workdir, f"p{uuid.uuid4().hex[:8]}.nri.io")
    yield plugin
    plugin.stop()


def test_slices_split_at_the_real_limits(
    control_plane: ControlPlane,
    cluster_profile: ClusterProfile,
    admin_api: ApiClient,
    ready_node: str,
    publisher: Plugin,
) -> None:
    driver = publisher.driver_name
    publisher.publish(devices(300))
    publisher.start()
    assert publisher.wait_published(30) is not None
    slices = resource_slices(control_plane, ready_node, driver)
    assert sorted(len(s["spec"]["devices"]) for s in slices) == [44, 128, 128]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {3}

    tainted = devices(100)
    for device in tainted[:10]:
        device["taints"] = [{"key": "example.com/maintenance", "effect": "NoSchedule"}]
    publisher.publish(tainted)
    assert publisher.wait_published(30) is not None
    assert sorted(
        len(s["spec"]["devices"]) for s in resource_slices(control_plane, ready_node, driver)
    ) == [36, 64]

    # The limits are the API server's, not ours: one device more is refused.
    api = KubeClusterAPI(admin_api)
    oversized: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": "oversized-"},
        "spec": {
            "driver": driver,
            "nodeName": ready_node,
            "pool": {"name": "oversized", "generation": 1, "resourceSliceCount": 1},
            "devices": devices(129),
        },
    }
    with pytest.raises(KubeAPIError) as refused:
        api.create_slice(oversized, dry_run=True)
    assert refused.value.status == 422
    oversized["spec"]["devices"] = tainted[:65]
    if cluster_profile.minor > 34 and cluster_profile.on("DRADeviceTaints"):
        with pytest.raises(KubeAPIError):
            api.create_slice(oversized, dry_run=True)
    else:  # 1.34 has one limit, whatever the devices have; so has a server without taints
        api.create_slice(oversized, dry_run=True)


def test_generation_and_restoration(
    control_plane: ControlPlane, admin_api: ApiClient, ready_node: str, publisher: Plugin
) -> None:
    driver = publisher.driver_name
    publisher.publish(devices(128))
    publisher.start()
    report = publisher.wait_published(30)
    assert report is not None
    assert report.generation == 1
    publisher.publish(devices(129))
    report = publisher.wait_published(30)
    assert report is not None
    assert (report.generation, report.created) == (2, 1)
    slices = resource_slices(control_plane, ready_node, driver)
    assert {
        (s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"]) for s in slices
    } == {(2, 2)}

    # What the kubelet does when it starts, or 30 s after a driver went away.
    control_plane.request(
        "DELETE",
        f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3D{ready_node}",
    )
    assert sorted(
        d["name"] for d in wait_for_slices(control_plane, ready_node, driver, 129)
    ) == sorted(d["name"] for d in devices(129))


def test_list_attributes_probe_on_a_real_server(
    cluster_profile: ClusterProfile, publisher: Plugin
) -> None:
    supported = publisher.list_attributes_supported()
    assert supported is cluster_profile.on("DRAListTypeAttributes")


def test_node_allocatable_mappings_reach_a_real_server(
    control_plane: ControlPlane, cluster_profile: ClusterProfile, ready_node: str, publisher: Plugin
) -> None:
    """With DRANodeAllocatableResources the probe says so and the field is stored, as the
    release spells it; without, the devices are published without it."""
    driver = publisher.driver_name
    mapping = {"cpu": {"mapping": {"deviceMultiplier": "1"}}}
    mapped = [{**d, "nodeAllocatableResources": mapping} for d in devices(2)]
    publisher.publish(mapped)
    publisher.start()
    assert publisher.wait_published(30) is not None
    on = cluster_profile.on("DRANodeAllocatableResources")
    assert publisher.feature_gates() == {"DRANodeAllocatableResources": on}
    stored = [
        d for s in resource_slices(control_plane, ready_node, driver) for d in s["spec"]["devices"]
    ]
    assert stored == cluster_profile.as_published(mapped)
    assert all((cluster_profile.node_allocatable_field in d) is on for d in stored)


@pytest.fixture(scope="module")
def gate_off(
    control_plane: ControlPlane,
    cluster_profile: ClusterProfile,
    peer_binaries: PeerBinaries,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ControlPlane]:
    """A control plane whose API server has DRANodeAllocatableResources off: the run's own
    where it is (a release without it, or the gates off), else one of its own."""
    if not cluster_profile.on("DRANodeAllocatableResources"):
        yield control_plane
        return
    cp = ControlPlane(
        peer_binaries,
        tmp_path_factory.mktemp("gate-off"),
        {**control_plane.feature_gates, "DRANodeAllocatableResources": False},
    )
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


@pytest.mark.parametrize("why", ["api-server-gate-off", "kubelet-without-it"])
def test_devices_are_published_without_mappings_the_server_would_not_keep(
    request: pytest.FixtureRequest, why: str, peer_workdir: Path, cluster_profile: ClusterProfile
) -> None:
    """An API server with the gate off drops the field; one with it on refuses it for a node
    whose kubelet does not declare the feature. Either way the policy's devices are published
    without it, stored as published, and not rewritten pass after pass. (1.36 takes its
    spelling whatever the node declares: its kubelet does not apply the mappings, only the
    scheduler counts them; there the devices are published with them.)"""
    node = f"no-mappings-{uuid.uuid4().hex[:8]}"
    if why == "api-server-gate-off":
        cp: ControlPlane = request.getfixturevalue("gate_off")
        create_ready_node(cp, node)
    else:
        cp = request.getfixturevalue("control_plane")
        create_ready_node(cp, node, features=())
    wanted = make_policy(read_topology(SHAPE), parse_config({"policy": "topology-aware"})).devices()
    assert all("nodeAllocatableResources" in d for d in wanted)
    with admin_client(cp) as client:
        plugin = plain_plugin(client, node, peer_workdir, TA)
        plugin.publish(wanted)
        plugin.start()
        try:
            assert plugin.wait_published(30) is not None
            versions = {
                s["metadata"]["name"]: s["metadata"]["resourceVersion"]
                for s in resource_slices(cp, node, TA)
            }
            for _ in range(3):
                plugin.resync()
                report = plugin.wait_published(30)
                assert report is not None
                assert report.writes == 0
        finally:
            plugin.stop()
    stored = resource_slices(cp, node, TA)
    delete_node(cp, node)
    assert {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in stored} == versions
    devices_stored = [d for s in stored for d in s["spec"]["devices"]]
    assert [d["name"] for d in devices_stored] == [d["name"] for d in wanted]
    field = cluster_profile.node_allocatable_field
    kept = (
        why == "kubelet-without-it"
        and field != "nodeAllocatableResources"
        and cluster_profile.on("DRANodeAllocatableResources")
    )
    assert not any("nodeAllocatableResources" in d for d in devices_stored)
    assert all((field in d) is kept for d in devices_stored)
    assert plugin.feature_gates()["DRANodeAllocatableResources"] is kept


def test_claim_get_errors_are_the_servers(admin_api: ApiClient) -> None:
    api = KubeClusterAPI(admin_api)
    with pytest.raises(KubeAPIError) as missing:
        api.get_claim("default", "no-such-claim")
    assert missing.value.not_found
    assert 'resourceclaims.resource.k8s.io "no-such-claim" not found' in str(missing.value)
    api.delete_slice("no-such-slice", "uid", "1")  # already gone is fine


# --- claims end to end ------------------------------------------------------------------


def ensure(cp: ControlPlane, path: str, body: dict[str, Any]) -> None:
    try:
        cp.request("POST", path, body)
    except APIError as err:
        if err.status != 409:
            raise


def device_class(cp: ControlPlane, driver: str) -> str:
    ensure(
        cp,
        "/apis/resource.k8s.io/v1/deviceclasses",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": driver},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        },
    )
    return driver


def create_pod(
    cp: ControlPlane,
    namespace: str,
    node: str,
    requests: list[dict[str, Any]],
    name: str = "consumer",
) -> dict[str, Any]:
    """A pod with one claim from a template of ``requests``, placed by the scheduler."""
    cp.request(
        "POST",
        f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": requests}}},
        },
    )
    container = {
        "name": "app",
        "image": "registry.invalid/none:0",
        "resources": {"claims": [{"name": "cpus"}]},
    }
    cp.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        pod_on(node, name, [container], [{"name": "cpus", "resourceClaimTemplateName": name}]),
    )
    pod = wait_pod_scheduled(cp, namespace, name)
    assert pod["spec"]["nodeName"] == node
    claim_name = pod_claim_name(pod, "cpus")
    assert claim_name is not None
    return get_claim(cp, namespace, claim_name)


def test_pod_claim_end_to_end(
    workload_controllers: ControlPlane,
    namespace: str,
    ready_node: str,
    kubelet_factory: KubeletFactory,
    nodedra: NodedraFactory,
    *,
    cluster_profile: ClusterProfile,
) -> None:
    """A claim of 3 CPUs and 256Mi; without DRAConsumableCapacity the request is dropped and
    the claim gets its whole device."""
    cp = workload_controllers
    kubelet = started_kubelet(kubelet_factory, ready_node)
    node = nodedra(kubelet)
    request = {
        "name": "cpus",
        "exactly": {
            "deviceClassName": device_class(cp, TA),
            "capacity": {"requests": {"cpu": "3", "memory": "256Mi"}},
        },
    }
    claim = create_pod(cp, namespace, ready_node, [request])
    uid = claim["metadata"]["uid"]
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (TA, ready_node)
    node_id = int(result["device"].removeprefix("cpudevnuma"))
    if cluster_profile.on("DRAConsumableCapacity"):
        consumed = {k: parse_quantity(v) for k, v in result["consumedCapacity"].items()}
        # The huge pages of the device, asked for by no one, are consumed as none.
        assert {k: n for k, n in consumed.items() if n} == {"cpu": 3, "memory": 256 << 20}, consumed
        want_cpus, want_memory = 3, 256 << 20
    else:
        assert "consumedCapacity" not in result
        (device,) = [d for d in node.manager.policy.devices() if d["name"] == result["device"]]
        want_cpus = len(read_topology(SHAPE).nodes[node_id].cpus)
        want_memory = int(parse_quantity(device["capacity"]["memory"]["value"]))

    containers = kubelet.prepare(namespace, "consumer")
    assert containers == {"app": [f"{TA}/device=claim-{uid}-0"]}
    spec = yaml.safe_load(node.manager.plugin.cdi.spec_path(uid).read_text())
    assert spec["cdiVersion"] == "0.3.0"
    assert spec["kind"] == f"{TA}/device"
    (cdi_device,) = spec["devices"]
    assert cdi_device["name"] == f"claim-{uid}-0"
    env = dict(e.split("=", 1) for e in cdi_device["containerEdits"]["env"])
    suffix = f"{uid.replace('-', '_')}_0"
    cpus = parse_cpu_list(env[f"DRA_CPUSET_{suffix}"])
    assert len(cpus) == want_cpus
    assert cpus <= read_topology(SHAPE).nodes[node_id].cpus
    assert env[f"DRA_MEMORY_{suffix}"] == str(want_memory)
    assert env[f"DRA_MEMSET_{suffix}"] == str(node_id)
    free_while_held = node.manager.policy.free_cpus()  # type: ignore[attr-defined]

    kubelet.unprepare(namespace, "consumer")
    assert not node.manager.plugin.cdi.has_claim(uid)
    assert node.manager.policy.claim_uids() == frozenset()
    assert node.manager.policy.free_cpus() == free_while_held | cpus  # type: ignore[attr-defined]


def test_claim_spanning_two_drivers(  # noqa: PLR0917
    workload_controllers: ControlPlane,
    namespace: str,
    ready_node: str,
    kubelet_factory: KubeletFactory,
    go_driver_factory: GoDriverFactory,
    nodedra: NodedraFactory,
) -> None:
    cp = workload_controllers
    kubelet = started_kubelet(kubelet_factory, ready_node)
    node = nodedra(kubelet, "static")
    go = go_driver_factory(kubelet)
    kubelet.wait_registered(go.driver_name)
    wait_for_slices(cp, ready_node, go.driver_name, 4)
    claim = create_pod(
        cp,
        namespace,
        ready_node,
        [
            {"name": "gpu", "exactly": {"deviceClassName": device_class(cp, go.driver_name)}},
            {"name": "cpus", "exactly": {"deviceClassName": device_class(cp, STATIC), "count": 2}},
        ],
    )
    uid = claim["metadata"]["uid"]
    containers = kubelet.prepare(namespace, "consumer")
    assert sorted(containers["app"]) == sorted(
        [
            f"{go.driver_name}/device=claim-{uid}-0",
            f"{STATIC}/device=claim-{uid}-0",
            f"{STATIC}/device=claim-{uid}-1",
        ]
    )
    ours = yaml.safe_load(node.manager.plugin.cdi.spec_path(uid).read_text())
    assert [d["name"] for d in ours["devices"]] == [f"claim-{uid}-0", f"claim-{uid}-1"]
    assert go.spec_path(uid).exists()
    kubelet.unprepare(namespace, "consumer")
    assert not node.manager.plugin.cdi.has_claim(uid)
    assert not go.spec_path(uid).exists()


def test_prepare_twice_and_unprepare_unknown_over_the_socket(
    workload_controllers: ControlPlane,
    namespace: str,
    ready_node: str,
    kubelet_factory: KubeletFactory,
    nodedra: NodedraFactory,
) -> None:
    """The kubelet repeats prepare after a restart; it unprepares claims we never saw."""
    cp = workload_controllers
    kubelet = started_kubelet(kubelet_factory, ready_node)
    node = nodedra(kubelet, "static")
    claim = create_pod(
        cp,
        namespace,
        ready_node,
        [{"name": "cpus", "exactly": {"deviceClassName": device_class(cp, STATIC)}}],
    )
    meta = claim["metadata"]
    ref = dra_v1_pb2.Claim(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])
    with grpc.insecure_channel(f"unix:{node.manager.plugin.sockets.dra}") as channel:
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
        first = stub.NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=[ref]), timeout=30
        )
        second = stub.NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=[ref]), timeout=30
        )
        assert first == second
        assert first.claims[meta["uid"]].error == ""
        assert len(first.claims[meta["uid"]].devices) == 1
        unknown = dra_v1_pb2.Claim(
            namespace=namespace, name="never-prepared", uid=str(uuid.uuid4())
        )
        answer = stub.NodeUnprepareResources(
            dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[unknown, ref]), timeout=30
        )
    assert set(answer.claims) == {unknown.uid, meta["uid"]}
    assert all(entry.error == "" for entry in answer.claims.values())
    assert node.manager.policy.claim_uids() == frozenset()
