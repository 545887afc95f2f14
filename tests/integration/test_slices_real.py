"""SliceApplier and SlicePublisher against the real API server, through KubeClusterAPI.

Every test publishes for a driver name of its own, so tests never see each other's slices.
What the server stores is read back as the admin, through a client other than the one
under test (tests.peers.cluster).
"""

from __future__ import annotations

import copy
import threading
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from kubernetes.client import ApiClient

from nodedra.dra import KubeAPIError, KubeClusterAPI, RecoverableError
from nodedra.dra.probes import CONSUMABLE_CAPACITY
from nodedra.dra.publisher import SlicePublisher
from nodedra.dra.slices import SliceApplier
from nodedra.policy import make_policy, parse_config
from nodedra.topology import format_cpu_list, read_topology
from tests.peers.cluster import create_ready_node, delete_node, resource_slices
from tests.peers.controlplane import ControlPlane
from tests.peers.profile import ClusterProfile
from tests.unit.topology.sysfs_trees import FIXTURES, SHAPES

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


#: Whether the API server keeps what DRAConsumableCapacity adds (set for the module from the
#: run's profile): devices use it only then, as nodedra publishes them.
CONSUMABLE = {"capacity": True}


@pytest.fixture(autouse=True, scope="module")
def _consumable(cluster_profile: ClusterProfile) -> None:
    CONSUMABLE["capacity"] = cluster_profile.on("DRAConsumableCapacity")


def rich_devices(count: int, prefix: str = "cpudevnuma") -> list[dict[str, Any]]:
    """Devices like the topology-aware policy's, with attributes of every scalar type
    (and, where the server keeps them, request policies and multiple allocations).

    Every fourth device offers 64000 MiB: the server stores that quantity as "67108864k",
    not as the "67108864000" we write.
    """
    devices = [
        {
            "name": f"{prefix}{i:04d}",
            "attributes": {
                "resource.kubernetes.io/numaNode": {"int": i},
                "smtEnabled": {"bool": i % 2 == 0},
                "model": {"string": "Xeon Gold 6438Y+"},
                "microcode": {"version": "1.2.3"},
            },
            "capacity": {
                "cpu": {
                    "value": "14",
                    "requestPolicy": {"default": "1", "validRange": {"min": "1", "step": "1"}},
                },
                "memory": {
                    "value": "67108864000" if i % 4 == 3 else "103079215104",
                    "requestPolicy": {
                        "default": "0",
                        "validRange": {"min": "0", "step": "1048576"},
                    },
                },
            },
            "allowMultipleAllocations": True,
        }
        for i in range(count)
    ]
    if CONSUMABLE["capacity"]:
        return devices
    return [dict(CONSUMABLE_CAPACITY.without(d)) for d in devices]


def as_stored(devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``devices`` (of rich_devices) as the server gives them back."""
    stored = copy.deepcopy(devices)
    for device in stored:
        memory = device["capacity"]["memory"]
        if memory["value"] == "67108864000":
            memory["value"] = "67108864k"
    return stored


def spelled_out_devices(count: int) -> list[dict[str, Any]]:
    """Devices with quantities the server writes in other forms ("1024Mi" is "1Gi")."""
    return [
        {
            "name": f"dev{i}",
            "capacity": {
                "bytes": {"value": "1024Mi"},
                "count": {"value": "2000"},
                "share": {"value": "0.5"},
                "power": {"value": "1e3"},
            },
            "attributes": {},
        }
        for i in range(count)
    ]


def tainted_devices(count: int) -> list[dict[str, Any]]:
    """Devices with taints, which the server stamps with the time it first saw them."""
    devices = rich_devices(count)
    for device in devices:
        device["taints"] = [{"key": "example.com/maintenance", "effect": "NoSchedule"}]
    return devices


@pytest.fixture
def api(admin_api: ApiClient) -> KubeClusterAPI:
    return KubeClusterAPI(admin_api)


@pytest.fixture
def driver() -> str:
    return f"s{uuid.uuid4().hex[:8]}.nri.io"


@pytest.fixture
def applier(api: KubeClusterAPI, ready_node: str, driver: str) -> SliceApplier:
    return SliceApplier(api, ready_node, driver)


@pytest.fixture
def restarted(api: KubeClusterAPI, ready_node: str, driver: str) -> Callable[[], SliceApplier]:
    """A new applier of the same pool, as a restarted plugin makes: it remembers nothing."""
    return lambda: SliceApplier(api, ready_node, driver)


class Pool:
    """What the server has of one driver's slices on one node, read as the admin."""

    def __init__(self, cp: ControlPlane, node: str, driver: str) -> None:
        self.cp = cp
        self.node = node
        self.driver = driver

    def slices(self) -> list[dict[str, Any]]:
        return resource_slices(self.cp, self.node, self.driver)

    def specs(self) -> list[dict[str, Any]]:
        return [s["spec"] for s in self.slices()]

    def versions(self) -> dict[str, str]:
        return {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in self.slices()}

    def current(self) -> list[dict[str, Any]]:
        """The slices of the newest generation, checked to be all of them."""
        slices = self.slices()
        top = max(s["spec"]["pool"]["generation"] for s in slices)
        current = [s for s in slices if s["spec"]["pool"]["generation"] == top]
        assert {s["spec"]["pool"]["resourceSliceCount"] for s in current} == {len(current)}
        return current

    def device_names(self) -> list[str]:
        """The names of the newest generation's devices, sorted."""
        return sorted(d["name"] for s in self.current() for d in s["spec"].get("devices", []))

    def devices(self) -> list[dict[str, Any]]:
        """The newest generation's devices, sorted by name (the order rich_devices makes)."""
        found = [d for s in self.current() for d in s["spec"].get("devices", [])]
        return sorted(found, key=lambda d: str(d["name"]))

    def delete(self, name: str) -> None:
        self.cp.request("DELETE", f"{SLICES}/{name}")

    def delete_all(self) -> None:
        """What the kubelet does when it starts, or 30 s after a driver went away."""
        selector = f"spec.nodeName={self.node},spec.driver={self.driver}"
        self.cp.request("DELETE", f"{SLICES}?{urllib.parse.urlencode({'fieldSelector': selector})}")

    def edit(self, name: str, change: Callable[[dict[str, Any]], None]) -> None:
        """Someone else (the admin) changes a slice's spec."""
        stored = self.cp.request("GET", f"{SLICES}/{name}")
        change(stored["spec"])
        self.cp.request("PUT", f"{SLICES}/{name}", stored)

    def create(self, spec: Mapping[str, Any], prefix: str) -> None:
        self.cp.request(
            "POST",
            SLICES,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"generateName": prefix},
                "spec": dict(spec),
            },
        )


@pytest.fixture
def pool(control_plane: ControlPlane, ready_node: str, driver: str) -> Pool:
    return Pool(control_plane, ready_node, driver)


def counts(report: Any) -> tuple[int, int, int, int]:
    return (report.created, report.updated, report.deleted, report.generation)


# --- the applier ----------------------------------------------------------------------


def test_first_publication(
    control_plane: ControlPlane, ready_node: str, driver: str, applier: SliceApplier, pool: Pool
) -> None:
    report = applier.apply(rich_devices(3))
    assert counts(report) == (1, 0, 0, 1)
    (only,) = pool.slices()
    meta = only["metadata"]
    assert meta["generateName"] == f"{ready_node}-{driver}-"
    assert meta["name"].startswith(f"{ready_node}-{driver}-")
    node = control_plane.request("GET", f"/api/v1/nodes/{ready_node}")
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "name": ready_node,
            "uid": node["metadata"]["uid"],
            "controller": True,
        }
    ]
    assert only["spec"] == {
        "driver": driver,
        "nodeName": ready_node,
        "pool": {"name": ready_node, "generation": 1, "resourceSliceCount": 1},
        "devices": as_stored(rich_devices(3)),
    }


def test_no_devices_publish_one_empty_slice(
    ready_node: str, driver: str, applier: SliceApplier, pool: Pool
) -> None:
    assert counts(applier.apply([])) == (1, 0, 0, 1)
    # The server leaves the empty device list out of what it stores (1.34 stores a null).
    specs = [{k: v for k, v in spec.items() if v is not None} for spec in pool.specs()]
    assert specs == [
        {
            "driver": driver,
            "nodeName": ready_node,
            "pool": {"name": ready_node, "generation": 1, "resourceSliceCount": 1},
        }
    ]


@pytest.mark.parametrize(
    "make_devices",
    [lambda: rich_devices(300), lambda: spelled_out_devices(3), list, lambda: tainted_devices(3)],
    ids=["topology-aware", "quantity-forms", "no-devices", "taints"],
)
def test_unchanged_devices_write_nothing(
    applier: SliceApplier,
    restarted: Callable[[], SliceApplier],
    pool: Pool,
    make_devices: Callable[[], list[dict[str, Any]]],
) -> None:
    devices = make_devices()  # made in the test: they depend on the run's profile
    applier.apply(devices)
    versions = pool.versions()
    if devices:
        # What we wrote is not what the server gives back; they mean the same.
        assert pool.devices() != devices
    assert applier.apply(devices).writes == 0
    # A fresh applier (a restarted plugin) knows nothing of what was written, and must
    # see through the server's normalization: the same slices are in sync.
    assert restarted().apply(devices).writes == 0
    assert pool.versions() == versions


def test_server_normalizes_what_we_write(applier: SliceApplier, pool: Pool) -> None:
    """What the test above relies on: the server's form of our devices."""
    applier.apply(tainted_devices(4) + spelled_out_devices(1))
    stored = pool.devices()
    assert stored[4] == {
        "name": "dev0",
        "capacity": {
            "bytes": {"value": "1Gi"},
            "count": {"value": "2k"},
            "share": {"value": "500m"},
            "power": {"value": "1e3"},
        },
    }
    assert stored[3]["capacity"]["memory"]["value"] == "67108864k"
    assert stored[0]["capacity"]["memory"]["value"] == "103079215104"
    assert all(d["taints"][0]["timeAdded"] for d in stored[:4])


def test_update_keeps_the_time_taints_were_added(
    applier: SliceApplier, restarted: Callable[[], SliceApplier], pool: Pool
) -> None:
    applier.apply(tainted_devices(3))

    def added_long_ago(spec: dict[str, Any]) -> None:  # not this second, whenever we run
        for device in spec["devices"]:
            device["taints"][0]["timeAdded"] = "2020-01-01T00:00:00Z"

    (name,) = pool.versions()
    pool.edit(name, added_long_ago)
    changed = tainted_devices(3)
    changed[1]["attributes"]["model"] = {"string": "changed"}
    changed[2]["taints"].append({"key": "example.com/new", "effect": "NoSchedule"})
    # A fresh applier: it has to take the times from the server's slice.
    report = restarted().apply(changed)
    assert counts(report) == (0, 1, 0, 1)
    stored = pool.devices()
    assert [d["taints"][0]["timeAdded"] for d in stored] == ["2020-01-01T00:00:00Z"] * 3
    assert stored[2]["taints"][1]["timeAdded"] != "2020-01-01T00:00:00Z"
    assert stored[1]["attributes"]["model"] == {"string": "changed"}
    assert stored[2]["taints"][1]["key"] == "example.com/new"


def test_one_changed_slice_is_updated_in_place(applier: SliceApplier, pool: Pool) -> None:
    applier.apply(rich_devices(200))
    before = {s["metadata"]["uid"]: s["metadata"]["resourceVersion"] for s in pool.slices()}
    changed = rich_devices(200)
    changed[150]["attributes"]["resource.kubernetes.io/numaNode"] = {"int": -1}
    report = applier.apply(changed)
    assert counts(report) == (0, 1, 0, 1)
    after = {s["metadata"]["uid"]: s["metadata"]["resourceVersion"] for s in pool.slices()}
    assert after.keys() == before.keys(), "the same slices"
    assert sum(after[uid] != before[uid] for uid in after) == 1
    assert [d["attributes"]["resource.kubernetes.io/numaNode"] for d in pool.devices()] == [
        d["attributes"]["resource.kubernetes.io/numaNode"] for d in changed
    ]


def test_growing_past_a_slice_bumps_the_generation(applier: SliceApplier, pool: Pool) -> None:
    applier.apply(rich_devices(128))
    report = applier.apply(rich_devices(129))
    assert (report.created, report.generation) == (1, 2)
    assert sorted(
        (s["pool"]["generation"], s["pool"]["resourceSliceCount"], len(s["devices"]))
        for s in pool.specs()
    ) == [(2, 2, 1), (2, 2, 128)]
    assert pool.device_names() == [d["name"] for d in rich_devices(129)]


def test_changes_to_two_slices_bump_the_generation(applier: SliceApplier, pool: Pool) -> None:
    applier.apply(rich_devices(256))
    changed = rich_devices(256)
    changed[0]["attributes"]["smtEnabled"] = {"bool": False}
    changed[255]["attributes"]["smtEnabled"] = {"bool": True}
    report = applier.apply(changed)
    assert (report.updated, report.generation) == (2, 2)
    assert {s["pool"]["generation"] for s in pool.specs()} == {2}
    stored = pool.devices()
    assert (stored[0]["attributes"]["smtEnabled"], stored[255]["attributes"]["smtEnabled"]) == (
        {"bool": False},
        {"bool": True},
    )


def test_shrinking_deletes_slices(ready_node: str, applier: SliceApplier, pool: Pool) -> None:
    applier.apply(rich_devices(1000))
    assert len(pool.slices()) == 8
    report = applier.apply(rich_devices(5))
    assert report.generation == 2
    (only,) = pool.specs()
    assert only["pool"] == {"name": ready_node, "generation": 2, "resourceSliceCount": 1}
    assert only["devices"] == as_stored(rich_devices(5))


def test_deleted_slice_is_restored(applier: SliceApplier, pool: Pool) -> None:
    applier.apply(rich_devices(300))
    pool.delete(pool.slices()[1]["metadata"]["name"])
    report = applier.apply(rich_devices(300))
    assert report.created == 1
    assert pool.device_names() == [d["name"] for d in rich_devices(300)]
    assert len(pool.current()) == 3


def test_all_slices_wiped_are_restored(applier: SliceApplier, pool: Pool) -> None:
    applier.apply(rich_devices(10))
    pool.delete_all()
    assert pool.slices() == []
    report = applier.apply(rich_devices(10))
    assert report.created == 1
    assert pool.devices() == as_stored(rich_devices(10))


def _replace_devices(spec: dict[str, Any]) -> None:
    spec["devices"] = [{"name": "intruder"}]


def _change_capacity(spec: dict[str, Any]) -> None:
    spec["devices"][1]["capacity"]["cpu"]["value"] = "13"


def _drop_attribute(spec: dict[str, Any]) -> None:
    del spec["devices"][2]["attributes"]["microcode"]


def _add_taint(spec: dict[str, Any]) -> None:
    spec["devices"][0]["taints"] = [{"key": "example.com/by-hand", "effect": "NoExecute"}]


@pytest.mark.parametrize(
    "change", [_replace_devices, _change_capacity, _drop_attribute, _add_taint]
)
def test_altered_slice_is_restored(
    applier: SliceApplier,
    restarted: Callable[[], SliceApplier],
    pool: Pool,
    change: Callable[[dict[str, Any]], None],
) -> None:
    devices = rich_devices(4)
    applier.apply(devices)
    (name,) = pool.versions()
    pool.edit(name, change)
    # What we last wrote is no guide any more: the resourceVersion changed.
    report = applier.apply(devices)
    assert counts(report) == (0, 1, 0, 1)
    assert pool.devices() == as_stored(devices)
    # A fresh applier sees a changed slice too.
    pool.edit(name, change)
    assert counts(restarted().apply(devices)) == (0, 1, 0, 1)
    assert pool.devices() == as_stored(devices)


def test_obsolete_and_foreign_pools_are_deleted(
    ready_node: str, driver: str, applier: SliceApplier, pool: Pool
) -> None:
    applier.apply(rich_devices(3))
    ours = pool.versions()
    stale = {
        "driver": driver,
        "nodeName": ready_node,
        "pool": {"name": ready_node, "generation": 0, "resourceSliceCount": 1},
        "devices": rich_devices(1, "old"),
    }
    foreign = {**stale, "pool": {"name": "other-pool", "generation": 5, "resourceSliceCount": 1}}
    pool.create(stale, "stale-")
    pool.create(foreign, "foreign-")
    assert len(pool.slices()) == 3
    report = applier.apply(rich_devices(3))
    assert (report.deleted, report.created, report.updated) == (2, 0, 0)
    assert pool.versions() == ours


def test_other_drivers_slices_are_left_alone(
    api: KubeClusterAPI, applier: SliceApplier, pool: Pool
) -> None:
    other = Pool(pool.cp, pool.node, f"o{uuid.uuid4().hex[:8]}.nri.io")
    SliceApplier(api, other.node, other.driver).apply(rich_devices(2))
    theirs = other.versions()
    applier.apply(rich_devices(3))
    applier.apply(rich_devices(300))
    applier.apply([])
    assert other.versions() == theirs
    assert [s["driver"] for s in pool.specs()] == [pool.driver]


def test_a_pass_the_server_refuses_converges_on_retry(applier: SliceApplier, pool: Pool) -> None:
    applier.apply(rich_devices(10))
    refused = rich_devices(400)
    refused[200]["name"] = "Not_A_DNS_Label"
    with pytest.raises(KubeAPIError) as failed:
        applier.apply(refused)
    assert failed.value.status == 422
    assert "Not_A_DNS_Label" in str(failed.value)
    assert pool.slices(), "the pass failed half way: some slices were written"
    report = applier.apply(rich_devices(400))
    assert report.writes > 0
    assert pool.device_names() == [d["name"] for d in rich_devices(400)]
    assert len(pool.slices()) == 4, "no slice of an older generation is left"


class EditAfterList(KubeClusterAPI):
    """The real API, and a second writer that gets in between our list and our writes."""

    def __init__(self, client: ApiClient, edit: Callable[[list[dict[str, Any]]], None]) -> None:
        super().__init__(client)
        self.edit: Callable[[list[dict[str, Any]]], None] | None = edit

    def list_slices(self, node_name: str, driver: str) -> list[dict[str, Any]]:
        found = super().list_slices(node_name, driver)
        edit, self.edit = self.edit, None
        if edit is not None:
            edit(found)
        return found


def test_a_write_that_lost_a_race_converges_on_retry(
    admin_api: ApiClient, ready_node: str, driver: str, pool: Pool
) -> None:
    def someone_edits(found: list[dict[str, Any]]) -> None:
        pool.edit(found[0]["metadata"]["name"], _replace_devices)

    SliceApplier(KubeClusterAPI(admin_api), ready_node, driver).apply(rich_devices(3))
    racing = SliceApplier(EditAfterList(admin_api, someone_edits), ready_node, driver)
    changed = rich_devices(3)
    changed[0]["attributes"]["model"] = {"string": "changed"}
    with pytest.raises(KubeAPIError) as failed:
        racing.apply(changed)
    assert failed.value.status == 409
    assert racing.apply(changed).updated == 1
    assert pool.devices() == as_stored(changed)


def test_missing_node_fails_the_pass(api: KubeClusterAPI, driver: str) -> None:
    node = f"missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(KubeAPIError) as failed:
        SliceApplier(api, node, driver).apply(rich_devices(1))
    assert failed.value.not_found
    assert f'nodes "{node}" not found' in str(failed.value)
    assert api.list_slices(node, driver) == []


# --- the publisher thread -------------------------------------------------------------


class Errors:
    def __init__(self) -> None:
        self.seen: list[tuple[Exception, str]] = []
        self.event = threading.Event()

    def __call__(self, err: Exception, msg: str) -> None:
        self.seen.append((err, msg))
        self.event.set()


@pytest.fixture
def started() -> Iterator[list[SlicePublisher]]:
    publishers: list[SlicePublisher] = []
    yield publishers
    for publisher in publishers:
        publisher.stop()


def test_publisher_publishes_and_restores(
    applier: SliceApplier, pool: Pool, started: list[SlicePublisher]
) -> None:
    errors = Errors()
    publisher = SlicePublisher(applier, errors, resync_period=3600)
    started.append(publisher)
    publisher.publish(rich_devices(2))
    publisher.start()
    assert publisher.wait_synced(30) is not None
    assert pool.devices() == as_stored(rich_devices(2))
    pool.delete_all()
    publisher.resync()  # what a watch event of our slices does
    report = publisher.wait_synced(30)
    assert report is not None
    assert report.created == 1
    assert pool.devices() == as_stored(rich_devices(2))
    publisher.publish(rich_devices(4))
    assert publisher.wait_synced(30) is not None
    assert pool.devices() == as_stored(rich_devices(4))
    assert errors.seen == []


def test_publisher_retries_until_the_node_exists(
    control_plane: ControlPlane, api: KubeClusterAPI, driver: str, started: list[SlicePublisher]
) -> None:
    node = f"late-{uuid.uuid4().hex[:8]}"
    errors = Errors()
    publisher = SlicePublisher(
        SliceApplier(api, node, driver), errors, resync_period=3600, min_backoff=0.05
    )
    started.append(publisher)
    publisher.publish(rich_devices(1))
    publisher.start()
    try:
        assert errors.event.wait(30)
        create_ready_node(control_plane, node)
        assert publisher.wait_synced(30) is not None
        assert Pool(control_plane, node, driver).devices() == as_stored(rich_devices(1))
    finally:
        delete_node(control_plane, node)
    assert errors.seen
    for err, msg in errors.seen:
        assert isinstance(err, RecoverableError)
        assert f'(404) GET /api/v1/nodes/{node}: nodes "{node}" not found' in str(err)
        assert msg == "publishing ResourceSlices failed"


def test_publisher_applies_new_devices_at_once_after_a_failure(
    applier: SliceApplier, pool: Pool, started: list[SlicePublisher]
) -> None:
    errors = Errors()
    publisher = SlicePublisher(applier, errors, resync_period=3600, min_backoff=3600)
    started.append(publisher)
    refused = rich_devices(2)
    refused[1]["name"] = "Not_A_DNS_Label"
    publisher.publish(refused)
    publisher.start()
    assert errors.event.wait(30)
    (err, _), *_ = errors.seen
    assert isinstance(err, RecoverableError)
    assert "(422)" in str(err)
    publisher.publish(rich_devices(2))  # does not wait out the hour of backoff
    assert publisher.wait_synced(30) is not None
    assert pool.devices() == as_stored(rich_devices(2))


def test_publisher_copies_what_it_is_given(
    applier: SliceApplier, pool: Pool, started: list[SlicePublisher]
) -> None:
    publisher = SlicePublisher(applier, Errors(), resync_period=3600)
    started.append(publisher)
    given = rich_devices(1)
    publisher.publish(given)
    given[0]["name"] = "changed-after"
    publisher.start()
    assert publisher.wait_synced(30) is not None
    assert pool.devices() == as_stored(rich_devices(1))


def test_publisher_start_twice_fails(applier: SliceApplier) -> None:
    publisher = SlicePublisher(applier, Errors(), resync_period=3600)
    publisher.start()
    try:
        with pytest.raises(RuntimeError, match="already started"):
            publisher.start()
    finally:
        publisher.stop()
    publisher.stop()  # idempotent


@pytest.mark.parametrize("policy", ["topology-aware", "static"])
@pytest.mark.parametrize("shape", SHAPES)  # every tree in tests/fixtures/sysfs, checked there
@pytest.mark.parametrize("left", ["all", "one CPU, no memory"])
def test_every_machine_s_devices_pass_real_validation(
    api: KubeClusterAPI,
    ready_node: str,
    *,
    cluster_profile: ClusterProfile,
    policy: str,
    shape: str,
    left: str,
) -> None:
    """What each policy publishes for each fixture machine is a valid slice, also when the
    configuration leaves one CPU and no memory to claim (where a request policy's step
    would not fit in the capacity: a 2-CPU machine with CPU 0 reserved is such a node)."""
    topology = read_topology(FIXTURES / shape)
    config: dict[str, Any] = {"policy": policy}
    if left != "all":
        cpus = sorted(topology.cpus)
        config["reservedCPUs"] = format_cpu_list(cpus[:-1])
        if policy == "topology-aware":
            config["options"] = {"reservedMemory": "1Ei"}
    devices = cluster_profile.spelled(make_policy(topology, parse_config(config)).devices())
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{ready_node}-"},
        "spec": {
            "driver": f"{policy}.nri.io",
            "nodeName": ready_node,
            "pool": {"name": ready_node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }
    stored = api.create_slice(body, dry_run=True)  # raises if the server refuses any
    assert [d["name"] for d in stored["spec"]["devices"]] == [d["name"] for d in devices]
    # Each device maps node resources; a server without the gate drops the mappings.
    field = cluster_profile.node_allocatable_field
    mappings = [d[field] for d in devices]
    kept = mappings if cluster_profile.on("DRANodeAllocatableResources") else [None] * len(devices)
    assert [d.get(field) for d in stored["spec"]["devices"]] == kept
