"""The resource manager with both real policies, driven through the real plugin."""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nodedra.dra import ClaimRef, RequestObserver, driver_name
from nodedra.dra.claims import claim_results
from nodedra.lib import faults
from nodedra.policy import PolicyError, make_policy, parse_config
from nodedra.resmgr import CheckpointError, ManagerOptions, ResourceManager, batchlock
from tests.peers.cluster import poll
from tests.unit.dra.fakes import NODE, FakeCluster, make_claim, result
from tests.unit.policy.conftest import topology

SHAPE = "two-socket-smt2-numa4"


class Node:
    """One node's nodedra: state, sockets and CDI specs in a scratch directory."""

    def __init__(self, tmp: Path, policy: str, **config: Any) -> None:
        self.tmp = tmp
        self.cluster = FakeCluster()
        self.shutdowns: list[str] = []
        self.policy_name = policy
        self.config = parse_config({"policy": policy, **config})
        self.manager = self.new_manager()

    def new_manager(
        self, rolling_update_uid: str | None = None, observer: RequestObserver | None = None
    ) -> ResourceManager:
        """A manager as a restarted process would build it, on the same directories."""
        return ResourceManager(
            make_policy(topology(SHAPE), self.config),
            self.cluster,
            ManagerOptions(
                node_name=NODE,
                state_dir=self.tmp / "state",
                registrar_dir=self.tmp / "registry",
                plugin_data_dir=self.tmp / "plugin",
                cdi_dir=self.tmp / "cdi",
                rolling_update_uid=rolling_update_uid,
                observer=observer,
            ),
            self.shutdowns.append,
        )

    @property
    def driver(self) -> str:
        return driver_name(self.policy_name)

    def add_claim(self, uid: str, results: list[dict[str, Any]]) -> ClaimRef:
        claim = make_claim(uid, results)
        self.cluster.claims[("default", f"claim-{uid}")] = claim
        return ClaimRef("default", f"claim-{uid}", uid)

    def specs(self) -> list[str]:
        return sorted(p.name for p in (self.tmp / "cdi").glob("*.yaml"))

    def saved_claims(self) -> dict[str, Any]:
        """The claims in the checkpoint on disk (read as a restart reads them)."""
        saved = self.manager.checkpoint.load()
        assert saved is not None, "no checkpoint"
        return dict(saved.claims)


@pytest.fixture(params=["topology-aware", "static"])
def node(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path, request.param)
    yield n
    n.manager.stop()


def results_for(node: Node, cpu: str = "cpu005") -> list[dict[str, Any]]:
    """One result: 2 CPUs of NUMA node 0 (topology-aware), or CPU ``cpu`` (static)."""
    if node.policy_name == "topology-aware":
        return [
            result(
                "req", "cpudevnuma000", driver=node.driver, pool=NODE, consumedCapacity={"cpu": "2"}
            )
        ]
    return [result("req", cpu, driver=node.driver, pool=NODE)]


def test_prepare_unprepare_end_to_end(node: Node) -> None:
    node.manager.start()
    assert node.manager.plugin.wait_published(10) is not None
    published = node.cluster.pool_devices()
    assert [d["name"] for d in published] == [d["name"] for d in node.manager.policy.devices()]

    ref = node.add_claim("u1", results_for(node))
    answer = node.manager.plugin.node_prepare([ref])["u1"]
    assert answer.error is None
    (device,) = answer.devices
    assert device.cdi_device_ids == (f"{node.driver}/device=claim-u1-0",)
    assert node.specs() == [f"{node.driver}-device_u1.yaml"]
    assert list(node.saved_claims()) == ["u1"]

    assert node.manager.plugin.node_unprepare([ref]) == {"u1": None}
    assert node.specs() == []
    assert node.saved_claims() == {}


def test_restart_restores_claims_and_sweeps_orphan_specs(node: Node) -> None:
    node.manager.start()
    ref = node.add_claim("u1", results_for(node))
    first = node.manager.plugin.node_prepare([ref])["u1"]
    held = node.manager.policy.snapshot()
    node.manager.stop()
    # A crash between a release's commit and the spec's removal leaves a spec nobody holds.
    orphan = node.manager.plugin.cdi
    orphan.write_spec(orphan.claim_spec("orphan", [{"env": ["X=1"]}]))
    foreign = node.tmp / "cdi" / "vendor.com-gpu_x.yaml"
    foreign.write_text("cdiVersion: 0.3.0\n")

    node.manager = node.new_manager()
    node.manager.start()
    assert node.manager.policy.snapshot() == held
    assert node.specs() == sorted([f"{node.driver}-device_u1.yaml", foreign.name])
    again = node.manager.plugin.node_prepare([ref])["u1"]
    assert again == first


def test_an_orphan_released_leaves_no_device_metadata(node: Node) -> None:
    """Its files live under the claim's namespace and name, which its reservation in the
    checkpoint knows; a claim the checkpoint kept no name for goes by its UID."""
    node.manager.start()
    refs = [
        node.add_claim(u, results_for(node, c)) for u, c in (("u1", "cpu005"), ("u2", "cpu006"))
    ]
    answers = node.manager.plugin.node_prepare(refs)
    assert [a.error for a in answers.values()] == [None, None]
    assert sorted(node.manager.plugin.metadata.claim_uids()) == ["u1", "u2"]
    node.manager.stop()
    state = node.manager.checkpoint.load()
    assert state is not None
    assert sorted(state.reservations) == ["u1", "u2"]
    unnamed = {uid: r for uid, r in state.reservations.items() if uid != "u2"}
    node.manager.checkpoint.save(dataclasses.replace(state, reservations=unnamed))
    node.manager = node.new_manager()  # a restart: the names come from the checkpoint
    node.manager.start()
    assert node.manager.unprepare_orphans({"u1", "u2"}) == {"u1": None, "u2": None}
    assert node.manager.plugin.metadata.claim_uids() == {}
    assert node.specs() == []
    assert node.saved_claims() == {}


def test_corrupt_checkpoint_refuses_to_start(node: Node) -> None:
    node.manager.start()
    node.manager.stop()
    node.manager.checkpoint.path.write_text("{}")
    node.manager = node.new_manager()
    with pytest.raises(CheckpointError, match="is corrupt"):
        node.manager.start()
    assert not node.manager.plugin.sockets.registration.exists()
    node.manager.stop()
    assert node.manager.checkpoint.path.read_text() == "{}", "a refused checkpoint replaced"


def test_switching_policy_with_claims_held_is_refused(tmp_path: Path) -> None:
    ta = Node(tmp_path, "topology-aware")
    ta.manager.start()
    ta.manager.plugin.node_prepare([ta.add_claim("u1", results_for(ta))])
    ta.manager.stop()
    static = Node(tmp_path, "static")
    with pytest.raises(CheckpointError, match="holds 1 claims of policy topology-aware"):
        static.manager.start()


def test_reconfigure_live(node: Node) -> None:
    node.manager.start()
    ref = node.add_claim("u1", results_for(node))
    node.manager.plugin.node_prepare([ref])
    (grant,) = node.manager.policy.grants("u1")
    taken = parse_config({"policy": node.policy_name, "reservedCPUs": str(min(grant.cpus))})
    with pytest.raises(PolicyError, match="can't reserve"):
        node.manager.reconfigure(taken)
    free = min(node.manager.policy.free_cpus())  # type: ignore[attr-defined]
    node.manager.reconfigure(parse_config({"policy": node.policy_name, "reservedCPUs": str(free)}))
    assert node.manager.plugin.wait_published(10) is not None
    assert node.cluster.pool_devices() == node.manager.policy.devices()


def test_unwritable_state_fails_the_claim_and_keeps_nothing(node: Node) -> None:
    node.manager.start()
    state = node.tmp / "state"
    state.chmod(0o500)
    blocker = node.manager.checkpoint.path
    blocker.unlink()
    blocker.mkdir()  # even root cannot replace a directory with a file
    try:
        ref = node.add_claim("u1", results_for(node))
        answer = node.manager.plugin.node_prepare([ref])["u1"]
    finally:
        blocker.rmdir()
        state.chmod(0o700)
    assert "committing the allocation failed" in str(answer.error)
    assert node.manager.policy.claim_uids() == frozenset()
    assert node.specs() == []


def test_rolling_update_instances_share_the_books(tmp_path: Path) -> None:
    """Two instances during a rolling update commit to one checkpoint; each catches up
    with the other's commits before acting, so neither gives away what the other granted."""
    old, new = Node(tmp_path, "static"), Node(tmp_path, "static")
    new.cluster = old.cluster
    old.manager = old.new_manager("pod-old")
    new.manager = new.new_manager("pod-new")
    old.manager.start()
    new.manager.start()
    try:
        first = old.add_claim("first", results_for(old))  # cpu005
        assert old.manager.plugin.node_prepare([first])["first"].error is None
        clash = new.add_claim("clash", results_for(new))  # cpu005 again
        answer = new.manager.plugin.node_prepare([clash])["clash"]
        assert "CPU 5 is held by claim first" in str(answer.error)
        second = new.add_claim("second", [result("req", "cpu006", driver=new.driver, pool=NODE)])
        assert new.manager.plugin.node_prepare([second])["second"].error is None
        assert sorted(new.saved_claims()) == ["first", "second"]
        old.manager.stop()
        assert new.manager.plugin.node_unprepare([first]) == {"first": None}
        assert new.manager.policy.claim_uids() == {"second"}
    finally:
        old.manager.stop()
        new.manager.stop()


def test_reconfigure_checks_against_the_other_instances_commits(tmp_path: Path) -> None:
    """During a rolling update a reconfiguration sees what the other instance granted: it
    may not reserve a CPU that the other instance gave a claim a moment ago."""
    old, new = Node(tmp_path, "static"), Node(tmp_path, "static")
    new.cluster = old.cluster
    old.manager = old.new_manager("pod-old")
    new.manager = new.new_manager("pod-new")
    old.manager.start()
    new.manager.start()
    try:
        first = old.add_claim("first", results_for(old))  # cpu005, granted by the old one
        assert old.manager.plugin.node_prepare([first])["first"].error is None
        with pytest.raises(PolicyError, match="can't reserve CPUs 5"):
            new.manager.reconfigure(parse_config({"policy": "static", "reservedCPUs": "5"}))
        assert 5 not in new.manager.policy.config.reserved_cpus
    finally:
        old.manager.stop()
        new.manager.stop()


# -- one commit per request --------------------------------------------------------------------


def results_on(node: Node, index: int) -> list[dict[str, Any]]:
    """A result on a device of its own for each ``index`` (0-3)."""
    if node.policy_name == "topology-aware":
        device = f"cpudevnuma{index:03d}"
        return [result("req", device, driver=node.driver, pool=NODE, consumedCapacity={"cpu": "2"})]
    return [result("req", f"cpu{5 + index:03d}", driver=node.driver, pool=NODE)]


class CountedSaves:
    """Counts the checkpoint's writes, and makes them fail while ``failing`` is set."""

    def __init__(self, node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self.failing: Exception | None = None
        checkpoint = node.manager.checkpoint
        real = checkpoint.save

        def save(*args: Any, **kwargs: Any) -> None:
            self.count += 1
            if self.failing is not None:
                raise self.failing
            real(*args, **kwargs)

        monkeypatch.setattr(checkpoint, "save", save)


def test_a_request_of_many_claims_writes_the_checkpoint_once(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    node.manager.start()
    saves = CountedSaves(node, monkeypatch)
    refs = [node.add_claim(f"u{i}", results_on(node, i)) for i in range(3)]
    answers = node.manager.plugin.node_prepare(refs)
    assert {uid: a.error for uid, a in answers.items()} == dict.fromkeys(["u0", "u1", "u2"])
    assert saves.count == 1
    assert node.manager.policy.claim_uids() == {"u0", "u1", "u2"}
    assert set(node.saved_claims()) == {"u0", "u1", "u2"}
    assert len(node.specs()) == 3

    assert node.manager.plugin.node_unprepare(refs) == dict.fromkeys(["u0", "u1", "u2"])
    assert saves.count == 2
    assert node.specs() == []
    assert node.saved_claims() == {}


def test_a_failed_commit_fails_the_request_and_keeps_what_was_durable(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claims new in the request are given back; one prepared before keeps its CPUs and
    its spec; the checkpoint stays as it was; a retry then works."""
    node.manager.start()
    first = node.add_claim("u0", results_on(node, 0))
    assert node.manager.plugin.node_prepare([first])["u0"].error is None
    before_grants = node.manager.policy.grants("u0")
    before_file = node.manager.checkpoint.path.read_bytes()
    before_specs = node.specs()
    saves = CountedSaves(node, monkeypatch)
    saves.failing = OSError(28, "No space left on device")

    refs = [first, *(node.add_claim(f"u{i}", results_on(node, i)) for i in (1, 2))]
    answers = node.manager.plugin.node_prepare(refs)
    for uid in ("u0", "u1", "u2"):
        assert "committing the allocation failed" in str(answers[uid].error), answers[uid]
        assert "No space left on device" in str(answers[uid].error)
    assert node.manager.policy.claim_uids() == {"u0"}
    assert node.manager.policy.grants("u0") == before_grants
    assert node.manager.checkpoint.path.read_bytes() == before_file
    assert node.specs() == before_specs
    assert node.manager.committed_claims() == {"u0"}

    saves.failing = None
    answers = node.manager.plugin.node_prepare(refs)
    assert {uid: a.error for uid, a in answers.items()} == dict.fromkeys(["u0", "u1", "u2"])
    assert node.manager.policy.grants("u0") == before_grants


def test_a_failed_release_commit_keeps_the_claims_and_their_specs(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    node.manager.start()
    refs = [node.add_claim(f"u{i}", results_on(node, i)) for i in range(2)]
    assert all(a.error is None for a in node.manager.plugin.node_prepare(refs).values())
    specs = node.specs()
    saves = CountedSaves(node, monkeypatch)
    saves.failing = OSError(30, "Read-only file system")

    answers = node.manager.plugin.node_unprepare(refs)
    assert all("committing the release failed" in str(e) for e in answers.values()), answers
    assert node.manager.policy.claim_uids() == {"u0", "u1"}
    assert node.specs() == specs

    saves.failing = None
    assert node.manager.plugin.node_unprepare(refs) == dict.fromkeys(["u0", "u1"])
    assert node.specs() == []


class GatedSaves(CountedSaves):
    """Counted saves; those numbered in ``gated`` (0: the first) wait for their gate,
    holding the lock as saves do."""

    def __init__(
        self, node: Node, monkeypatch: pytest.MonkeyPatch, gated: tuple[int, ...] = (0,)
    ) -> None:
        super().__init__(node, monkeypatch)
        self.gates = {n: threading.Event() for n in gated}
        self.waiting: int | None = None
        """The number of the save waiting at its gate now."""
        counted = node.manager.checkpoint.save

        def save(*args: Any, **kwargs: Any) -> None:
            gate = self.gates.get(self.count)
            if gate is not None:
                self.waiting = self.count
                assert gate.wait(30), "the test never opened the gate"
                self.waiting = None
            counted(*args, **kwargs)

        monkeypatch.setattr(node.manager.checkpoint, "save", save)


def prepare_in_threads(
    node: Node, refs: list[ClaimRef], answers: dict[str, Any]
) -> list[threading.Thread]:
    """Prepare each claim in a kubelet request of its own, all at once, into ``answers``."""

    def prepare(ref: ClaimRef) -> None:
        answers.update(node.manager.plugin.node_prepare([ref]))

    threads = [threading.Thread(target=prepare, args=(ref,)) for ref in refs]
    for thread in threads:
        thread.start()
    return threads


def three_behind_a_write(
    node: Node, monkeypatch: pytest.MonkeyPatch, gated: tuple[int, ...] = (0,)
) -> tuple[GatedSaves, list[threading.Thread], dict[str, Any]]:
    """The first request's write held at its gate while three more requests wait for the
    lock behind it, each for a claim of its own (u0 to u3): (saves, threads, answers)."""
    node.manager.start()
    saves = GatedSaves(node, monkeypatch, gated)
    refs = [node.add_claim(f"u{i}", results_on(node, i)) for i in range(4)]
    answers: dict[str, Any] = {}
    threads = prepare_in_threads(node, refs[:1], answers)
    wait_for(lambda: saves.waiting == 0, "the first request's write at its gate")
    threads += prepare_in_threads(node, refs[1:], answers)
    wait_for(lambda: node.manager._lock.requests_waiting == 3, "three requests at the lock")
    return saves, threads, answers


def wait_for(check: Callable[[], bool], what: str) -> None:
    poll(lambda: check() or None, 30, lambda: what, interval=0.005)


@pytest.fixture
def patient_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches wait for everyone who waits for the lock, however slow the machine."""
    monkeypatch.setattr(batchlock, "BATCH_WAIT", 60.0)


@pytest.mark.usefixtures("patient_batches")
def test_requests_that_come_together_share_one_checkpoint_write(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While one request's write is under way, the requests that queue behind it for the
    lock are committed together by one write, and each of them gets its claim."""
    saves, threads, answers = three_behind_a_write(node, monkeypatch)
    saves.gates[0].set()
    for thread in threads:
        thread.join(30)
    assert {uid: a.error for uid, a in answers.items()} == dict.fromkeys(["u0", "u1", "u2", "u3"])
    assert saves.count == 2, "one write for the first request, one for the three behind it"
    assert set(node.saved_claims()) == {"u0", "u1", "u2", "u3"}
    assert len(node.specs()) == 4


@pytest.mark.usefixtures("patient_batches")
def test_a_failed_shared_write_fails_every_request_of_the_batch(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    saves, threads, answers = three_behind_a_write(node, monkeypatch, gated=(0, 1))
    saves.gates[0].set()
    wait_for(lambda: saves.waiting == 1, "the batch's write at its gate")
    saves.failing = OSError(28, "No space left on device")
    saves.gates[1].set()
    for thread in threads:
        thread.join(30)
    assert answers["u0"].error is None
    for uid in ("u1", "u2", "u3"):
        assert "No space left on device" in str(answers[uid].error), answers[uid]
    assert saves.count == 2, "the three behind the first failed together, in one write"
    assert node.manager.policy.claim_uids() == {"u0"}
    assert node.manager.committed_claims() == {"u0"}
    assert len(node.specs()) == 1
    saves.failing = None  # the stop saves too


@pytest.mark.usefixtures("patient_batches")
def test_other_holders_of_the_lock_see_requests_whole(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runtime event (or anyone but a kubelet request) that comes while a batch is being
    committed waits for the batch's requests: it sees all of their claims, committed and
    with their specs, never a batch between its commit and its specs."""
    saves, threads, answers = three_behind_a_write(node, monkeypatch, gated=(0, 1))
    seen: list[tuple[set[str], set[str], int]] = []

    def runtime_event() -> None:
        with node.manager:
            state = node.manager.checkpoint.load()
            assert state is not None
            seen.append(
                (set(node.manager.policy.claim_uids()), set(state.claims), len(node.specs()))
            )

    saves.gates[0].set()
    wait_for(lambda: saves.waiting == 1, "the batch's write at its gate")
    event = threading.Thread(target=runtime_event)
    event.start()
    wait_for(lambda: node.manager._lock.others_waiting == 1, "the event waiting for the lock")
    saves.gates[1].set()
    for thread in [*threads, event]:
        thread.join(30)
    assert {uid: a.error for uid, a in answers.items()} == dict.fromkeys(["u0", "u1", "u2", "u3"])
    all_four = {"u0", "u1", "u2", "u3"}
    assert seen == [(all_four, all_four, 4)], "the event saw a batch half done"


# -- a commit that fails once the new state is written ------------------------------------


class FailingAfterWrite:
    """Makes the checkpoint's writes fail once the new state is written (while ``failing``
    is set): its sync fails, or (as a crash point that raised) the step right after it."""

    def __init__(self, where: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.failing = False
        real_write, real_sync, real_point = os.pwrite, os.fdatasync, faults.crash_point
        written: set[int] = set()

        def pwrite(fd: int, data: Any, offset: int) -> int:
            written.add(fd)
            return real_write(fd, data, offset)

        def fdatasync(fd: int) -> None:
            # Only the sync of a write: the one before it (of what another process wrote)
            # failing fails the commit with nothing written.
            if self.failing and where == "sync" and fd in written:
                written.discard(fd)
                raise OSError(5, "Input/output error")
            written.discard(fd)
            real_sync(fd)

        def crash_point(name: str) -> None:
            if self.failing and where == "after the sync" and name.endswith("checkpoint-synced"):
                raise RuntimeError(f"failed at {name}")
            real_point(name)

        monkeypatch.setattr(os, "pwrite", pwrite)
        monkeypatch.setattr(os, "fdatasync", fdatasync)
        monkeypatch.setattr(faults, "crash_point", crash_point)


AFTER_WRITE = ["sync", "after the sync"]


def assert_memory_is_the_disk(node: Node) -> dict[str, Any]:
    """What the running manager holds is what its checkpoint (and so a restart) holds."""
    saved = node.manager.checkpoint.load()
    assert saved is not None
    assert node.manager.policy.snapshot() == saved.claims, "memory and disk disagree"
    assert node.manager.committed_claims() == set(saved.claims)
    return dict(saved.claims)


@pytest.mark.parametrize("where", AFTER_WRITE)
def test_a_prepare_commit_that_fails_once_written_holds_what_the_disk_holds(
    node: Node, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """The new state is written: the policy keeps the batch's claims, as a restart
    would read them, but the request fails (the commit may not survive a power cut) and
    writes no spec; the kubelet's retry commits again and gets what a clean run gives."""
    node.manager.start()
    first = node.add_claim("u0", results_on(node, 0))
    assert node.manager.plugin.node_prepare([first])["u0"].error is None
    before_specs = node.specs()
    fault = FailingAfterWrite(where, monkeypatch)
    fault.failing = True

    refs = [first, *(node.add_claim(f"u{i}", results_on(node, i)) for i in (1, 2))]
    answers = node.manager.plugin.node_prepare(refs)
    for uid in ("u0", "u1", "u2"):
        assert "committing the allocation failed" in str(answers[uid].error), answers[uid]
    held = assert_memory_is_the_disk(node)
    assert set(held) == {"u0", "u1", "u2"}
    assert node.specs() == before_specs, "a spec written for a commit that failed"
    restarted = make_policy(topology(SHAPE), node.config)
    restarted.restore(held)
    assert restarted.snapshot() == node.manager.policy.snapshot()

    fault.failing = False
    answers = node.manager.plugin.node_prepare(refs)
    assert {uid: a.error for uid, a in answers.items()} == dict.fromkeys(["u0", "u1", "u2"])
    assert assert_memory_is_the_disk(node) == held, "the retry allocated anew"
    assert len(node.specs()) == 3


@pytest.mark.parametrize("where", AFTER_WRITE)
def test_a_release_commit_that_fails_once_written_holds_what_the_disk_holds(
    node: Node, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """The release is on disk: the policy has let the claims go too; their specs stay
    for the kubelet's retry, which succeeds and removes them."""
    node.manager.start()
    refs = [node.add_claim(f"u{i}", results_on(node, i)) for i in range(2)]
    assert all(a.error is None for a in node.manager.plugin.node_prepare(refs).values())
    specs = node.specs()
    fault = FailingAfterWrite(where, monkeypatch)
    fault.failing = True

    answers = node.manager.plugin.node_unprepare(refs)
    assert all("committing the release failed" in str(e) for e in answers.values()), answers
    assert assert_memory_is_the_disk(node) == {}
    assert node.specs() == specs

    fault.failing = False
    assert node.manager.plugin.node_unprepare(refs) == dict.fromkeys(["u0", "u1"])
    assert assert_memory_is_the_disk(node) == {}
    assert node.specs() == []


@pytest.mark.parametrize("where", AFTER_WRITE)
def test_after_a_commit_that_failed_once_written_both_instances_agree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """During a rolling update the other instance catches up with the checkpoint on disk:
    the instance whose commit failed once written must hold the same claims, and
    neither may give their CPUs to another claim."""
    old, new = Node(tmp_path, "static"), Node(tmp_path, "static")
    new.cluster = old.cluster
    old.manager = old.new_manager("pod-old")
    new.manager = new.new_manager("pod-new")
    old.manager.start()
    new.manager.start()
    try:
        fault = FailingAfterWrite(where, monkeypatch)
        fault.failing = True
        first = old.add_claim("first", results_for(old))  # cpu005
        assert old.manager.plugin.node_prepare([first])["first"].error is not None
        fault.failing = False
        assert old.manager.policy.claim_uids() == {"first"}
        assert new.manager.committed_claims() == {"first"}
        assert old.manager.committed_claims() == {"first"}
        clash = old.add_claim("clash", results_for(old))  # cpu005 again
        for instance in (old, new):
            answer = instance.manager.plugin.node_prepare([clash])["clash"]
            assert "CPU 5 is held by claim first" in str(answer.error)
        assert new.manager.plugin.node_prepare([first])["first"].error is None
        assert old.manager.policy.snapshot() == new.manager.policy.snapshot()
    finally:
        old.manager.stop()
        new.manager.stop()


# -- catching up with the other instance's commits (issue 40) ------------------------------------


def rolling_update(tmp_path: Path) -> tuple[Node, Node]:
    """Two started instances of the static policy sharing one node's directories."""
    old, new = Node(tmp_path, "static"), Node(tmp_path, "static")
    new.cluster = old.cluster
    old.manager = old.new_manager("pod-old")
    new.manager = new.new_manager("pod-new")
    old.manager.start()
    new.manager.start()
    return old, new


def write_in_place(path: Path, data: bytes) -> None:
    """Overwrite ``path`` with ``data`` in place (same inode), as a slot write does."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, 0)
    finally:
        os.close(fd)


def test_a_commit_read_half_written_is_taken_back_once_whole(tmp_path: Path) -> None:
    """An instance reading without the instance lock (a runtime event, the status writer,
    the orphan check) may read the other's commit while its slot is half copied: it works
    from the commit before, and takes the new one back once it is whole, never remembering
    the half-written one as seen (it would then act on stale books, and its next save would
    erase the other's claim)."""
    old, new = rolling_update(tmp_path)
    try:
        path = new.manager.checkpoint.path
        before = path.read_bytes()
        first = new.add_claim("first", results_for(new))  # cpu005
        assert new.manager.plugin.node_prepare([first])["first"].error is None
        after = path.read_bytes()
        changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
        half = (changed[0] + changed[-1]) // 2
        write_in_place(path, after[:half] + before[half:])  # the header is new, not the record
        assert old.manager.committed_claims() == set(), "a half-written commit was read"
        write_in_place(path, after)  # the write goes on to its end
        assert old.manager.committed_claims() == {"first"}
        clash = old.add_claim("clash", results_for(old))  # cpu005 again
        assert "CPU 5 is held by claim first" in str(
            old.manager.plugin.node_prepare([clash])["clash"].error
        )
        old.manager.stop()
        assert "first" in new.saved_claims(), "the old instance's last save erased it"
    finally:
        old.manager.stop()
        new.manager.stop()


def test_a_checkpoint_moved_aside_does_not_stop_the_catching_up(tmp_path: Path) -> None:
    """With no checkpoint at all for a moment (moved aside while both run), an instance
    still notices the file the other one makes next, and takes its claims back."""
    old, new = rolling_update(tmp_path)
    try:
        state_dir = new.manager.checkpoint.path.parent
        aside = tmp_path / "aside"
        state_dir.rename(aside)
        state_dir.mkdir()
        assert old.manager.committed_claims() == set()
        first = new.add_claim("first", results_for(new))  # cpu005
        assert new.manager.plugin.node_prepare([first])["first"].error is None
        assert old.manager.committed_claims() == {"first"}
        old.manager.stop()
        assert "first" in new.saved_claims(), "the old instance's last save erased it"
    finally:
        old.manager.stop()
        new.manager.stop()


def test_while_pinning_is_held_claims_are_refused_with_the_reason(tmp_path: Path) -> None:
    """Held (the kubelet's CPU manager pins): the reason reaches the kubelet; then not."""
    why: list[str | None] = ["the kubelet's CPU manager policy is static"]
    config = parse_config({"policy": "static", "reservedCPUs": "0"})
    manager = ResourceManager(
        make_policy(topology(SHAPE), config),
        FakeCluster(),
        ManagerOptions(
            node_name=NODE,
            state_dir=tmp_path / "state",
            registrar_dir=tmp_path / "registry",
            plugin_data_dir=tmp_path / "plugin",
            cdi_dir=tmp_path / "cdi",
            pinning="best-effort",
            hold=lambda: why[0],
        ),
        lambda reason: None,
    )
    driver = driver_name("static")
    claim = make_claim("uid-1", [result("r", "cpu001", driver=driver, pool=NODE)])
    results = claim_results(claim, driver)
    with pytest.raises(RuntimeError, match="claims are refused on this node: the kubelet's CPU"):
        manager.allocate_claim(claim, results)
    assert manager.policy.claim_uids() == frozenset()
    why[0] = None
    manager.allocate_claim(claim, results)
    assert manager.policy.claim_uids() == {"uid-1"}
