"""The desired ResourceSlices and the applier that reaches them, on our ClusterAPI fake."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from nodedra.dra import KubeAPIError, RecoverableError
from nodedra.dra.publisher import SlicePublisher
from nodedra.dra.slices import SliceApplier, slice_capacity, split_devices
from tests.unit.dra.fakes import DRIVER, NODE, FakeCluster, devices


@pytest.mark.parametrize(
    ("count", "sizes"),
    [
        (0, [0]),
        (1, [1]),
        (128, [128]),
        (129, [128, 1]),
        (263, [128, 128, 7]),
        (1000, [128] * 7 + [104]),
    ],
)
def test_split_devices(count: int, sizes: list[int]) -> None:
    published = devices(count)
    chunks = split_devices(published)
    assert [len(c) for c in chunks] == sizes
    assert [d for c in chunks for d in c] == published


@pytest.mark.parametrize("field", ["taints", "consumesCounters"])
def test_taints_or_counters_halve_the_slice(field: str) -> None:
    published = devices(100)
    published[50][field] = [{"key": "x"}]
    assert slice_capacity(published) == 64
    assert [len(c) for c in split_devices(published)] == [64, 36]


@pytest.fixture
def cluster() -> FakeCluster:
    return FakeCluster()


@pytest.fixture
def applier(cluster: FakeCluster) -> SliceApplier:
    return SliceApplier(cluster, NODE, DRIVER)


def specs(cluster: FakeCluster) -> list[dict[str, Any]]:
    return [s["spec"] for s in cluster.slices.values()]


def test_first_publication(cluster: FakeCluster, applier: SliceApplier) -> None:
    report = applier.apply(devices(3))
    assert (report.created, report.updated, report.deleted, report.generation) == (1, 0, 0, 1)
    (only,) = cluster.slices.values()
    meta, spec = only["metadata"], only["spec"]
    assert meta["name"].startswith(f"{NODE}-{DRIVER}-")
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "name": NODE,
            "uid": cluster.nodes[NODE],
            "controller": True,
        }
    ]
    assert spec == {
        "driver": DRIVER,
        "nodeName": NODE,
        "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
        "devices": devices(3),
    }


def test_no_devices_publish_one_empty_slice(cluster: FakeCluster, applier: SliceApplier) -> None:
    applier.apply([])
    assert specs(cluster) == [
        {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        }
    ]


def test_unchanged_devices_write_nothing(cluster: FakeCluster, applier: SliceApplier) -> None:
    applier.apply(devices(300))
    writes = len(cluster.writes)
    report = applier.apply(devices(300))
    assert report.writes == 0
    assert len(cluster.writes) == writes
    # A fresh applier (a restarted plugin) finds the same slices in sync too.
    assert SliceApplier(cluster, NODE, DRIVER).apply(devices(300)).writes == 0


def test_one_changed_slice_is_updated_in_place(cluster: FakeCluster, applier: SliceApplier) -> None:
    applier.apply(devices(200))
    changed = devices(200)
    changed[150]["attributes"]["index"] = {"int": -1}
    report = applier.apply(changed)
    assert (report.created, report.updated, report.deleted, report.generation) == (0, 1, 0, 1)
    assert cluster.pool_devices() == changed


def test_growing_past_a_slice_bumps_the_generation(
    cluster: FakeCluster, applier: SliceApplier
) -> None:
    applier.apply(devices(128))
    report = applier.apply(devices(129))
    assert report.generation == 2
    assert report.created == 1
    assert sorted(s["pool"]["resourceSliceCount"] for s in specs(cluster)) == [2, 2]
    assert {s["pool"]["generation"] for s in specs(cluster)} == {2}
    assert sorted(d["name"] for d in cluster.pool_devices()) == sorted(
        d["name"] for d in devices(129)
    )


def test_changes_to_two_slices_bump_the_generation(
    cluster: FakeCluster, applier: SliceApplier
) -> None:
    applier.apply(devices(256))
    changed = devices(256)
    changed[0]["attributes"]["index"] = {"int": -1}
    changed[255]["attributes"]["index"] = {"int": -1}
    report = applier.apply(changed)
    assert (report.updated, report.generation) == (2, 2)
    assert {s["pool"]["generation"] for s in specs(cluster)} == {2}


def test_shrinking_deletes_slices(cluster: FakeCluster, applier: SliceApplier) -> None:
    applier.apply(devices(1000))
    assert len(cluster.slices) == 8
    report = applier.apply(devices(5))
    assert len(cluster.slices) == 1
    assert report.generation == 2
    assert specs(cluster)[0]["pool"] == {"name": NODE, "generation": 2, "resourceSliceCount": 1}
    assert specs(cluster)[0]["devices"] == devices(5)


def test_deleted_slice_is_restored(cluster: FakeCluster, applier: SliceApplier) -> None:
    applier.apply(devices(300))
    victim = next(iter(cluster.slices))
    del cluster.slices[victim]
    report = applier.apply(devices(300))
    assert report.created == 1
    assert sorted(d["name"] for d in cluster.pool_devices()) == sorted(
        d["name"] for d in devices(300)
    )
    assert {s["pool"]["resourceSliceCount"] for s in specs(cluster)} == {3}


def test_all_slices_wiped_are_restored(cluster: FakeCluster, applier: SliceApplier) -> None:
    applier.apply(devices(10))
    cluster.slices.clear()  # what the kubelet does when it starts
    report = applier.apply(devices(10))
    assert report.created == 1
    assert cluster.pool_devices() == devices(10)


def test_altered_slice_is_restored(cluster: FakeCluster, applier: SliceApplier) -> None:
    applier.apply(devices(3))
    name = next(iter(cluster.slices))
    cluster.edit_slice(name, devices=[{"name": "intruder"}])
    report = applier.apply(devices(3))
    assert report.updated == 1
    assert cluster.slices[name]["spec"]["devices"] == devices(3)


def test_obsolete_and_foreign_pools_are_deleted(
    cluster: FakeCluster, applier: SliceApplier
) -> None:
    applier.apply(devices(3))
    stale = {
        "metadata": {"generateName": "stale-"},
        "spec": {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 0, "resourceSliceCount": 1},
            "devices": devices(1, "old"),
        },
    }
    foreign = {
        "metadata": {"generateName": "foreign-"},
        "spec": {
            **stale["spec"],
            "pool": {"name": "other-pool", "generation": 5, "resourceSliceCount": 1},
        },
    }
    cluster.create_slice(stale)
    cluster.create_slice(foreign)
    report = applier.apply(devices(3))
    assert (report.deleted, report.created, report.updated) == (2, 0, 0)
    assert [s["pool"]["name"] for s in specs(cluster)] == [NODE]


def test_other_drivers_slices_are_left_alone(cluster: FakeCluster, applier: SliceApplier) -> None:
    other = SliceApplier(cluster, NODE, "other.nri.io")
    other.apply(devices(2))
    applier.apply(devices(3))
    assert sorted(s["driver"] for s in specs(cluster)) == ["other.nri.io", DRIVER]


def test_failed_pass_converges_on_retry(cluster: FakeCluster, applier: SliceApplier) -> None:
    applier.apply(devices(10))
    cluster.fail_next = [KubeAPIError(0, "connection refused")]
    with pytest.raises(KubeAPIError):
        applier.apply(devices(400))
    applier.apply(devices(400))
    assert sorted(d["name"] for d in cluster.pool_devices()) == sorted(
        d["name"] for d in devices(400)
    )


def test_missing_node_fails_the_pass(applier: SliceApplier) -> None:
    missing = SliceApplier(FakeCluster(node="elsewhere"), NODE, DRIVER)
    with pytest.raises(KubeAPIError, match="not found"):
        missing.apply(devices(1))


# --- the publisher thread -------------------------------------------------------------


class Errors:
    def __init__(self) -> None:
        self.seen: list[tuple[Exception, str]] = []
        self.event = threading.Event()

    def __call__(self, err: Exception, msg: str) -> None:
        self.seen.append((err, msg))
        self.event.set()


def test_publisher_publishes_and_restores(cluster: FakeCluster, applier: SliceApplier) -> None:
    errors = Errors()
    publisher = SlicePublisher(applier, errors, resync_period=3600)
    publisher.publish(devices(2))
    publisher.start()
    try:
        assert publisher.wait_synced(10) is not None
        assert cluster.pool_devices() == devices(2)
        cluster.slices.clear()
        publisher.resync()
        report = publisher.wait_synced(10)
        assert report is not None
        assert report.created == 1
        assert cluster.pool_devices() == devices(2)
        publisher.publish(devices(4))
        assert publisher.wait_synced(10) is not None
        assert cluster.pool_devices() == devices(4)
    finally:
        publisher.stop()
    assert errors.seen == []


def test_publisher_reports_failures_as_recoverable_and_retries(cluster: FakeCluster) -> None:
    errors = Errors()
    cluster.fail_next = [KubeAPIError(503, "unavailable"), KubeAPIError(503, "unavailable")]
    publisher = SlicePublisher(
        SliceApplier(cluster, NODE, DRIVER), errors, resync_period=3600, min_backoff=0.01
    )
    publisher.publish(devices(1))
    publisher.start()
    try:
        assert publisher.wait_synced(10) is not None
    finally:
        publisher.stop()
    assert len(errors.seen) == 2
    assert all(isinstance(err, RecoverableError) for err, _ in errors.seen)
    assert "503" in str(errors.seen[0][0])
    assert cluster.pool_devices() == devices(1)


def test_publisher_copies_what_it_is_given(cluster: FakeCluster, applier: SliceApplier) -> None:
    publisher = SlicePublisher(applier, Errors(), resync_period=3600)
    given = devices(1)
    publisher.publish(given)
    given[0]["name"] = "changed-after"
    publisher.start()
    try:
        assert publisher.wait_synced(10) is not None
    finally:
        publisher.stop()
    assert cluster.pool_devices() == devices(1)


def test_publisher_start_twice_fails(applier: SliceApplier) -> None:
    publisher = SlicePublisher(applier, Errors(), resync_period=3600)
    publisher.start()
    try:
        with pytest.raises(RuntimeError, match="already started"):
            publisher.start()
    finally:
        publisher.stop()
    publisher.stop()  # idempotent
