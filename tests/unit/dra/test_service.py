"""The plugin's gRPC services over its real Unix sockets, called with the committed stubs."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from nodedra.dra import Plugin
from nodedra.dra.endpoint import InstanceLock, socket_paths
from nodedra.dra.service import PluginServers
from nodedra.grpc_gen import (
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from tests.unit.dra.fakes import DRIVER, make_claim, result
from tests.unit.dra.test_plugin import Rig


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Rig]:
    rig = Rig(tmp_path)
    rig.plugin.start()
    try:
        yield rig
    finally:
        rig.plugin.stop()


def channel(path: Path) -> grpc.Channel:
    return grpc.insecure_channel(f"unix:{path}")


def test_registration(running: Rig) -> None:
    sockets = running.plugin.sockets
    with channel(sockets.registration) as ch:
        stub = pluginregistration_v1_pb2_grpc.RegistrationStub(ch)
        info = stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=5)
        assert info.type == "DRAPlugin"
        assert info.name == DRIVER
        assert info.endpoint == str(sockets.dra)
        assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
        stub.NotifyRegistrationStatus(
            pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=True), timeout=5
        )
    servers = running.plugin._servers
    assert servers is not None
    assert servers.registration.notified.is_set()
    assert servers.registration.status is not None
    assert servers.registration.status.plugin_registered


def test_sockets_are_for_root_only(running: Rig) -> None:
    for path in (running.plugin.sockets.dra, running.plugin.sockets.registration):
        mode = os.stat(path).st_mode
        assert stat.S_ISSOCK(mode)
        assert stat.S_IMODE(mode) == 0o600


def prepare_request(pb: object, *claims: tuple[str, str, str]) -> object:
    return pb.NodePrepareResourcesRequest(  # type: ignore[attr-defined]
        claims=[pb.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]  # type: ignore[attr-defined]
    )


@pytest.mark.parametrize(
    ("pb", "grpc_module"), [(dra_v1_pb2, dra_v1_pb2_grpc), (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)]
)
def test_prepare_and_unprepare(running: Rig, pb: object, grpc_module: object) -> None:
    running.plugin.allow_claims()
    running.add(
        make_claim(
            "u1",
            [result("req/sub", "cpu-0", shareID="share-0"), result("other", "cpu-1")],
        )
    )
    running.add(make_claim("bad", [result("req", "cpu-9")]))
    running.policy.allocate_error = RuntimeError("no CPUs left")
    running.policy.fail_uid = "bad"
    with channel(running.plugin.sockets.dra) as ch:
        stub = grpc_module.DRAPluginStub(ch)  # type: ignore[attr-defined]
        response = stub.NodePrepareResources(
            prepare_request(
                pb,
                ("default", "claim-u1", "u1"),
                ("default", "claim-bad", "bad"),
                ("default", "missing", "m"),
            ),
            timeout=10,
        )
        assert set(response.claims) == {"u1", "bad", "m"}
        good = response.claims["u1"]
        assert good.error == ""
        first, second = good.devices
        assert list(first.request_names) == ["req"]
        assert (first.pool_name, first.device_name) == ("test-pool", "cpu-0")
        assert list(first.cdi_device_ids) == [f"{DRIVER}/device=claim-u1-0"]
        assert list(second.cdi_device_ids) == [f"{DRIVER}/device=claim-u1-1"]
        if pb is dra_v1_pb2:
            assert first.HasField("share_id")
            assert first.share_id == "share-0"
            assert not second.HasField("share_id")
        else:
            assert "share_id" not in pb.Device.DESCRIPTOR.fields_by_name  # type: ignore[attr-defined]
        assert "no CPUs left" in response.claims["bad"].error
        assert "cannot get it from the API server" in response.claims["m"].error

        unprepared = stub.NodeUnprepareResources(
            pb.NodeUnprepareResourcesRequest(  # type: ignore[attr-defined]
                claims=[
                    pb.Claim(namespace="default", name="claim-u1", uid="u1"),  # type: ignore[attr-defined]
                    pb.Claim(namespace="default", name="never", uid="unknown"),  # type: ignore[attr-defined]
                ]
            ),
            timeout=10,
        )
        assert set(unprepared.claims) == {"u1", "unknown"}
        assert all(entry.error == "" for entry in unprepared.claims.values())
    assert running.specs() == []


def test_refused_before_allowed(running: Rig) -> None:
    with channel(running.plugin.sockets.dra) as ch:
        stub = dra_v1_pb2_grpc.DRAPluginStub(ch)
        with pytest.raises(grpc.RpcError) as caught:
            stub.NodePrepareResources(prepare_request(dra_v1_pb2, ("ns", "c", "u")), timeout=10)  # type: ignore[arg-type]
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "still synchronizing" in str(caught.value.details())


def test_the_health_stream_says_nothing_until_the_plugin_stops(running: Rig) -> None:
    """Not advertised, but served: a kubelet that opens it anyway waits on it, reporting
    nothing, instead of asking again every 5 s (test_registration: not advertised). It ends,
    cleanly, when the plugin stops."""
    with channel(running.plugin.sockets.dra) as ch:
        stub = dra_health_v1alpha1_pb2_grpc.DRAResourceHealthStub(ch)
        request = dra_health_v1alpha1_pb2.NodeWatchResourcesRequest()
        quiet = stub.NodeWatchResources(request, timeout=2)
        with pytest.raises(grpc.RpcError) as caught:
            next(iter(quiet))
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        stream = stub.NodeWatchResources(request)
        stopping = threading.Thread(target=running.plugin.stop)
        stopping.start()
        assert list(stream) == []
        stopping.join()


def test_stop_leaves_another_instances_socket(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.plugin.start()
    path = rig.plugin.sockets.dra
    path.unlink()  # another instance took the path over
    other = socket.socket(socket.AF_UNIX)
    other.bind(str(path))
    try:
        rig.plugin.stop()
        assert path.is_socket()
        assert not rig.plugin.sockets.registration.exists()
    finally:
        other.close()


def test_rolling_update_instances_coexist(tmp_path: Path) -> None:
    old, new = Rig(tmp_path), Rig(tmp_path)
    old.options.rolling_update_uid, new.options.rolling_update_uid = "pod-old", "pod-new"
    old.plugin, new.plugin = Plugin(DRIVER, old.options), Plugin(DRIVER, new.options)
    old.plugin.start()
    new.plugin.start()
    try:
        old.plugin.stop()
        assert new.plugin.sockets.dra.is_socket()
        assert new.plugin.sockets.registration.is_socket()
        assert not old.plugin.sockets.dra.exists()
    finally:
        new.plugin.stop()


def test_lost_socket_is_fatal(tmp_path: Path) -> None:
    paths = socket_paths(DRIVER, tmp_path / "registry", tmp_path / "data", None)
    fatal: list[str] = []
    reported = threading.Event()

    def on_fatal(err: Exception, msg: str) -> None:
        fatal.append(f"{msg}: {err}")
        reported.set()

    rig = Rig(tmp_path)
    servers = PluginServers(DRIVER, paths, rig.plugin, on_fatal, check_period=0.05)
    servers.start()
    try:
        paths.registration.unlink()
        assert reported.wait(10)
    finally:
        servers.stop()
    assert fatal == [
        f"gRPC server: socket {paths.registration} was removed or replaced by someone else, "
        "so the kubelet can no longer reach this instance"
    ]


LOCK_HOLDER = """
import sys, time
from pathlib import Path
from nodedra.dra.endpoint import InstanceLock
with InstanceLock(Path(sys.argv[1])).held():
    print("locked", flush=True)
    sys.stdin.readline()
"""


def held_in_thread(lock: InstanceLock) -> tuple[threading.Thread, threading.Event]:
    """A thread that takes ``lock``, and the event it sets once it has it."""
    got = threading.Event()

    def take() -> None:
        with lock.held():
            got.set()

    thread = threading.Thread(target=take)
    thread.start()
    return thread, got


def test_instance_lock_excludes_other_processes_and_instances(tmp_path: Path) -> None:
    lock = tmp_path / "serialize.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(lock)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    assert holder.stdin is not None
    assert holder.stdout.readline().strip() == "locked"
    waiter, got = held_in_thread(InstanceLock(lock))
    assert not got.wait(0.3), "the lock was taken while another process held it"
    holder.stdin.write("\n")
    holder.stdin.flush()
    assert holder.wait(10) == 0
    waiter.join(10)
    assert got.is_set()

    # Two instances in one process exclude each other too.
    with InstanceLock(lock).held():
        waiter, got = held_in_thread(InstanceLock(lock))
        assert not got.wait(0.3), "two instances held the lock at once"
    waiter.join(10)
    assert got.is_set()


def test_requests_of_one_instance_hold_its_lock_together(tmp_path: Path) -> None:
    """The first takes the file lock, others join; only the last one out gives it back."""
    ours, other = (
        InstanceLock(tmp_path / "serialize.lock"),
        InstanceLock(tmp_path / "serialize.lock"),
    )
    first = ours.held()
    first.__enter__()
    joined, got = held_in_thread(ours)
    assert got.wait(10), "a request of the same instance waited for its own lock"
    joined.join(10)
    waiter, other_got = held_in_thread(other)
    assert not other_got.wait(0.3), "the other instance took the lock while a request held it"
    first.__exit__(None, None, None)
    waiter.join(10)
    assert other_got.is_set()


def test_too_long_socket_path_is_refused_clearly(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.options.plugin_data_dir = tmp_path / ("x" * 120)
    plugin = Plugin(DRIVER, rig.options)
    with pytest.raises(ValueError, match="longer than the 107 bytes a Unix socket may have"):
        plugin.start()
    plugin.stop()
