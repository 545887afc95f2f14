"""The plugin's gRPC face: registration and the DRA node services on Unix sockets.

The DRA socket is served before the registration socket exists, because the kubelet
connects to the DRA endpoint as soon as it has registered us. Both DRA service versions the
kubelet knows are served, v1 first in what we advertise (the kubelet takes the first it
supports, in our order). No health service is advertised, and the health stream a kubelet
opens anyway stays open and says nothing (see :class:`_SilentHealth`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import grpc

from nodedra.grpc_gen import (
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)

from .claims import ClaimRef
from .endpoint import SocketFile, SocketPaths, check_socket_path, private_socket_path
from .errors import NotServingClaimsError
from .results import PrepareResult

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
STOP_GRACE = 45.0
"""Seconds stop() waits for requests in flight: the kubelet's own timeout for a call."""


class KubeletRequests(Protocol):
    """What the services hand kubelet requests to (the plugin)."""

    def node_prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        """Prepare ``claims``; one result per claim UID."""
        ...

    def node_unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, Exception | None]:
        """Unprepare ``claims``; one entry per claim UID, None for success."""
        ...


FatalErrorHandler = Callable[[Exception, str], None]


def _claim_refs(request: Any) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.name, c.uid) for c in request.claims]


def _prepare(
    pb: ModuleType, requests: KubeletRequests, request: Any, context: grpc.ServicerContext
) -> Any:
    """Answer NodePrepareResources in the messages of ``pb`` (v1 or v1beta1)."""
    refs = _claim_refs(request)
    try:
        results = requests.node_prepare(refs)
    except NotServingClaimsError as err:
        context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
    with_share_id = "share_id" in pb.Device.DESCRIPTOR.fields_by_name
    response = pb.NodePrepareResourcesResponse()
    for uid in dict.fromkeys(ref.uid for ref in refs):  # one entry per UID, named once or not
        result, entry = results[uid], response.claims[uid]
        if result.error is not None:
            entry.error = str(result.error) or type(result.error).__name__
            continue
        for device in result.devices:
            message = entry.devices.add(
                request_names=device.requests,
                pool_name=device.pool_name,
                device_name=device.device_name,
                cdi_device_ids=device.cdi_device_ids,
            )
            if with_share_id and device.share_id is not None:
                message.share_id = device.share_id
    return response


def _unprepare(
    pb: ModuleType, requests: KubeletRequests, request: Any, context: grpc.ServicerContext
) -> Any:
    """Answer NodeUnprepareResources in the messages of ``pb`` (v1 or v1beta1)."""
    refs = _claim_refs(request)
    try:
        errors = requests.node_unprepare(refs)
    except NotServingClaimsError as err:
        context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
    response = pb.NodeUnprepareResourcesResponse()
    for uid in dict.fromkeys(ref.uid for ref in refs):
        entry = response.claims[uid]  # reading the map creates the (empty) entry
        error = errors[uid]
        if error is not None:
            entry.error = str(error) or type(error).__name__
    return response


class _DRAv1(dra_v1_pb2_grpc.DRAPluginServicer):
    def __init__(self, requests: KubeletRequests) -> None:
        self._requests = requests

    def NodePrepareResources(  # noqa: N802 (gRPC's name)
        self, request: dra_v1_pb2.NodePrepareResourcesRequest, context: Any
    ) -> dra_v1_pb2.NodePrepareResourcesResponse:
        response: dra_v1_pb2.NodePrepareResourcesResponse
        response = _prepare(dra_v1_pb2, self._requests, request, context)
        return response

    def NodeUnprepareResources(  # noqa: N802 (gRPC's name)
        self, request: dra_v1_pb2.NodeUnprepareResourcesRequest, context: Any
    ) -> dra_v1_pb2.NodeUnprepareResourcesResponse:
        response: dra_v1_pb2.NodeUnprepareResourcesResponse
        response = _unprepare(dra_v1_pb2, self._requests, request, context)
        return response


class _DRAv1beta1(dra_v1beta1_pb2_grpc.DRAPluginServicer):
    def __init__(self, requests: KubeletRequests) -> None:
        self._requests = requests

    def NodePrepareResources(  # noqa: N802 (gRPC's name)
        self, request: dra_v1beta1_pb2.NodePrepareResourcesRequest, context: Any
    ) -> dra_v1beta1_pb2.NodePrepareResourcesResponse:
        response: dra_v1beta1_pb2.NodePrepareResourcesResponse
        response = _prepare(dra_v1beta1_pb2, self._requests, request, context)
        return response

    def NodeUnprepareResources(  # noqa: N802 (gRPC's name)
        self, request: dra_v1beta1_pb2.NodeUnprepareResourcesRequest, context: Any
    ) -> dra_v1beta1_pb2.NodeUnprepareResourcesResponse:
        response: dra_v1beta1_pb2.NodeUnprepareResourcesResponse
        response = _unprepare(dra_v1beta1_pb2, self._requests, request, context)
        return response


class _Registration(pluginregistration_v1_pb2_grpc.RegistrationServicer):
    """Answers the kubelet's plugin watcher and remembers what it said about us."""

    def __init__(self, driver: str, dra_socket: str) -> None:
        self._info = pluginregistration_v1_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=driver,
            endpoint=dra_socket,
            supported_versions=SUPPORTED_SERVICES,
        )
        self.status: pluginregistration_v1_pb2.RegistrationStatus | None = None
        self.notified = threading.Event()

    def GetInfo(  # noqa: N802 (gRPC's name)
        self, request: pluginregistration_v1_pb2.InfoRequest, context: Any
    ) -> pluginregistration_v1_pb2.PluginInfo:
        return self._info

    def NotifyRegistrationStatus(  # noqa: N802 (gRPC's name)
        self, request: pluginregistration_v1_pb2.RegistrationStatus, context: Any
    ) -> pluginregistration_v1_pb2.RegistrationStatusResponse:
        self.status = request
        self.notified.set()
        if request.plugin_registered:
            log.info("the kubelet registered driver %s", self._info.name)
        else:
            log.error("the kubelet refused driver %s: %s", self._info.name, request.error)
        return pluginregistration_v1_pb2.RegistrationStatusResponse()


class _SilentHealth(dra_health_v1alpha1_pb2_grpc.DRAResourceHealthServicer):
    """A device health stream that reports nothing and stays open until either side ends it.

    We report no device's health (the node's own CPUs and memory: the kubelet knows the
    node's health). Kubelets from 1.37 open the stream only for a driver that advertises
    the service, and we do not. Kubelets of 1.35 with ResourceHealthStatus on and of 1.36
    (on by default; 1.36.3 checked) open it for every driver, and when it is refused with
    UNIMPLEMENTED they log an error and ask again every 5 seconds, for as long as the driver
    is registered. An open stream without a word declines as well, and they wait on it.
    """

    def __init__(self, closing: threading.Event) -> None:
        self._closing = closing

    def NodeWatchResources(  # noqa: N802 (gRPC's name)
        self, request: Any, context: grpc.ServicerContext
    ) -> Iterator[Any]:
        log.info("the kubelet opened a device health stream: it stays open and reports nothing")
        while context.is_active() and not self._closing.wait(1.0):
            pass
        yield from ()


def _serve(
    socket: Path, register: Callable[[grpc.Server], None], workers: int
) -> tuple[grpc.Server, SocketFile]:
    """A started gRPC server on a Unix socket only root can use."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    register(server)
    check_socket_path(socket)
    bound = private_socket_path(socket)
    try:
        server.add_insecure_port(f"unix:{bound}")  # binds now, accepts once started
        owned = SocketFile.move_into_place(bound, socket)
        server.start()
    except BaseException:
        server.stop(None)
        bound.unlink(missing_ok=True)
        raise
    return server, owned


class PluginServers:
    """The registration and DRA servers of one plugin instance, started and stopped together.

    While they run, a monitor checks that our sockets are still ours: a socket someone
    removed or replaced means the kubelet can no longer reach this instance, which nothing
    here can repair, so it is reported as fatal.
    """

    def __init__(
        self,
        driver: str,
        paths: SocketPaths,
        requests: KubeletRequests,
        on_fatal: FatalErrorHandler,
        *,
        workers: int = 8,
        check_period: float = 5.0,
    ) -> None:
        self._driver = driver
        self._paths = paths
        self._requests = requests
        self._on_fatal = on_fatal
        self._workers = workers
        self._check_period = check_period
        self._servers: list[tuple[grpc.Server, SocketFile]] = []
        self._stopped = threading.Event()
        self._monitor: threading.Thread | None = None
        self.registration = _Registration(driver, str(paths.dra))

    def start(self) -> None:
        """Serve DRA, then appear in the registry: the kubelet connects as soon as it sees us."""
        self._paths.dra.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        self._paths.registration.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        self.registration = _Registration(self._driver, str(self._paths.dra))
        self._stopped.clear()
        try:
            self._servers.append(_serve(self._paths.dra, self._add_dra, self._workers))
            self._servers.append(_serve(self._paths.registration, self._add_registration, 2))
        except BaseException:
            self.stop()
            raise
        self._monitor = threading.Thread(target=self._watch_sockets, name="socket-monitor")
        self._monitor.daemon = True
        self._monitor.start()

    def registered(self) -> tuple[bool, str | None]:
        """Whether the kubelet said it registered us, and why not if it refused."""
        status = self.registration.status
        if status is None:
            return False, None
        return status.plugin_registered, status.error or None

    def stop(self, grace: float = STOP_GRACE) -> None:
        """Leave the registry, finish the requests in flight, remove our own sockets."""
        self._stopped.set()
        monitor, self._monitor = self._monitor, None
        if monitor is not None and monitor is not threading.current_thread():
            monitor.join()
        servers, self._servers = self._servers, []
        for server, socket in reversed(servers):  # registration first
            server.stop(grace).wait()
            socket.remove()

    def _add_dra(self, server: grpc.Server) -> None:
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(_DRAv1(self._requests), server)
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(_DRAv1beta1(self._requests), server)
        dra_health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
            _SilentHealth(self._stopped), server
        )

    def _add_registration(self, server: grpc.Server) -> None:
        pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(self.registration, server)

    def _watch_sockets(self) -> None:
        while not self._stopped.wait(self._check_period):
            lost = [s.path for _, s in self._servers if not s.is_ours()]
            if lost:
                self._on_fatal(
                    RuntimeError(
                        f"socket {lost[0]} was removed or replaced by someone else, so the "
                        "kubelet can no longer reach this instance"
                    ),
                    "gRPC server",
                )
                return
