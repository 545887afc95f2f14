"""The resource manager's answers to the runtime (ContainerPinner), with a real policy.

The claims are the topology-aware policy's on a fixture machine; the API server is the
in-memory fake of nodedra's own ClusterAPI protocol, which can be made to block or fail.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from nodedra.dra import KubeAPIError, driver_name
from nodedra.dra.claims import claim_results
from nodedra.nri import Container, CPUSet, Pod, Update
from nodedra.policy import make_policy, parse_config
from nodedra.policy.ledger import env_suffix
from nodedra.resmgr.containers import ContainerPinner
from nodedra.resmgr.pinning import Reservation
from nodedra.topology import format_cpu_list
from tests.unit.dra.fakes import NODE, FakeCluster, make_claim, result
from tests.unit.policy.conftest import topology

DRIVER = driver_name("topology-aware")
UID = "0b7a6c2e-6a0d-4c4e-9d64-7f2b1c3d4e5f"
OWNER = Pod("sb-owner", "pod-owner", "ns", "owner")
SHARER = Pod("sb-sharer", "pod-sharer", "ns", "sharer")


class Node:
    """A pinner over a real policy holding one claim of 2 CPUs, reserved for OWNER."""

    def __init__(self, refresh_wait: float = 5.0) -> None:
        self.policy = make_policy(
            topology("two-socket-smt2-numa4"),
            parse_config({"policy": "topology-aware", "reservedCPUs": "0"}),
        )
        self.lock = threading.Lock()
        self.reservations: dict[str, Reservation] = {}
        self.cluster = FakeCluster()
        self.changes = 0
        self.changed = threading.Event()
        self.pinner = ContainerPinner(
            lock=lambda: self.lock,
            policy=self.policy,
            driver=DRIVER,
            reservations=lambda: self.reservations,
            api=self.cluster,
            on_synchronized=lambda: None,
            on_changed=self._changed,
            refresh_wait=refresh_wait,
        )
        claim = make_claim(
            UID,
            [
                result(
                    "r",
                    "cpudevnuma000",
                    driver=DRIVER,
                    pool=NODE,
                    consumedCapacity={"cpu": "2"},
                )
            ],
            namespace="ns",
            name="shared",
        )
        claim["status"]["reservedFor"] = [{"resource": "pods", "name": "o", "uid": OWNER.uid}]
        self.claim = claim
        self.cluster.claims[("ns", "shared")] = claim
        self.allocate()
        self.reservations[UID] = Reservation("ns", "shared", frozenset({OWNER.uid}))

    def allocate(self) -> None:
        """The policy allocates the claim, as a prepare does."""
        self.policy.allocate_claim(self.claim, claim_results(self.claim, DRIVER))

    def _changed(self) -> None:
        self.changes += 1
        self.changed.set()

    @property
    def claimed(self) -> CPUSet:
        (grant,) = self.policy.grants(UID)
        return CPUSet(format_cpu_list(grant.cpus), format_cpu_list(grant.mems))

    @property
    def shared(self) -> CPUSet:
        policy = self.policy  # isolated CPUs are kept for claims, out of the shared pool
        unclaimed = policy.online_cpus() - policy.allocated_cpus()
        return CPUSet(format_cpu_list(unclaimed - topology("two-socket-smt2-numa4").isolated))

    def share_with(self, pod: Pod) -> None:
        """The scheduler adds ``pod`` to the claim's reservedFor (after its prepare)."""
        self.claim["status"]["reservedFor"].append({"resource": "pods", "uid": pod.uid})


def holding(name: str, pod: Pod, cpus: str = "") -> Container:
    """A container of ``pod`` whose environment names the claim (a runtime without CDI
    names, as containerd 2.2 and CRI-O)."""
    env = frozenset({f"DRA_CPUSET_{env_suffix(UID, 0)}", "PATH"})
    return Container(f"ctr-{name}", pod.id, name, (), env, CPUSet(cpus))


def plain(name: str, pod: Pod, env: frozenset[str] = frozenset(), cpus: str = "") -> Container:
    return Container(f"ctr-{name}", pod.id, name, (), env, CPUSet(cpus))


@pytest.fixture
def node() -> Node:
    return Node()


def test_a_hostile_name_costs_its_container_the_shared_pool_and_nothing_else(node: Node) -> None:
    """A name with more digits than Python converts once failed the whole Synchronize."""
    hostile = plain("evil", OWNER, frozenset({"DRA_CPUSET_x_" + "9" * 5000}))
    good = holding("good", OWNER)
    updates = node.pinner.synchronize([OWNER], [hostile, good])
    assert sorted(updates, key=lambda u: u.container_id) == [
        Update("ctr-evil", node.shared),
        Update("ctr-good", node.claimed),
    ]
    cpuset, _ = node.pinner.create_container(OWNER, plain("evil2", OWNER, hostile.env_names))
    assert cpuset == node.shared


def test_a_cpuset_the_runtime_reports_that_is_no_cpu_list_is_corrected(node: Node) -> None:
    odd = plain("odd", OWNER, cpus="0-3,\u0663,N")  # an Arabic-Indic digit, the kernel's N
    assert node.pinner.synchronize([OWNER], [odd]) == [Update("ctr-odd", node.shared)]


def test_a_decision_that_raises_fails_that_container_alone(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever bug a container's name reaches, it gets the shared pool and is counted."""
    real = node.pinner.pinning.decide

    def decide(pod: Pod, container: Container, books: Any) -> Any:
        if container.name == "boom":
            raise RuntimeError("a bug")
        return real(pod, container, books)

    monkeypatch.setattr(node.pinner.pinning, "decide", decide)
    updates = node.pinner.synchronize([OWNER], [plain("boom", OWNER), holding("good", OWNER)])
    assert Update("ctr-boom", node.shared) in updates
    assert Update("ctr-good", node.claimed) in updates
    assert node.pinner.create_container(OWNER, plain("boom", OWNER)) == (node.shared, [])
    assert node.pinner.update_container(OWNER, plain("boom", OWNER), CPUSet("")) == [
        Update("ctr-boom", node.shared)
    ]
    assert node.pinner.errors == 3


def test_a_pod_sharing_the_claim_since_its_prepare_is_pinned_at_synchronize(node: Node) -> None:
    """Created while nodedra was away: the Synchronize reads whom the claim is for now,
    once for all the containers that name it."""
    node.share_with(SHARER)
    containers = [holding(f"s{i}", SHARER) for i in range(5)]
    updates = node.pinner.synchronize([SHARER], containers)
    assert updates == [Update(c.id, node.claimed) for c in containers]
    assert node.cluster.gets == 1, "one read of the claim, not one per container"
    assert SHARER.uid in node.reservations[UID].pods


def test_updates_and_creations_read_the_claim_again(node: Node) -> None:
    node.pinner.synchronize([SHARER], [])
    late = holding("late", SHARER)
    assert node.pinner.update_container(SHARER, late, CPUSet("")) == [Update(late.id, node.shared)]
    node.share_with(SHARER)
    assert node.pinner.update_container(SHARER, late, CPUSet("")) == [Update(late.id, node.claimed)]
    cpuset, _ = node.pinner.create_container(SHARER, holding("new", SHARER))
    assert cpuset == node.claimed
    assert node.cluster.gets == 2, "the first update read it, the second; the creation did not"


def test_a_slow_api_server_does_not_hold_the_runtime_up() -> None:
    """The read goes on after the event is answered, and the container is moved then."""
    node = Node(refresh_wait=0.05)
    node.share_with(SHARER)
    gate = threading.Event()
    reading = threading.Event()
    get_claim = node.cluster.get_claim

    def slow_get_claim(namespace: str, name: str) -> dict[str, Any]:
        reading.set()
        assert gate.wait(30)
        return get_claim(namespace, name)

    node.cluster.get_claim = slow_get_claim  # type: ignore[method-assign]
    node.pinner.synchronize([SHARER], [])
    answered: list[tuple[CPUSet | None, list[Update]]] = []
    creation = threading.Thread(
        target=lambda: answered.append(node.pinner.create_container(SHARER, holding("c", SHARER)))
    )
    creation.start()
    creation.join(20)
    assert reading.is_set()
    assert not gate.is_set()
    assert answered == [(node.shared, [])], "answered while the API server has not"
    assert node.pinner.pending_updates() == []
    gate.set()
    assert node.changed.wait(30), "the read that ended late asked for updates"
    assert node.pinner.pending_updates() == [Update("ctr-c", node.claimed)]


def test_the_claim_watch_moves_a_sharing_pods_container_onto_the_claim(node: Node) -> None:
    node.pinner.synchronize([SHARER], [])
    node.pinner.pinning.pods[SHARER.id] = SHARER
    node.cluster.fail_next = [KubeAPIError(503, "unavailable")]
    cpuset, _ = node.pinner.create_container(SHARER, holding("c", SHARER))
    assert cpuset == node.shared, "the API server failed: as the books say"
    node.pinner.reservation_seen(UID, frozenset({OWNER.uid, SHARER.uid}))
    assert node.changes == 1
    assert node.pinner.pending_updates() == [Update("ctr-c", node.claimed)]
    node.pinner.reservation_seen(UID, frozenset({SHARER.uid}))
    assert node.changes == 1, "nothing new: pods are only ever added"
    node.pinner.reservation_seen("another-claim", frozenset({SHARER.uid}))
    assert node.changes == 1, "not a claim we hold"


def test_an_update_that_crosses_a_newer_decision_is_sent_again(node: Node) -> None:
    """The sender's update travels while an event answers for the same container.

    A prepare commits after the sender computed its update, and a creation, which looks
    for containers behind, finds none: the first container was last told what the newest
    books want. Then the older update lands, and must not pass for current.
    """
    node.pinner.synchronize([OWNER], [plain("p", OWNER, cpus=node.shared.cpus)])
    with_claim = node.shared
    node.policy.release_claim(UID)
    node.pinner.pinning.books_changed()  # a commit: the claim is gone
    (update,) = node.pinner.pending_updates()  # the sender computes it...
    assert update == Update("ctr-p", node.shared)
    node.allocate()
    node.pinner.pinning.books_changed()  # ...a prepare commits meanwhile...
    _, others = node.pinner.create_container(OWNER, plain("q", OWNER))
    assert others == [], "...and a creation finds nobody behind what it was last told..."
    assert node.pinner.updates_sent([update], []), "...but the update in flight is old"
    assert node.pinner.pending_updates() == [Update("ctr-p", with_claim)]
    assert not node.pinner.updates_sent([Update("ctr-p", with_claim)], [])
    assert node.pinner.pending_updates() == []
    node.pinner.pinning.books_changed()  # a later commit that changes nothing for it
    assert node.pinner.pending_updates() == [], "the newest decision, applied, is known"


def test_a_container_first_seen_at_its_start_is_moved_where_it_belongs(node: Node) -> None:
    """Created while the runtime synchronized us, it was in neither the Synchronize nor a
    CreateContainer: at its start it is adopted and updated, outside the event."""
    node.pinner.synchronize([OWNER], [])
    late, other = holding("late", OWNER), plain("other", OWNER)
    assert node.pinner.container_started(OWNER, late)
    assert node.pinner.container_started(OWNER, other)
    assert sorted(node.pinner.pending_updates(), key=lambda u: u.container_id) == [
        Update("ctr-late", node.claimed),
        Update("ctr-other", node.shared),
    ]
    assert not node.pinner.container_started(OWNER, late), "adopted once"


def test_a_container_seen_created_is_left_alone_at_its_start(node: Node) -> None:
    node.pinner.synchronize([OWNER], [])
    created = holding("created", OWNER)
    cpuset, _ = node.pinner.create_container(OWNER, created)
    assert cpuset == node.claimed
    assert not node.pinner.container_started(OWNER, created)
    assert node.pinner.pending_updates() == []


def test_while_pinning_is_held_the_kubelet_s_cpusets_are_left_alone(node: Node) -> None:
    """The kubelet's static CPU manager pins: nodedra changes no cpuset, then pins again."""
    held = True
    node.pinner._held = lambda: held
    kubelet_s = plain("guaranteed", OWNER, cpus="5")
    assert node.pinner.synchronize([OWNER], [holding("h", OWNER, cpus="1-63")]) == []
    assert node.pinner.create_container(OWNER, kubelet_s) == (None, [])
    assert node.pinner.update_container(OWNER, kubelet_s, CPUSet("5")) == []
    held = False
    cpuset, _ = node.pinner.create_container(OWNER, plain("later", OWNER, cpus="5"))
    assert cpuset == node.shared
