"""The running node agent: everything ``nodedra run`` builds, wired together.

kopf's handlers stay thin: they call into this object, which owns the resource manager,
the policy, the plugin, the metrics and what the ResourceClaim watch feeds. Building it
checks everything a person could get wrong before anything starts, and says which setting
to fix: the node name, the API server, the directories, the configuration.
"""

from __future__ import annotations

import gc
import logging
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from nodedra import httpserver, wholenuma
from nodedra.claims import ClaimFeed, ClaimIndex, OrphanTracker, StatusWriter
from nodedra.configwatch import ConfigWatcher
from nodedra.dra import ClaimRef, KubeClusterAPI, Withheld, driver_name
from nodedra.dra.probes import PUBLISHED_FIELD_GATES
from nodedra.dra.requests import FETCH_WORKERS
from nodedra.nodeevents import NodeEvents
from nodedra.nri import PluginOptions
from nodedra.observability import Metrics, NodeUsage, Observers, PinningUsage
from nodedra.policy import PolicyConfig, Shortfall, load_config, make_policy
from nodedra.preflight import ControlPlane, Inputs, Preflight
from nodedra.quiet import RECORD, QuietKeeper, host_work, read_boot_id
from nodedra.resmgr import ManagerOptions, ResourceManager, reserved_pods
from nodedra.settings import Settings, SettingsError, split_address
from nodedra.statuscopy import StatusCopy
from nodedra.topology import Topology, format_cpu_list, read_topology

log = logging.getLogger(__name__)


def kube_client(settings: Settings) -> k8s.ApiClient:
    """A client from ``--kubeconfig``, or from the pod's service account."""
    try:
        configuration = k8s.Configuration()
        if settings.kubeconfig:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=settings.kubeconfig, client_configuration=configuration
            )
        else:
            k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        # One kept-alive connection for each claim a request fetches at once, plus the
        # status writer, the publisher and the watch: not the client's CPUs * 5, which on
        # a small node would close connections after use and pay a TLS handshake per GET.
        configuration.connection_pool_maxsize = FETCH_WORKERS + 4
        return k8s.ApiClient(configuration)
    except (k8s_config.ConfigException, OSError) as err:
        where = settings.kubeconfig or "the in-cluster service account"
        raise SettingsError(
            f"cannot configure the Kubernetes client from {where}: {err}. Pass --kubeconfig "
            "(or set KUBECONFIG) when running outside a cluster"
        ) from None


def check_api_server(api_client: k8s.ApiClient) -> str:
    """The API server's version; SettingsError saying where it is if it does not answer."""
    try:
        version = k8s.VersionApi(api_client).get_code(_request_timeout=10)
    except Exception as err:  # urllib3 and the client raise many kinds
        raise SettingsError(
            f"cannot reach the API server at {api_client.configuration.host}: {err}"
        ) from None
    return str(version.git_version)


def check_writable(directory: Path, what: str, mode: int) -> None:
    """Create ``directory`` (with ``mode``) if needed and prove we can write there.

    SettingsError says which flag names the directory when it is not writable.
    """
    try:
        directory.mkdir(mode=mode, parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as err:
        raise SettingsError(f"{what} {directory} is not writable: {err.strerror or err}") from None


def initial_config(settings: Settings, topology: Topology) -> PolicyConfig:
    """The configuration file, or the defaults when the default file does not exist.

    With pinning the defaults reserve the threads of the first CPU's core: containers
    without claims must always have a CPU no claim can take.
    """
    if settings.config_required or settings.config.exists():
        return load_config(settings.config)
    reserved: frozenset[int] = frozenset()
    if settings.pinning != "off" and topology.cpus:
        reserved = topology.cpus[min(topology.cpus)].siblings
    log.info(
        "no configuration at %s: using the defaults (reserved CPUs: %s)",
        settings.config,
        format_cpu_list(reserved) or "none",
    )
    return PolicyConfig(reserved_cpus=reserved)


def report_shortfalls(shortfalls: Sequence[Shortfall], events: NodeEvents) -> None:
    """Name each claim that holds what the node no longer offers: a warning, a Node Event.

    After a start: a boot with a smaller huge page pool leaves claims in the checkpoint
    holding pages the node does not have. They are kept (their pods may run, and nodedra
    never drops state silently), and someone must act: give the node its pages back, or
    release the claims. The metric ``nodedra_claims_capacity_missing`` says how many are left.
    """
    for shortfall in shortfalls:
        note = (
            f"{shortfall}. The claim is kept, but its containers may not get what it holds: "
            "give the node its pages back, or release the claim"
        )
        log.warning("%s", note)
        reason = (
            "HugePagesMissing" if shortfall.capacity.startswith("hugepages") else "CapacityMissing"
        )
        events.warning(reason, "KeepClaim", note)


def claims_short(shortfalls: Sequence[Shortfall]) -> dict[str, int]:
    """Capacity -> how many claims hold more of it than their devices offer now."""
    claims: dict[str, set[str]] = {}
    for shortfall in shortfalls:
        claims.setdefault(shortfall.capacity, set()).add(shortfall.uid)
    return {capacity: len(uids) for capacity, uids in claims.items()}


class Runtime:
    """nodedra on one node."""

    def __init__(
        self,
        settings: Settings,
        on_shutdown: Callable[[str], None],
        api_client: k8s.ApiClient | None = None,
    ) -> None:
        self.settings = settings
        self.topology = topology = read_topology(settings.sysfs)
        config = initial_config(settings, topology)
        policy = make_policy(topology, config)
        self.driver = driver_name(policy.name)
        self.api_client = api_client or kube_client(settings)
        self.server_version = check_api_server(self.api_client)
        api = KubeClusterAPI(self.api_client)
        self.events = NodeEvents(api, settings.node_name, self.driver)
        self.metrics = Metrics(self.usage)
        self.index = ClaimIndex(self.driver, settings.node_name)
        self.preflight = Preflight(
            Inputs(
                settings.kubelet_cpu_manager_state, settings.kubelet_config, config.reserved_cpus
            ),
            api,
            settings.node_name,
            pinning=settings.pinning != "off",
            control=ControlPlane(
                self._feature_gates,
                {gate.name: gate.missing for gate in PUBLISHED_FIELD_GATES},
                self.server_version,
                lambda: self.manager.policy.config.numa_attribute.form,
            ),
            events=self.events,
            gauge=self.metrics.preflight,
            kubelet_asked=self._kubelet_asked,
        )
        observers = Observers(self.metrics)
        self.manager = ResourceManager(
            policy,
            api,
            ManagerOptions(
                node_name=settings.node_name,
                state_dir=settings.state_dir,
                registrar_dir=settings.registry_dir,
                plugin_data_dir=settings.plugin_dir,
                cdi_dir=settings.cdi_dir,
                rolling_update_uid=settings.pod_uid,
                resync_period=settings.resync_period,
                observer=observers,
                whole_devices_allowed=settings.allow_whole_numa_node_devices,
                on_withheld=self._devices_withheld,
                pinning=settings.pinning,
                hold=self.preflight.holding,
                nri=PluginOptions(
                    socket_path=settings.nri_socket,
                    index=settings.nri_index,
                    observer=self.metrics,
                ),
            ),
            on_shutdown,
        )
        plugin = self.manager.plugin
        # Where sockets and state live, only root may look; CDI specs are for the runtime.
        for directory, what, mode in (
            (plugin.sockets.registration.parent, "--registry-dir", 0o750),
            (plugin.plugin_data_dir, "--plugin-dir", 0o750),
            (plugin.cdi.directory, "--cdi-dir", 0o755),
            (self.manager.checkpoint.path.parent, "--state-dir", 0o700),
        ):
            check_writable(directory, what, mode)
        self.status: StatusWriter | None = None
        self.claims: ClaimFeed | None = None
        if settings.watch_claims:
            self.status = StatusWriter(api, self.manager, settings.node_name)
            observers.add(self.status)
            self.claims = ClaimFeed(self.api_client, self.index, self._claim_seen)
            self.metrics.count_claim_watch(self.claims.counts, self.status.counts)
        self.orphans = OrphanTracker(
            self.index, self.manager.committed_claims, settings.orphan_grace
        )
        self.config = ConfigWatcher(settings.config, self._reconfigure, self._count_reload)
        self.status_copy = StatusCopy(
            self.manager,
            self.topology,
            settings.node_name,
            extras=lambda: {"quiet_cpus": self.quiet.status()},
        )
        self.quiet = QuietKeeper(
            host_work(
                policy.online_cpus(),
                settings.irq_dir,
                settings.workqueue_dir,
                settings.system_bus,
                settings.irqbalance_dir,
            ),
            self.manager.checkpoint.path.parent / RECORD,
            read_boot_id(),
            online=policy.online_cpus(),
            claimed=self.manager.claimed_cpus,
            kinds=lambda: self.manager.policy.config.quiet,
            on_status=self.status_copy.invalidate,
        )
        self.manager.on_claims_changed(self.quiet.request_update)
        self.metrics.show_quiet_cpus(
            self.quiet.status, lambda: (self.quiet.passes, self.quiet.pass_seconds)
        )
        self._stops: list[Callable[[], None]] = []
        """How to close the listeners opened, in the order opened."""

    def start(self) -> None:
        """Start serving: listeners, then the manager's start-up order, then status writes.

        The listeners (metrics, ``/status``) come first: a port in use must stop nodedra
        before the manager registers with the kubelet, since a failed start-up runs no
        clean-up and would leave the kubelet a registration (and sockets) nobody serves.
        """
        # What the start-up made (kopf, the clients, grpcio: some 75,000 objects) lives as
        # long as the process: out of the garbage collector's way, before anything is
        # served, a full collection no longer takes some 50 ms of GIL from a request.
        gc.collect()
        gc.freeze()
        # Before the runtime connects: a conflict found holds pinning from the first event.
        self.preflight.check()
        try:
            if self.settings.metrics_address:
                app = httpserver.metrics_app(self.metrics.registry, self.readiness)
                self._listen("--metrics-address", self.settings.metrics_address, "metrics", app)
            if self.settings.status_address:
                app = httpserver.status_app(self.status_copy.body)
                self._listen("--status-address", self.settings.status_address, "/status", app)
            self.manager.start()
        except BaseException:
            self._close_listeners()
            raise
        self.status_copy.start()
        self.quiet.start()
        if self.status is not None:
            self.status.start()
        if self.claims is not None:
            self.claims.start()
        log.info(
            "nodedra serving driver %s on node %s (API server %s)",
            self.driver,
            self.settings.node_name,
            self.server_version,
        )
        with self.manager:  # what the policy took back from the checkpoint
            shortfalls = self.manager.policy.shortfalls()
        if shortfalls:
            # API calls: outside the lock, and in a thread of their own, so that an API
            # server slow to take Events delays nothing (the log line is the same).
            threading.Thread(
                target=report_shortfalls,
                args=(shortfalls, self.events),
                name="node-events",
                daemon=True,
            ).start()

    def stop(self) -> None:
        """Stop serving and save state; the ResourceSlices stay."""
        if self.claims is not None:
            self.claims.stop()
        self.manager.stop()
        self.quiet.stop()
        if self.status is not None:
            self.status.stop()
        self.status_copy.stop()
        self._close_listeners()

    def _listen(self, flag: str, address: str, what: str, app: httpserver.App) -> None:
        host, port = split_address(address)
        try:
            _, stop = httpserver.serve(host, port, app)
        except OSError as err:
            raise SettingsError(
                f"{flag} {address}: cannot serve {what} there: {err.strerror or err}"
            ) from None
        self._stops.append(stop)

    def _close_listeners(self) -> None:
        while self._stops:
            self._stops.pop()()

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Whether the driver can be used on this node now, and the checks that say so.

        With pinning, containers must be pinned too: connected to the runtime, or standing
        by while the other instance of a rolling update is.
        """
        health = self.manager.plugin.health()
        problems = list(health.problems)
        pinning = self.settings.pinning != "off"
        runtime = self.manager.runtime_ready() if pinning else None
        if pinning and not runtime:
            problems.append(f"containers are not pinned: {self.manager.runtime_detail()}")
        withheld = self.manager.plugin.withheld()  # a node offering nothing needs a person
        if withheld is not None:
            problems.append(wholenuma.problem(withheld))
        preflight = self.preflight.problems()
        problems += preflight
        ready = health.ready and runtime is not False and withheld is None and not preflight
        return ready, {
            "driver": self.driver,
            "serving": health.serving,
            "registered": health.registered,
            "published": health.published,
            "runtime": runtime,
            "problems": problems,
            "preflight": {c.name: c.status for c in self.preflight.results()},
        }

    def _kubelet_asked(self) -> int:
        """Cpusets the kubelet asked for so far (its CPU manager pins), for the checks."""
        containers = self.manager.containers
        return 0 if containers is None else containers.cpu_manager_conflicts

    def _feature_gates(self) -> dict[str, bool | None]:
        """The feature gates the plugin probed so far (for the preflight checks)."""
        return dict(self.manager.plugin.feature_gates())

    def _devices_withheld(self, withheld: Withheld) -> None:
        """The plugin withholds devices (from its publishing thread): log it, post an Event."""
        wholenuma.report_in_background(withheld, self.events)

    def _claim_seen(self, ref: ClaimRef, claim: dict[str, Any]) -> None:
        """A claim of ours changed: its status may need writing, its pods pinning."""
        assert self.status is not None
        self.status.enqueue(ref, claim)
        if self.manager.containers is not None:
            self.manager.containers.reservation_seen(ref.uid, reserved_pods(claim))

    def on_slice_event(self) -> None:
        """One of our ResourceSlices changed or went away: check them against ours."""
        self.manager.plugin.resync()

    def periodic(self) -> None:
        """The checks that run every few seconds: the configuration file, preflight, orphans."""
        self.config.check()
        self.preflight.check()
        if not self.settings.watch_claims:
            return
        orphans = self.orphans.check()
        if orphans is None:  # the claim watch is not synced now: nothing is known missing
            return
        self.metrics.orphans.set(len(orphans))
        if orphans and self.settings.release_orphans:
            for uid, error in self.manager.unprepare_orphans(orphans).items():
                if error is None:
                    log.warning("released orphaned claim %s", uid)

    def usage(self) -> NodeUsage | None:
        """What the policy has handed out, for the metrics; None if the lock is busy."""
        if not self.manager.acquire(timeout=1):
            return None
        try:
            policy = self.manager.policy
            allocated, free = policy.usage()
            containers = self.manager.containers
            held_back = wholenuma.counts(self.manager.plugin.withheld())
            return NodeUsage(
                max(len(policy.devices()) - sum(held_back.values()), 0),
                len(policy.claim_uids()),
                allocated,
                free,
                pinning=None
                if containers is None
                else PinningUsage(
                    connected=containers.connected,
                    pinned=containers.pinning.pinned,
                    containers=len(containers.pinning.containers),
                    shared_cpus=len(policy.online_cpus() - policy.allocated_cpus()),
                    unreserved=containers.pinning.unreserved_total,
                    cpu_manager_conflicts=containers.cpu_manager_conflicts,
                    container_errors=containers.pinning.invalid_total + containers.errors,
                ),
                feature_gates=self.manager.plugin.feature_gates(),
                capacity_missing=claims_short(policy.shortfalls()),
                devices_withheld=held_back,
            )
        finally:
            self.manager.release()

    def _reconfigure(self, config: PolicyConfig) -> None:
        """Apply a changed configuration (PolicyError keeps the old one), then its quietCPUs."""
        self.manager.reconfigure(config)
        self.quiet.request_update()

    def _count_reload(self, result: str) -> None:
        self.metrics.config_reloads.labels(result).inc()
