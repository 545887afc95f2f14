"""What goes wrong around nodedra: the kubelet restarts, the API server goes away, the CDI
directory fills up or turns read-only, the checkpoint is damaged.

The kubelet and API server tests run the real peers (tests/peers); the others run the real
resource manager, plugin and policies with a fake of our own ClusterAPI protocol.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient

from nodedra.dra import KubeAPIError, KubeClusterAPI, RecoverableError, RequestReport
from nodedra.dra.kube import RESOURCE_API
from nodedra.dra.publisher import SlicePublisher
from nodedra.dra.slices import SliceApplier
from nodedra.lib.slotfile import SlotFile
from nodedra.policy import PolicyError, parse_config
from nodedra.resmgr import CheckpointError
from nodedra.resmgr.checkpoint import FILE_NAME, LEGACY_NAME
from tests.peers.build import PeerBinaries
from tests.peers.cluster import (
    create_ready_node,
    ensure_test_namespace,
    poll,
    pool_devices,
    resource_slices,
)
from tests.peers.controlplane import ControlPlane, feature_gates_flag
from tests.peers.kubelet import KubeletHarness
from tests.reliability.helpers import (
    POLICIES,
    ClaimsOnServer,
    LocalNode,
    admin_client,
    check_state,
    ref_of,
    sample_claim,
    short_dir,
    static_result,
)
from tests.unit.dra.fakes import NODE, FakeCluster, devices, make_claim

STATIC = "static.nri.io"


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_dir("nd-fault-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Requests:
    """A RequestObserver that counts the kubelet requests nodedra answered, by kind."""

    def __init__(self) -> None:
        self.kinds: list[str] = []
        self._lock = threading.Lock()

    def request_done(self, report: RequestReport) -> None:
        with self._lock:
            self.kinds.append(report.kind)

    def count(self, kind: str) -> int:
        with self._lock:
            return self.kinds.count(kind)


def create_allocated_claim(
    cp: ControlPlane,
    namespace: str,
    name: str,
    *,
    pool: str,
    cpus: Sequence[int],
    reserved_for: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A ResourceClaim allocated the static driver's CPUs, as the scheduler would write it.

    The API server validates the allocation like any other; only the choice is ours.
    """
    cp.request(
        "POST",
        f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "cpus",
                            "exactly": {"deviceClassName": STATIC, "count": len(cpus)},
                        }
                    ]
                }
            },
        },
    )
    status: dict[str, Any] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "cpus", "driver": STATIC, "pool": pool, "device": f"cpu{c:03d}"}
                    for c in cpus
                ]
            }
        }
    }
    if reserved_for is not None:
        status["reservedFor"] = [reserved_for]
    claim: dict[str, Any] = cp.request(
        "PATCH",
        f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{name}/status",
        {"status": status},
        content_type="application/merge-patch+json",
    )
    return claim


def published_devices(cp: ControlPlane, node: str, driver: str) -> list[dict[str, Any]] | None:
    """The devices of the pool's newest generation, once all its slices are there."""
    return pool_devices(resource_slices(cp, node, driver))


def wait_published(cp: ControlPlane, node: LocalNode, timeout: float = 60) -> None:
    """Wait until the API server has exactly the devices the node's policy has now."""
    expected = node.policy.devices()
    seen: list[Any] = []

    def check() -> bool | None:
        seen[:] = [published_devices(cp, node.node_name, node.driver)]
        return True if seen[0] == expected else None

    poll(check, timeout, lambda: f"the slices of {node.driver} to hold {expected}; saw {seen}")


# --- (a) the kubelet restarts -------------------------------------------------------------


def test_kubelet_restart(  # noqa: PLR0917 (fixtures)
    control_plane: ControlPlane,
    admin_api: ApiClient,
    peer_binaries: PeerBinaries,
    peer_workdir: Path,
    ready_node: str,
    namespace: str,
) -> None:
    """A new kubelet for the same node and registry wipes the node's slices and registers
    the plugins it finds again: nodedra is registered again, its slices come back, and the
    claim prepared before gets the same CDI devices.

    The new kubelet starts without the old one's DRA checkpoint, so it asks nodedra to
    prepare the claim again rather than answering from its own records. (With the old
    checkpoint the harness, which knows no running pods, would unprepare the claim.)
    """
    cp = control_plane
    kubelet_dir = peer_workdir / "kubelet"

    def kubelet(state: str) -> KubeletHarness:
        harness = KubeletHarness(
            peer_binaries.kubelet_harness,
            cp.node_kubeconfig(ready_node),
            ready_node,
            kubelet_dir,  # the same registry directory each time
            feature_gates=feature_gates_flag(cp.feature_gates),
        )
        harness.state_dir = kubelet_dir / state
        return harness

    requests = Requests()
    first = kubelet("state")
    first.start()
    node: LocalNode | None = None
    second: KubeletHarness | None = None
    try:
        first.wait_slice_wipe("")
        node = LocalNode(
            peer_workdir / "nodedra",
            "static",
            cluster=KubeClusterAPI(admin_api),
            node_name=ready_node,
            registrar_dir=first.registry_dir,
            resync_period=0.5,
            observer=requests,
        )
        node.manager.start()
        first.wait_registered(STATIC)
        wait_published(cp, node)

        pod = cp.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "consumer"},
                "spec": {
                    "nodeName": ready_node,
                    "automountServiceAccountToken": False,
                    "resourceClaims": [{"name": "cpus", "resourceClaimName": "consumer-cpus"}],
                    "containers": [
                        {
                            "name": "app",
                            "image": "registry.invalid/none:0",
                            "resources": {"claims": [{"name": "cpus"}]},
                        }
                    ],
                },
            },
        )
        claim = create_allocated_claim(
            cp,
            namespace,
            "consumer-cpus",
            pool=ready_node,
            cpus=[12, 40],
            reserved_for={"resource": "pods", "name": "consumer", "uid": pod["metadata"]["uid"]},
        )
        uid = claim["metadata"]["uid"]
        expected = {"app": [f"{STATIC}/device=claim-{uid}-{i}" for i in range(2)]}
        assert first.prepare(namespace, "consumer") == expected
        grants = node.policy.grants(uid)
        assert requests.count("prepare") == 1

        first.stop()
        second = kubelet("state-after-restart")
        second.start()
        second.wait_slice_wipe("")  # the new kubelet deleted the node's slices...
        second.wait_registered(STATIC)  # ...and registered the plugin it found
        wait_published(cp, node)  # nodedra noticed and published them again

        assert second.prepare(namespace, "consumer") == expected
        assert requests.count("prepare") == 2, "the kubelet did not ask nodedra again"
        assert node.policy.grants(uid) == grants  # the same CPUs, nothing more
        check_state(node.state())
        second.unprepare(namespace, "consumer")
        assert uid not in node.policy.claim_uids()
        check_state(node.state())
        assert node.shutdowns == []
    finally:
        if node is not None:
            node.manager.stop()
        for harness in (second, first):
            if harness is not None:
                harness.stop()


# --- (b) the API server goes away -----------------------------------------------------------


@pytest.fixture
def own_control_plane(peer_binaries: PeerBinaries) -> Iterator[ControlPlane]:
    """A control plane for one test, which may stop and restart its API server."""
    workdir = Path(tempfile.mkdtemp(prefix="nd-cp-"))
    cp = ControlPlane(peer_binaries, workdir)
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def test_api_server_outage(
    own_control_plane: ControlPlane, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cp = own_control_plane
    node_name, namespace = "outage-node", "outage"
    create_ready_node(cp, node_name)
    ensure_test_namespace(cp, namespace)
    claims = {
        name: create_allocated_claim(cp, namespace, name, pool=node_name, cpus=cpus)
        for name, cpus in (("before", [10, 11]), ("during", [20]))
    }
    before, during = (ref_of(claims[name]) for name in ("before", "during"))
    api = admin_client(cp)
    node = LocalNode(
        root, "static", cluster=KubeClusterAPI(api), node_name=node_name, resync_period=0.5
    )
    node.manager.start()
    try:
        wait_published(cp, node)
        assert node.prepare(before)[before.uid].error is None

        cp.stop_apiserver()
        caplog.set_level(logging.WARNING, logger="nodedra.dra")
        # A claim that cannot be fetched fails on its own, saying which and why.
        error = str(node.prepare(during)[during.uid].error)
        assert f"claim {namespace}/during ({during.uid}): cannot get it from the API server" in (
            error
        )
        assert f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/during" in error
        assert during.uid not in node.policy.claim_uids()
        # Unprepare needs no API server.
        assert node.unprepare(before) == {before.uid: None}
        check_state(node.state())
        # New devices cannot be published now: that is retried, never fatal.
        node.manager.reconfigure(parse_config({"policy": "static", "reservedCPUs": "0-3"}))

        def publishing_failed() -> bool | None:
            return (
                any("publishing ResourceSlices failed" in r.getMessage() for r in caplog.records)
                or None
            )

        poll(publishing_failed, 30, lambda: "a failed publication to be logged")
        failures = [r for r in caplog.records if "publishing ResourceSlices" in r.getMessage()]
        assert {r.levelno for r in failures} == {logging.WARNING}
        assert node.shutdowns == []

        cp.restart_apiserver()
        wait_published(cp, node)  # the new devices, without CPUs 0-3
        assert [d["name"] for d in node.policy.devices()][:1] == ["cpu004"]
        assert node.prepare(during)[during.uid].error is None
        check_state(node.state())
        assert node.unprepare(during) == {during.uid: None}
        assert node.shutdowns == []
    finally:
        node.manager.stop()
        api.close()  # type: ignore[no-untyped-call]


def test_a_resync_cuts_a_publishing_backoff_short() -> None:
    """A watch event (resync) after an outage publishes at once, whatever the backoff."""
    cluster = FakeCluster()
    cluster.fail_next = [KubeAPIError(0, "connection refused")]
    errors: list[Exception] = []
    hour = 3600.0
    publisher = SlicePublisher(
        SliceApplier(cluster, NODE, "backoff.nri.io"),
        lambda err, msg: errors.append(err),
        resync_period=hour,
        min_backoff=hour,
        max_backoff=hour,
    )
    publisher.publish(devices(3))
    publisher.start()
    try:
        poll(lambda: errors or None, 30, lambda: "the first publication to fail")
        assert all(isinstance(err, RecoverableError) for err in errors)
        publisher.resync()
        assert publisher.wait_synced(30) is not None, "the resync waited for the backoff"
        assert cluster.pool_devices() == devices(3)
    finally:
        publisher.stop()


# --- (c) the CDI or state directory cannot be written ----------------------------------------


def _mount(*args: str) -> None:
    """Run mount(8); fail the test, saying why, when that cannot be done here."""
    if os.geteuid() != 0:
        pytest.fail(
            "this test mounts a tmpfs to make a directory full (ENOSPC) or read-only (EROFS), "
            "which takes root: run the suite as root (CI does)",
            pytrace=False,
        )
    try:
        done = subprocess.run(
            ["mount", *args], capture_output=True, text=True, timeout=30, check=False
        )
    except OSError as err:
        pytest.fail(f"cannot run mount {' '.join(args)}: {err}", pytrace=False)
    if done.returncode != 0:
        pytest.fail(
            f"mount {' '.join(args)} failed ({done.stderr.strip()}): this test needs to mount "
            "a tmpfs (a size-limited one, remounted read-only) to produce the fault it tests",
            pytrace=False,
        )


class BrokenDir:
    """A directory that writes fail in, until it is repaired: a tmpfs mounted over it.

    "full": a tmpfs with 64 KiB more than the directory's files filled up, so writes of
    new data fail with ENOSPC; "read-only": the tmpfs
    remounted read-only, so they fail with EROFS. These are the faults of a real node's
    full or read-only disk; nothing else stands in for them.
    """

    def __init__(self, path: Path, fault: str) -> None:
        self.path = path
        self.fault = fault
        path.mkdir(parents=True, exist_ok=True)
        self.saved = {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()}
        room = 64 * 1024 + sum(len(data) for data in self.saved.values())
        _mount("-t", "tmpfs", "-o", f"size={room},mode=0755", "tmpfs", str(path))
        self.mounted = True
        self.reason = os.strerror(errno.ENOSPC if fault == "full" else errno.EROFS)
        """What the failing writes say."""
        self.broken = False

    def break_(self) -> None:
        self.broken = True
        for name, data in self.saved.items():
            (self.path / name).write_bytes(data)
        if self.fault == "read-only":
            _mount("-o", "remount,ro", str(self.path))
            return
        filler = os.open(self.path / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            with contextlib.suppress(OSError):  # until ENOSPC
                while os.write(filler, b"\0" * 4096):
                    pass
        finally:
            os.close(filler)

    def repair(self) -> None:
        if not self.broken:
            return
        self.broken = False
        if self.fault == "full":
            (self.path / "filler").unlink()
        else:
            _mount("-o", "remount,rw", str(self.path))

    def unmount(self) -> None:
        """Put what the tmpfs holds into the directory below it."""
        if self.mounted:
            kept = {p.name: p.read_bytes() for p in self.path.iterdir() if p.name != "filler"}
            subprocess.run(["umount", str(self.path)], capture_output=True, check=True, timeout=30)
            for name, data in kept.items():
                (self.path / name).write_bytes(data)
            self.mounted = False


@contextlib.contextmanager
def failing_dir(path: Path, fault: str) -> Iterator[BrokenDir]:
    """The directory ``path`` broken (see BrokenDir) for the ``with`` block."""
    broken = BrokenDir(path, fault)
    try:
        broken.break_()
        yield broken
    finally:
        broken.repair()
        broken.unmount()


@pytest.mark.parametrize("fault", ["full", "read-only"])
@pytest.mark.parametrize("policy", POLICIES)
def test_cdi_dir_that_cannot_be_written(
    control_plane: ControlPlane, namespace: str, root: Path, policy: str, fault: str
) -> None:
    node = LocalNode(root, policy, cluster=ClaimsOnServer(control_plane, namespace))
    held, new = (node.serve(sample_claim(policy, uid)) for uid in ("b", "a"))
    node.manager.start()
    try:
        assert node.prepare(held)[held.uid].error is None
        books = node.policy.snapshot()
        saved = node.saved_state()
        assert saved is not None
        with failing_dir(node.cdi_dir, fault) as broken:
            error = str(node.prepare(new)[new.uid].error)
            assert error.startswith(f"claim {new}: ")
            assert f"CDI spec in {node.cdi_dir}" in error or f"CDI spec to {node.cdi_dir}" in error
            assert broken.reason in error
            # Nothing stays allocated: not in the policy, not in the checkpoint.
            assert node.policy.snapshot() == books
            assert node.saved_state() == saved
            if fault == "read-only":
                # The release is made, and durable; only the spec is left for a retry.
                error = str(node.unprepare(held)[held.uid])
                assert error.startswith(f"claim {held}: released, but removing its")
                assert node.policy.snapshot() == {}
                assert node.saved_state() == replace(saved, claims={}, reservations={})
            broken.repair()
        if fault == "read-only":
            # A spec is all a failure leaves behind; the kubelet's retry removes it.
            assert node.manager.plugin.cdi.claim_uids() == [held.uid]
            assert node.unprepare(held) == {held.uid: None}
        check_state(node.state())
        assert node.prepare(new)[new.uid].error is None
        check_state(node.state())
    finally:
        node.manager.stop()


@pytest.mark.parametrize("policy", POLICIES)
def test_state_dir_that_cannot_be_written(
    control_plane: ControlPlane, namespace: str, root: Path, policy: str
) -> None:
    """No commit, no allocation: a claim whose checkpoint write fails gets nothing."""
    node = LocalNode(root, policy, cluster=ClaimsOnServer(control_plane, namespace))
    held, new = (node.serve(sample_claim(policy, uid)) for uid in ("b", "a"))
    node.manager.start()
    try:
        assert node.prepare(held)[held.uid].error is None
        books = node.policy.snapshot()
        saved = node.saved_state()
        state_dir = node.manager.checkpoint.path.parent
        with failing_dir(state_dir, "read-only") as broken:
            error = str(node.prepare(new)[new.uid].error)
            assert error.startswith(f"claim {new}: committing the allocation failed")
            assert broken.reason in error
            assert node.policy.snapshot() == books
            assert node.saved_state() == saved
            assert node.manager.plugin.cdi.claim_uids() == [held.uid], "a spec without a commit"
            # An unprepare that cannot be committed keeps the claim's spec for the retry.
            error = str(node.unprepare(held)[held.uid])
            assert error.startswith(f"claim {held}: committing the release failed")
            assert node.manager.plugin.cdi.claim_uids() == [held.uid]
            broken.repair()
        assert node.unprepare(held) == {held.uid: None}
        check_state(node.state())
        assert node.prepare(new)[new.uid].error is None
        check_state(node.state())
    finally:
        node.manager.stop()


@pytest.mark.parametrize("policy", POLICIES)
def test_a_full_state_disk_fails_no_commit(
    control_plane: ControlPlane, namespace: str, root: Path, policy: str
) -> None:
    """The checkpoint's two slots take their disk space when the file is made, and a commit
    only overwrites them: a disk that fills up later fails no prepare and no unprepare."""
    node = LocalNode(root, policy, cluster=ClaimsOnServer(control_plane, namespace))
    held, new = (node.serve(sample_claim(policy, uid)) for uid in ("b", "a"))
    node.manager.start()
    try:
        assert node.prepare(held)[held.uid].error is None
        with failing_dir(node.manager.checkpoint.path.parent, "full"):
            assert node.prepare(new)[new.uid].error is None
            assert node.unprepare(held) == {held.uid: None}
            saved = node.saved_state()
            assert saved is not None
            assert set(saved.claims) == {new.uid}
            check_state(node.state())
    finally:
        node.manager.stop()


# --- (d) the checkpoint is damaged -----------------------------------------------------------


def _rewritten(data: bytes, change: Callable[[dict[str, Any]], None]) -> bytes:
    """The checkpoint file ``data`` with its newest record changed by ``change``: a record
    whose checksum matches, as the slot file's own write makes it."""
    with tempfile.TemporaryDirectory() as scratch:
        slots = SlotFile(Path(scratch) / FILE_NAME)
        slots.path.write_bytes(data)
        document = json.loads(slots.read() or b"")
        change(document)
        slots.write(json.dumps(document).encode())
        return slots.path.read_bytes()


def _same_cpu_twice(document: dict[str, Any]) -> None:
    claims = document["data"]["claims"]
    claims["copy"] = json.loads(json.dumps(claims["b"]))


def _reserved_cpu_held(document: dict[str, Any]) -> None:
    document["data"]["claims"]["b"]["grants"][0]["cpus"] = "0"


CORRUPTIONS: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "empty": (lambda data: b"", "is corrupt: its size"),
    "truncated": (lambda data: data[: len(data) // 2 + 1], "is corrupt: its size"),
    "garbage": (lambda data: bytes(range(256)), "is corrupt: neither of its two slots"),
    "bit flipped in both slots": (
        lambda data: data.replace(b'"memory"', b'"memorz"'),
        "is corrupt: neither of its two slots holds a whole record",
    ),
    "not a document": (
        lambda data: _rewritten(data, lambda d: d.update(kind="list")),
        "is corrupt: not a nodedra.checkpoint document",
    ),
    "newer": (
        lambda data: _rewritten(data, lambda d: d.update(version=99)),
        "has schema version 99, written by a newer nodedra",
    ),
    "same CPU twice": (
        lambda data: _rewritten(data, _same_cpu_twice),
        "would be granted twice",
    ),
    "reserved CPU held": (
        lambda data: _rewritten(data, _reserved_cpu_held),
        "reservedCPUs 0 are held by claims",
    ),
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_damaged_checkpoint_stops_the_start_until_moved_aside(root: Path, corruption: str) -> None:
    damage, message = CORRUPTIONS[corruption]
    node = LocalNode(root, "static")
    held = node.serve(make_claim("b", [static_result(10), static_result(38)]))
    node.manager.start()
    assert node.prepare(held)["b"].error is None
    node.manager.stop()
    path = node.manager.checkpoint.path
    damaged = damage(path.read_bytes())
    path.write_bytes(damaged)
    specs = node.spec_files()

    node.manager = node.new_manager()
    with pytest.raises((CheckpointError, PolicyError), match=message) as refused:
        node.manager.start()
    # What to do about it: the commands the message gives, or else (a refusal that says
    # to drain, or to run the newer nodedra) the state moved aside as deploying.md says.
    aside = re.findall(r"mv (\S+) (\S+?\.corrupt)\b", str(refused.value))
    if "corrupt" in str(refused.value):
        assert (str(path), f"{path}.corrupt") in aside
    else:
        aside = [(str(each), f"{each}.aside") for each in (path, path.with_name(LEGACY_NAME))]
    # Nothing started, nothing touched: no sockets, the specs and the damaged file as they were.
    assert not node.manager.plugin.sockets.registration.exists()
    assert not node.manager.plugin.sockets.dra.exists()
    assert node.spec_files() == specs
    assert path.read_bytes() == damaged
    node.manager.stop()

    for source, target in aside:
        os.rename(source, target)
    node.manager = node.new_manager()
    node.manager.start()
    try:
        check_state(node.state())
        assert node.state()["claims"] == {}
        assert node.prepare(held)[held.uid].error is None  # the drained pod's claim, again
        check_state(node.state())
    finally:
        node.manager.stop()
