"""The DRA kubelet plugin: registration, Prepare/Unprepare, ResourceSlices, CDI specs.

The plugin owns the kubelet-facing plumbing and none of the decisions. Which devices exist
and what a claim gets are the policy's; making an allocation durable is the owner's. Every
kubelet request holds the owner's lock across "policy decides, owner commits, CDI spec is
written" (the owner's commit may let it go while it waits for other requests to join one
write), so kubelet requests serialize against everything else that touches the policy;
how a request's claims go through those steps is `requests.ClaimRequests`.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from .cdi import CDIStore
from .claims import ClaimError, ClaimRef
from .contracts import ClaimPolicy, Owner, PluginHealth, RequestObserver, RequestReport
from .endpoint import InstanceLock, SocketPaths, default_plugin_data_dir, socket_paths
from .errors import HealthNotSupportedError, NotServingClaimsError, RecoverableError
from .kube import ClusterAPI, KubeAPIError, KubeClusterAPI
from .metadata import MetadataStore
from .probes import LIST_TYPE_ATTRIBUTES, GateProbe
from .publisher import SlicePublisher
from .requests import ClaimRequests, conflicts
from .results import PrepareResult
from .service import PluginServers
from .slices import ApplyReport, Device, SliceApplier
from .withheld import WholeDevices, Withheld

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class PluginSettings:
    """Where a plugin's files are and how it runs: what an owner may pass on as it is."""

    node_name: str
    """The node whose devices the plugin publishes."""
    registrar_dir: Path | str | None = None
    """Where the registration socket goes; None: the kubelet's registry directory."""
    plugin_data_dir: Path | str | None = None
    """Where the DRA socket goes; None: the driver's directory under the kubelet's plugins."""
    cdi_dir: Path | str | None = None
    """Where the claims' CDI specs go; None: the directory runtimes watch for generated specs."""
    rolling_update_uid: str | None = None
    """This instance's pod UID, to run beside another instance during a rolling update."""
    resync_period: float = 30.0
    """Seconds between checks that our ResourceSlices are still as published."""
    observer: RequestObserver | None = None
    """Told about every kubelet request once it is answered (metrics, claim status)."""
    whole_devices_allowed: bool = False
    """Publish devices offered in parts whole where the server drops consumable capacity."""
    on_withheld: Callable[[Withheld], None] | None = None
    """Told when devices start being withheld instead (see `withheld`); must not block."""

    def plugin_settings(self) -> dict[str, Any]:
        """These settings as keyword arguments (of :class:`Options`, say)."""
        return {f.name: getattr(self, f.name) for f in fields(PluginSettings)}


@dataclass(kw_only=True)
class Options(PluginSettings):
    """What a plugin needs beyond its driver name: its settings and who it works with."""

    kube_client: k8s.ApiClient | ClusterAPI
    """An official client (or anything speaking :class:`ClusterAPI`) for claims and slices."""
    owner: Owner
    policy: ClaimPolicy


class Plugin:
    """A DRA kubelet plugin for one driver on one node."""

    def __init__(self, driver_name: str, options: Options) -> None:
        if not driver_name:
            raise ValueError("a DRA plugin needs a driver name")
        if not options.node_name:
            raise ValueError("a DRA plugin needs the name of its node")
        for required in ("kube_client", "owner", "policy"):
            if getattr(options, required) is None:
                raise ValueError(f"a DRA plugin needs options.{required}")
        self._driver = driver_name
        self._options = options
        self._owner = options.owner
        self._policy = options.policy
        self._cdi = CDIStore(driver_name, options.cdi_dir)
        self._api: ClusterAPI = (
            KubeClusterAPI(options.kube_client)
            if isinstance(options.kube_client, k8s.ApiClient)
            else options.kube_client
        )
        self._plugin_data_dir = Path(
            options.plugin_data_dir or default_plugin_data_dir(driver_name)
        )
        self._paths: SocketPaths = socket_paths(
            driver_name,
            Path(options.registrar_dir) if options.registrar_dir else None,
            self._plugin_data_dir,
            options.rolling_update_uid,
        )
        self.instance_lock = InstanceLock(self._paths.lock)
        """Held by kubelet requests (and by the owner's start and reconfigure)."""
        self._mu = threading.Lock()  # guards the fields below, never held across I/O
        self._devices: list[Device] = []
        self._servers: PluginServers | None = None
        self._publisher: SlicePublisher | None = None
        self._allowed = threading.Event()
        self._gates = GateProbe(self._api, self._options.node_name, self._driver)
        self._whole = WholeDevices(
            self._gates, allowed=options.whole_devices_allowed, on_withheld=options.on_withheld
        )
        self._metadata = MetadataStore(driver_name, self._plugin_data_dir)
        self._requests = ClaimRequests(
            driver_name,
            self._owner,
            self._policy,
            self._api,
            cdi=self._cdi,
            metadata=self._metadata,
        )

    @property
    def driver_name(self) -> str:
        """The DRA driver this plugin serves."""
        return self._driver

    @property
    def plugin_data_dir(self) -> Path:
        """The directory of the DRA socket (and of the lock shared during rolling updates)."""
        return self._plugin_data_dir

    @property
    def sockets(self) -> SocketPaths:
        """The registration and DRA sockets of this instance."""
        return self._paths

    @property
    def cluster_api(self) -> ClusterAPI:
        """What the plugin reads claims and writes slices with."""
        return self._api

    @property
    def cdi(self) -> CDIStore:
        """The CDI specs of the claims this driver prepared."""
        return self._cdi

    @property
    def metadata(self) -> MetadataStore:
        """The device metadata files of the claims this driver prepared."""
        return self._metadata

    # Lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Serve the kubelet, register with it, and publish the devices given so far."""
        with self._mu:
            if self._servers is not None:
                raise RuntimeError(f"DRA plugin {self._driver} already started")
            self._plugin_data_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
            servers = PluginServers(self._driver, self._paths, self, self.handle_error)
            publisher = SlicePublisher(
                SliceApplier(self._api, self._options.node_name, self._driver),
                self.handle_error,
                resync_period=self._options.resync_period,
                adapt=self._whole.adapt,
            )
            publisher.publish(self._devices)
            servers.start()
            publisher.start()
            self._metadata.start_sweeping(self._exclusive)
            self._servers, self._publisher = servers, publisher
        log.info("DRA plugin %s started on node %s", self._driver, self._options.node_name)

    def stop(self) -> None:
        """Unregister and stop serving, after the requests in flight. Idempotent.

        Must not be called holding the owner's lock: a request in flight holds it, and
        stop waits for that request. The ResourceSlices stay: the kubelet wipes them if
        the driver does not come back, and a new instance takes them over if it does.
        """
        with self._mu:
            servers, self._servers = self._servers, None
            publisher, self._publisher = self._publisher, None
        if servers is not None:
            servers.stop()
            self._metadata.stop_sweeping(self._exclusive)
        if publisher is not None:
            publisher.stop()
        if servers is not None:
            log.info("DRA plugin %s stopped", self._driver)

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """The locks a kubelet request takes, in its order: no request runs meanwhile."""
        with self.instance_lock.held(), self._owner:
            yield

    def allow_claims(self) -> None:
        """Let the plugin serve claims, once the owner has synchronized its own state.

        Until then the kubelet's requests are refused as a whole, which costs a retry: a
        claim committed while the owner is still synchronizing would not stick.
        """
        self._allowed.set()

    # Publishing ----------------------------------------------------------------------

    def publish(self, devices: Sequence[Device]) -> None:
        """Replace the published devices with (a copy of) ``devices``.

        Devices given before the plugin starts are published when it starts. Publishing
        happens in the background and is retried until it succeeds.
        """
        with self._mu:
            self._devices = copy.deepcopy(list(devices))
            if self._publisher is not None:
                self._publisher.publish(self._devices)

    def resync(self) -> None:
        """Check our ResourceSlices against what we publish now (e.g. after a watch event)."""
        with self._mu:
            if self._publisher is not None:
                self._publisher.resync()

    def wait_published(self, timeout: float) -> ApplyReport | None:
        """Wait until the devices published so far are on the API server; None on timeout."""
        with self._mu:
            publisher = self._publisher
        return publisher.wait_synced(timeout) if publisher is not None else None

    def list_attributes_supported(self) -> bool:
        """Whether the API server keeps device attributes whose value is a list.

        Probed once, by a server-side dry-run create of a slice with such an attribute.
        False when the server has no resource.k8s.io/v1 (DRA is off), or cannot be asked
        now (asked again next time).
        """
        try:
            return self._gates.on(LIST_TYPE_ATTRIBUTES)
        except KubeAPIError as err:
            log.warning("cannot tell whether list attributes are supported: %s", err)
            return False

    def feature_gates(self) -> dict[str, bool]:
        """The API server's feature gates probed so far, and whether each is on.

        Devices are published without the fields of gates that are off (said once, as a
        warning), so that the server stores what we publish.
        """
        return self._gates.known()

    def withheld(self) -> Withheld | None:
        """The devices the last publication left out rather than publish them whole."""
        return self._whole.withheld()

    # Errors and health ---------------------------------------------------------------

    def health(self) -> PluginHealth:
        """Whether the plugin serves, is registered and has published, and what is wrong."""
        with self._mu:
            servers, publisher = self._servers, self._publisher
        if servers is None or publisher is None:
            return PluginHealth(False, False, False, ("not started",))
        problems = []
        serving = self._allowed.is_set()
        if not serving:
            problems.append("claims are not allowed yet (the owner is synchronizing)")
        registered, refusal = servers.registered()
        if not registered:
            problems.append(
                f"the kubelet refused the driver: {refusal}"
                if refusal
                else f"not registered with the kubelet yet (socket {self._paths.registration})"
            )
        published, error = publisher.state()
        if not published:
            problems.append(
                f"publishing ResourceSlices failed: {error}"
                if error
                else "ResourceSlices not published yet"
            )
        return PluginHealth(serving, registered, published, tuple(problems))

    def handle_error(self, err: Exception, msg: str) -> None:
        """Handle a failure in the background: log a recoverable one, shut down on others.

        A failed publication is retried by itself. Anything else is one of our gRPC servers
        giving up: the driver stays registered but can no longer serve the kubelet, and
        nothing here would bring it back, so the owner is asked to shut down.
        """
        if isinstance(err, RecoverableError):
            log.warning("dra: %s: %s", msg, err)
            return
        log.error("dra: fatal error: %s: %s", msg, err)
        self._owner.request_shutdown(f"dra: {msg}: {err}")

    def watch_health_status(self) -> None:
        """Decline to report device health.

        Our devices are the node's own CPUs and memory: the kubelet already knows whether
        the node is healthy, and there is nothing per device we could add. No health
        service is advertised, so kubelets from 1.37 never ask; older ones, which ask every
        driver, get a stream that stays open and says nothing, and stop asking.
        """
        raise HealthNotSupportedError(f"driver {self._driver} does not report device health")

    # Kubelet requests ----------------------------------------------------------------

    def node_prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        """Serve NodePrepareResources: fetch the claims, then prepare them under the lock."""
        started = time.monotonic()
        fetched: dict[str, Mapping[str, Any]] = {}
        try:
            answers = self._node_prepare(claims, fetched)
        except NotServingClaimsError as err:
            self._observe("prepare", claims, dict.fromkeys((r.uid for r in claims), err), started)
            raise
        errors = {u: a.error for u, a in answers.items()}
        self._observe("prepare", claims, errors, started, fetched)
        return answers

    def node_unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, Exception | None]:
        """Serve NodeUnprepareResources."""
        started = time.monotonic()
        try:
            self._check_allowed()
            with self.instance_lock.held():
                answers = self.unprepare_resource_claims(claims)
        except NotServingClaimsError as err:
            self._observe("unprepare", claims, dict.fromkeys((r.uid for r in claims), err), started)
            raise
        self._observe("unprepare", claims, answers, started)
        return answers

    def _node_prepare(
        self, claims: Sequence[ClaimRef], fetched: dict[str, Mapping[str, Any]]
    ) -> dict[str, PrepareResult]:
        """Prepare ``claims``; ``fetched`` receives each claim the API server gave us."""
        self._check_allowed()
        refs = list(dict.fromkeys(claims))  # a claim named twice is one claim
        answers = {uid: PrepareResult(error=err) for uid, err in conflicts(refs).items()}
        todo = [ref for ref in refs if ref.uid not in answers]
        # Outside the lock, since API calls must not hold up other requests; side by side,
        # since a pod's claims come in one request and each GET is a round trip.
        for ref, claim in zip(todo, self._requests.fetch_all(todo), strict=True):
            if isinstance(claim, ClaimError):
                log.error("%s", claim, extra={"claim": ref})
                answers[ref.uid] = PrepareResult(error=claim)
            else:
                fetched[ref.uid] = claim
        with self.instance_lock.held():
            prepared = self.prepare_resource_claims(list(fetched.values())) if fetched else {}
        for ref in refs:
            if ref.uid not in answers:  # fetched, so checked to be the claim of that UID
                answers[ref.uid] = prepared[ref.uid]
        return answers

    def _observe(
        self,
        kind: str,
        claims: Sequence[ClaimRef],
        errors: Mapping[str, Exception | None],
        started: float,
        fetched: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        observer = self._options.observer
        if observer is None:
            return
        report = RequestReport(
            kind, tuple(claims), errors, time.monotonic() - started, fetched or {}
        )
        try:
            observer.request_done(report)
        except Exception:  # an observer's bug must not fail the kubelet's request
            log.exception("the %s observer failed", kind)

    def prepare_resource_claims(
        self, claims: Sequence[Mapping[str, Any]]
    ) -> dict[str, PrepareResult]:
        """Prepare each claim on its own; one result per claim UID (see `ClaimRequests`).

        The kubelet asks for all the claims of a pod at once but records the answer per
        claim and retries the failed ones, so failing them together would only throw away
        the claims that were prepared.
        """
        self._check_allowed()
        return self._requests.prepare(claims)

    def unprepare_resource_claims(self, claims: Sequence[ClaimRef]) -> dict[str, Exception | None]:
        """Release what was prepared for each claim; unknown claims succeed."""
        self._check_allowed()
        return self._requests.unprepare(claims)

    def _check_allowed(self) -> None:
        if not self._allowed.is_set():
            raise NotServingClaimsError(
                f"dra: driver {self._driver} cannot serve claims yet, "
                "still synchronizing with the runtime"
            )
