"""Fixtures that run nodedra's real Kubernetes peers.

* `peer_binaries`: the official etcd, kube-apiserver, kube-scheduler and
  kube-controller-manager plus our kubelet harness and Go driver, found or
  built by tests.peers.build. Building happens once, right after collection
  (outside any test's timeout), with progress on the terminal. If it fails,
  every test that needs the peers fails with the reason and how to supply
  binaries: these tests never skip.
* `control_plane`: etcd + kube-apiserver for the whole session.
* `workload_controllers`: adds kube-scheduler and kube-controller-manager
  (opt-in: only end-to-end tests need them).
* `admin_api`: an official `kubernetes` client ApiClient as cluster admin.
* `kubelet_factory`, `go_driver_factory`, `ready_node`, `namespace`: per test.
* `nri_runtime_factory`: NRI runtime-side harnesses (pkg/adaptation, as containerd embeds
  it) at a given NRI version, and Go stub plugins on them (tests.peers.nri_runtime), per test.
* `real_node_factory`, `real_node`: a real node (kubelet, containerd or CRI-O, runc;
  tests.peers.node) that runs pods, per test; `real_node` is parametrized indirectly by
  runtime (one of NODE_RUNTIMES, default the newest containerd) and comes with the workload
  controllers, so its pods can be scheduled. The node's peers are built only when a selected
  test uses one.
* `nodedra_installed`: the control plane with the admin's part of manifests/ applied;
  `nodedra_factory`: `python -m nodedra run` processes with the credentials of a DaemonSet
  pod on a test node (tests.peers.nodedra_node), per test.

* `dockerfile_image`: nodedra's image built from the repository's Dockerfile by buildah
  (tests.peers.dockerfile_image; ``tox -e dockerfile``), right after collection, cached.

* `vm_node_factory`: boots Debian guests under QEMU with systemd and cgroup v2, two NUMA
  nodes, SMT and huge pages (tests.peers.vm), with the options a module asks for (kernel
  arguments, forwards to the control plane); its image is built (and cached) right after
  collection, and QEMU runs in the private network namespace.

When a test fails, the log tails of the peers it used are attached to its
report (sections "peer log: <name>").

Once the peers are built, the test process moves into a private network namespace of its
own (tests.peers.netns): every peer it starts afterwards, and all test traffic, stays there,
on 127.0.0.1 and the real node's address on ``lo``. With ``NODEDRA_BUILD_OTHER_RELEASES=1``
(tox's py311 sets it) the peers of the other Kubernetes releases are built in the background,
at the lowest CPU priority, for the compat environment that runs next: while the tests after
the VM node's run (those come first: their guests want both CPUs).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Generator, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

import pytest
from kubernetes.client import ApiClient, Configuration

from tests.peers.build import PeerBinaries, build_in_background, ensure_binaries
from tests.peers.busybox import busybox_binary, busybox_image_archive
from tests.peers.cache import PeerBuildError, cache_root
from tests.peers.cluster import create_ready_node, delete_node, ensure_test_namespace
from tests.peers.controlplane import ControlPlane, feature_gates_flag
from tests.peers.dockerfile_image import build_dockerfile_image
from tests.peers.go_driver import GoDriver, NUMAPlacement
from tests.peers.image import build_nodedra_image
from tests.peers.image_build import ImageBuildError, NodedraImage
from tests.peers.kubelet import KubeletHarness
from tests.peers.netns import NetworkNamespaceError, enter_private_network, in_private_network
from tests.peers.node import NodeError, RealNode
from tests.peers.nodedra_node import (
    NodeDirs,
    NodedraProcess,
    PodIdentity,
    delete_pod,
    install_nodedra,
    pod_identity,
    write_config,
)
from tests.peers.nri_runtime import NRIFactory
from tests.peers.peer_groups import (
    KUBERNETES_PEERS,
    KUBERNETES_VERSIONS,
    NODE_PEERS,
    kubernetes_peer,
    peer_names,
    release_peers,
)
from tests.peers.profile import (
    ClusterProfile,
    ProfileError,
    chosen_gate_mode,
    chosen_version,
    gates_for,
    read_enabled,
)
from tests.peers.runtime import NODE_RUNTIMES
from tests.peers.vm import VMError, VMNode
from tests.peers.vm_image import VMImage, ensure_vm_image

_BINARIES = pytest.StashKey[PeerBinaries]()
_BUILD_ERROR = pytest.StashKey[str]()
_NODE_BINARIES = pytest.StashKey[PeerBinaries]()
_NODE_BUILD_ERROR = pytest.StashKey[str]()
_NETNS_ERROR = pytest.StashKey[str]()
_FAILED = pytest.StashKey[bool]()

#: Fixtures whose tests need the peers of a real node (built only then).
_NODE_FIXTURES = frozenset({"real_node_factory", "node_binaries"})


@runtime_checkable
class HasLogs(Protocol):
    """Anything whose logs are worth showing when a test fails."""

    def log_tails(self, lines: int = 40) -> dict[str, str]: ...


# -- building the peers ---------------------------------------------------


def _terminal(config: pytest.Config) -> contextlib.AbstractContextManager[None]:
    """Write to the terminal even while pytest captures output."""
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is None:
        return contextlib.nullcontext()
    manager: contextlib.AbstractContextManager[None] = capture.global_and_fixture_disabled()
    return manager


def _control_plane_peers(version: str) -> list[str]:
    """Every peer but a real node's, with the Kubernetes ones of ``version`` only."""
    other_releases = {
        kubernetes_peer(name, v)
        for v in KUBERNETES_VERSIONS
        if v != version
        for name in KUBERNETES_PEERS
    }
    kubelets = {kubernetes_peer("kubelet", v) for v in KUBERNETES_VERSIONS}
    return [
        n
        for n in peer_names()
        if n not in NODE_PEERS and n not in other_releases and n not in kubelets
    ]


def _node_peers(version: str) -> dict[str, str]:
    """A real node's peers at ``version``: the name each has on the node -> its peer name
    (the kubelet of that release; everything else as the newest release's node has it)."""
    return {n: kubernetes_peer(n, version) if n == "kubelet" else n for n in NODE_PEERS}


def _resolve_binaries(config: pytest.Config, node: bool = False) -> None:
    """Build (or find) the control-plane peers, and with ``node`` a real node's too."""
    started = time.monotonic()
    try:
        version = chosen_version()
    except ProfileError as err:
        config.stash[_BUILD_ERROR] = str(err)
        return
    wanted = [
        (_BINARIES, _BUILD_ERROR, _control_plane_peers(version)),
        *(
            [(_NODE_BINARIES, _NODE_BUILD_ERROR, list(_node_peers(version).values()))]
            if node
            else []
        ),
    ]
    with _terminal(config):
        print(file=sys.stderr)
        for key, error, names in wanted:
            if key in config.stash or error in config.stash:
                continue
            try:
                config.stash[key] = ensure_binaries(log=sys.stderr, names=names)
            except PeerBuildError as err:
                config.stash[error] = str(err)
                print(f"[peers] ERROR: {err}", file=sys.stderr)
        print(f"[peers] peers ready after {time.monotonic() - started:.1f}s", file=sys.stderr)


#: Set to 1 to build the other Kubernetes releases' peers in the background during the run.
_OTHER_RELEASES_ENV = "NODEDRA_BUILD_OTHER_RELEASES"
_START_OTHER_RELEASES = pytest.StashKey[Callable[[], None]]()


def _build_other_releases(config: pytest.Config, now: bool) -> None:
    """When asked to (see the module docstring) and this run's own peers are ready, start a
    process to build the peers of every Kubernetes release but the one under test: at once
    with ``now``, else once the VM node's tests are over (_start_after_the_vm_tests). A
    fresh machine spends about five minutes of CPU per release on them."""
    if os.environ.get(_OTHER_RELEASES_ENV) != "1" or _BUILD_ERROR in config.stash:
        return
    version = chosen_version()
    names = [n for v in KUBERNETES_VERSIONS if v != version for n in release_peers(v)]
    log = cache_root() / "other-releases.log"
    start = build_in_background(names, log)
    with _terminal(config):
        when = "now" if now else "once the VM node's tests are over"
        print(
            f"[peers] the other Kubernetes releases' peers are built in the background {when}:"
            f" {log}",
            file=sys.stderr,
        )
    if now:
        start()
    else:
        config.stash[_START_OTHER_RELEASES] = start


def _needs_vm(item: pytest.Item) -> bool:
    names = set(getattr(item, "fixturenames", ()))
    return _VM_FACTORY in names


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The VM node's tests first, in their order: their guests keep both CPUs busy, where
    the other tests leave them mostly idle for the background build to take."""
    items[:] = [i for i in items if _needs_vm(i)] + [i for i in items if not _needs_vm(i)]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    """After the last VM node's test (its guests torn down), start the background build."""
    yield
    if _needs_vm(item) and (nextitem is None or not _needs_vm(nextitem)):
        start = item.config.stash.get(_START_OTHER_RELEASES, None)
        if start is not None:
            start()


def _enter_private_network(config: pytest.Config) -> None:
    """Move the test process into its private network namespace (see the module docstring);
    a failure only matters to real nodes, whose fixture reports it."""
    if in_private_network() or _NETNS_ERROR in config.stash:
        return
    with _terminal(config):
        try:
            name = enter_private_network()
        except NetworkNamespaceError as err:
            config.stash[_NETNS_ERROR] = str(err)
            print(f"[peers] staying in the machine's network namespace: {err}", file=sys.stderr)
        else:
            print(
                f"[peers] the test run is in a private network namespace ({name}); enter it "
                f"with: nsenter --net=/proc/{os.getpid()}/ns/net",
                file=sys.stderr,
            )


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the peers before the first test if any selected test needs them,
    so a long first build is not charged to one test's timeout; then leave the
    machine's network for a namespace of our own (building needed the network)."""
    fixtures = [set(getattr(item, "fixturenames", ())) for item in session.items]
    needs_vm = any(_VM_FACTORY in names for names in fixtures)
    if needs_vm:
        _build_vm_image(session.config)
    if any(_DOCKERFILE_FIXTURE in names for names in fixtures):
        _build_dockerfile_image(session.config)
    if any("peer_binaries" in names for names in fixtures):
        _resolve_binaries(session.config, node=any(_NODE_FIXTURES & names for names in fixtures))
        if any("busybox_image" in names for names in fixtures):
            _download_busybox(session.config)
        if any(_IMAGE_FIXTURE in names for names in fixtures):
            _build_nodedra_image(session.config)
        # Before leaving the machine's network: the build downloads.
        _build_other_releases(session.config, now=not needs_vm)
        _enter_private_network(session.config)
    if needs_vm:
        _enter_private_network(session.config)


@pytest.fixture(scope="session")
def peer_binaries(pytestconfig: pytest.Config) -> PeerBinaries:
    if _BINARIES not in pytestconfig.stash and _BUILD_ERROR not in pytestconfig.stash:
        _resolve_binaries(pytestconfig)
        _enter_private_network(pytestconfig)
    if _BUILD_ERROR in pytestconfig.stash:
        pytest.fail(
            f"Kubernetes test peers unavailable: {pytestconfig.stash[_BUILD_ERROR]}", pytrace=False
        )
    return pytestconfig.stash[_BINARIES].for_kubernetes(chosen_version())


@pytest.fixture(scope="session")
def dra_gates(peer_binaries: PeerBinaries) -> dict[str, bool]:
    """The DRA feature gates every component of this run gets (see tests.peers.profile)."""
    try:
        return gates_for(peer_binaries.kube_apiserver, chosen_gate_mode())
    except ProfileError as err:
        pytest.fail(str(err), pytrace=False)


@pytest.fixture(scope="session")
def node_binaries(pytestconfig: pytest.Config, peer_binaries: PeerBinaries) -> PeerBinaries:
    """Every peer, a real node's included (kubelet, containerd, runc, image programs)."""
    if _NODE_BINARIES not in pytestconfig.stash and _NODE_BUILD_ERROR not in pytestconfig.stash:
        _resolve_binaries(pytestconfig, node=True)
    if _NODE_BUILD_ERROR in pytestconfig.stash:
        pytest.fail(
            f"the peers of a real node are unavailable: {pytestconfig.stash[_NODE_BUILD_ERROR]}",
            pytrace=False,
        )
    node = pytestconfig.stash[_NODE_BINARIES]
    peers = _node_peers(chosen_version())
    return PeerBinaries({**peer_binaries.paths, **{n: node[p] for n, p in peers.items()}})


_BUSYBOX_ERROR = pytest.StashKey[str]()


def _download_busybox(config: pytest.Config) -> None:
    """Fetch the samples' busybox (a download: before the private network namespace)."""
    with _terminal(config):
        try:
            busybox_binary(sys.stderr)
        except PeerBuildError as err:
            config.stash[_BUSYBOX_ERROR] = str(err)
            print(f"[peers] ERROR: {err}", file=sys.stderr)


@pytest.fixture(scope="session")
def busybox_image(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The OCI archive of the samples' image (tests.peers.busybox)."""
    if _BUSYBOX_ERROR in pytestconfig.stash:
        pytest.fail(
            f"the samples' busybox image is unavailable: {pytestconfig.stash[_BUSYBOX_ERROR]}",
            pytrace=False,
        )
    try:
        return busybox_image_archive(tmp_path_factory.mktemp("busybox"))
    except PeerBuildError as err:
        pytest.fail(f"the samples' busybox image is unavailable: {err}", pytrace=False)


# -- control plane ----------------------------------------------------------


@pytest.fixture(scope="session")
def control_plane(
    peer_binaries: PeerBinaries,
    dra_gates: dict[str, bool],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ControlPlane]:
    cp = ControlPlane(peer_binaries, tmp_path_factory.mktemp("control-plane"), dra_gates)
    started = time.monotonic()
    cp.start()
    elapsed = time.monotonic() - started
    print(f"[peers] control plane ready in {elapsed:.1f}s at {cp.url} ({cp.workdir})")
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def cluster_profile(control_plane: ControlPlane) -> ClusterProfile:
    """This run's release and gates, and the features its API server has on."""
    return ClusterProfile(
        chosen_version(),
        chosen_gate_mode(),
        control_plane.feature_gates,
        read_enabled(control_plane.get_text("/metrics")),
    )


@pytest.fixture(scope="session")
def workload_controllers(control_plane: ControlPlane) -> ControlPlane:
    """The control plane with kube-scheduler and kube-controller-manager
    running (they stay up for the rest of the session)."""
    control_plane.start_workload_controllers()
    return control_plane


@contextlib.contextmanager
def admin_client(cp: ControlPlane) -> Iterator[ApiClient]:
    """The official `kubernetes` client, acting as ``cp``'s cluster admin."""
    configuration = Configuration(
        host=cp.url,
        ssl_ca_cert=str(cp.ca.pair.cert),
        cert_file=str(cp.admin.cert),
        key_file=str(cp.admin.key),
    )
    client = ApiClient(configuration)
    try:
        yield client
    finally:
        client.close()  # type: ignore[no-untyped-call]


@pytest.fixture(scope="session")
def admin_api(control_plane: ControlPlane) -> Iterator[ApiClient]:
    """The official `kubernetes` client, acting as cluster admin."""
    with admin_client(control_plane) as client:
        yield client


# -- per-test peers ----------------------------------------------------------


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def namespace(control_plane: ControlPlane) -> str:
    """A fresh namespace in which pods can be created."""
    name = _unique("test")
    ensure_test_namespace(control_plane, name)
    return name


@pytest.fixture
def ready_node(control_plane: ControlPlane) -> Iterator[str]:
    """A fresh Node object, Ready and schedulable; deleted after the test."""
    name = _unique("node")
    create_ready_node(control_plane, name)
    try:
        yield name
    finally:
        delete_node(control_plane, name)


@pytest.fixture
def peer_workdir(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A short directory for sockets and peer logs (Unix socket paths must
    stay under 108 bytes, pytest's tmp_path can be longer). Kept when the
    test failed, so its logs can be read."""
    path = Path(tempfile.mkdtemp(prefix="nodedra-peers-"))
    yield path
    if not request.node.stash.get(_FAILED, False):
        shutil.rmtree(path, ignore_errors=True)


class KubeletFactory:
    """Starts kubelet harnesses for a test and stops them afterwards."""

    def __init__(self, cp: ControlPlane, binaries: PeerBinaries, workdir: Path) -> None:
        self._cp = cp
        self._binaries = binaries
        self._workdir = workdir
        self.started: list[KubeletHarness] = []

    def __call__(
        self, node_name: str, *, node_credentials: bool = True, feature_gates: str | None = None
    ) -> KubeletHarness:
        """Start a kubelet for `node_name`, by default with that node's own
        credentials (so the Node authorizer applies, as for a real kubelet)."""
        kubeconfig = (
            self._cp.node_kubeconfig(node_name) if node_credentials else self._cp.admin_kubeconfig
        )
        harness = KubeletHarness(
            self._binaries.kubelet_harness,
            kubeconfig,
            node_name,
            self._workdir / f"kubelet-{len(self.started)}",
            feature_gates=feature_gates
            if feature_gates is not None
            else feature_gates_flag(self._cp.feature_gates),
        )
        self.started.append(harness)
        harness.start()
        return harness

    def stop_all(self) -> None:
        for harness in reversed(self.started):
            harness.stop()

    def log_tails(self, lines: int = 40) -> dict[str, str]:
        return {f"kubelet {h.node_name} ({h.log_path})": h.log_tail(lines) for h in self.started}


@pytest.fixture
def kubelet_factory(
    control_plane: ControlPlane, peer_binaries: PeerBinaries, peer_workdir: Path
) -> Iterator[KubeletFactory]:
    factory = KubeletFactory(control_plane, peer_binaries, peer_workdir)
    try:
        yield factory
    finally:
        factory.stop_all()


class NodeLike(Protocol):
    """What a DRA driver needs of a node: a KubeletHarness or a RealNode."""

    @property
    def node_name(self) -> str: ...

    @property
    def registry_dir(self) -> Path: ...


class GoDriverFactory:
    """Starts Go reference drivers for a test and stops them afterwards."""

    def __init__(self, cp: ControlPlane, binaries: PeerBinaries, workdir: Path) -> None:
        self._cp = cp
        self._binaries = binaries
        self._workdir = workdir
        self.started: list[GoDriver] = []

    def __call__(
        self,
        kubelet: NodeLike,
        driver_name: str | None = None,
        devices: int = 4,
        services: tuple[str, ...] = ("v1", "v1beta1"),
        cdi_dir: Path | None = None,
        *,
        numa: NUMAPlacement | None = None,
    ) -> GoDriver:
        """Start a driver on the kubelet's node, registering in its registry
        dir. Each call gets a unique driver name unless one is given, so
        devices of different tests never mix. Its CDI specs go to ``cdi_dir``
        (a real node's, for containers to get them) or a directory of its own; ``numa``
        places its devices in NUMA nodes."""
        driver = GoDriver(
            self._binaries.go_driver,
            self._cp.admin_kubeconfig,
            kubelet.node_name,
            kubelet.registry_dir,
            self._workdir / f"go-driver-{len(self.started)}",
            driver_name=driver_name or f"{_unique('go')}.nodedra.test",
            devices=devices,
            services=services,
            cdi_dir=cdi_dir,
            numa=numa,
        )
        self.started.append(driver)
        driver.start()
        return driver

    def stop_all(self) -> None:
        for driver in reversed(self.started):
            driver.stop()

    def log_tails(self, lines: int = 40) -> dict[str, str]:
        return {
            f"go-driver {d.driver_name} ({d.log_path})": d.log_tail(lines) for d in self.started
        }


@pytest.fixture
def go_driver_factory(
    control_plane: ControlPlane, peer_binaries: PeerBinaries, peer_workdir: Path
) -> Iterator[GoDriverFactory]:
    factory = GoDriverFactory(control_plane, peer_binaries, peer_workdir)
    try:
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture
def nri_runtime_factory(peer_binaries: PeerBinaries, peer_workdir: Path) -> Iterator[NRIFactory]:
    """``factory(version)`` starts an NRI runtime harness at that NRI version (one of
    ``NRI_VERSIONS``) on a short socket path; ``factory.stub_plugin(runtime)`` connects the
    Go stub plugin to it. Everything is stopped after the test."""
    factory = NRIFactory(peer_binaries, peer_workdir)
    try:
        yield factory
    finally:
        factory.stop_all()


class RealNodeFactory:
    """Starts real nodes (tests.peers.node) for a test and tears them down afterwards.

    Teardown kills every pod container, daemon and mount of each node and removes its
    cgroups and its Node object; anything left behind fails the test (at teardown) with what
    it was.
    """

    def __init__(self, cp: ControlPlane, binaries: PeerBinaries, workdir: Path) -> None:
        self._cp = cp
        self._binaries = binaries
        self._workdir = workdir
        self.started: list[RealNode] = []

    def __call__(
        self,
        node_name: str | None = None,
        *,
        runtime: str = NODE_RUNTIMES[0],
        start: bool = True,
        **options: Any,
    ) -> RealNode:
        """A started node (``start=False``: configured only) named ``node_name`` (default a
        fresh name); ``options`` are RealNode's (cdi_dir, nri_socket, kubelet_config...)."""
        node = RealNode(
            self._binaries,
            self._cp,
            node_name or _unique("real"),
            self._workdir / f"node-{len(self.started)}",
            runtime=runtime,
            **options,
        )
        self.started.append(node)
        if start:
            node.start()
        return node

    def stop_all(self) -> None:
        problems = []
        for node in reversed(self.started):
            try:
                node.stop()
            except NodeError as err:
                problems.append(str(err))
        if problems:
            raise NodeError("; ".join(problems))

    def log_tails(self, lines: int = 40) -> dict[str, str]:
        tails: dict[str, str] = {}
        for node in self.started:
            tails.update(node.log_tails(lines))
        return tails


@pytest.fixture
def real_node_factory(
    pytestconfig: pytest.Config,
    control_plane: ControlPlane,
    node_binaries: PeerBinaries,
    peer_workdir: Path,
) -> Iterator[RealNodeFactory]:
    if not in_private_network():
        reason = pytestconfig.stash.get(_NETNS_ERROR, "it was never entered")
        pytest.fail(
            "a real node needs the test run's private network namespace (its address lives "
            f"on lo there), and the run is not in it: {reason}. Run the tests as root on "
            "Linux with iproute2 installed.",
            pytrace=False,
        )
    factory = RealNodeFactory(control_plane, node_binaries, peer_workdir)
    try:
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture
def real_node(
    request: pytest.FixtureRequest,
    real_node_factory: RealNodeFactory,
    workload_controllers: ControlPlane,
) -> RealNode:
    """A started, Ready and schedulable real node; parametrize it indirectly with one of
    NODE_RUNTIMES to choose its runtime."""
    return real_node_factory(runtime=getattr(request, "param", NODE_RUNTIMES[0]))


# -- failure reports ---------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, Any]:
    """Attach the log tails of the peers a failed test used to its report."""
    report = yield
    if report.failed and report.when in ("setup", "call"):
        item.stash[_FAILED] = True
        funcargs: dict[str, Any] = getattr(item, "funcargs", {})
        seen: set[int] = set()  # several fixtures may be the same control plane
        sections: set[str] = set()  # ... or a factory and what it made
        for value in funcargs.values():
            if isinstance(value, HasLogs) and id(value) not in seen:
                seen.add(id(value))
                for name, text in value.log_tails().items():
                    if name not in sections:
                        sections.add(name)
                        report.sections.append((f"peer log: {name}", text or "(empty)"))
    return report


# -- nodedra as its DaemonSet pod would run ---------------------------------------------------

#: A two-socket machine with four NUMA nodes and 56 CPUs: enough CPUs for claims and reserved
#: CPUs to be told apart.
NODEDRA_SYSFS = Path(__file__).resolve().parent / "fixtures/sysfs/two-socket-smt2-numa4"
#: The setting that publishes topology-aware devices whole where the gate is off.
WHOLE_NUMA_NODES_ENV = "NODEDRA_ALLOW_WHOLE_NUMA_NODE_DEVICES"


@pytest.fixture(scope="session")
def nodedra_installed(control_plane: ControlPlane) -> ControlPlane:
    """The control plane with what an admin applies from manifests/ before nodedra runs."""
    install_nodedra(control_plane)
    return control_plane


class NodedraFactory:
    """Runs `python -m nodedra run` for a test's node, as its DaemonSet pod would, and stops
    every instance afterwards.

    Each instance gets its own Pod object on the node and a token bound to that pod (so
    RBAC and the admission policy apply as in a cluster). Instances of one test share the
    node's plugin, CDI and state directories and the configuration file, as pods of one
    DaemonSet on one node do.
    """

    def __init__(self, cp: ControlPlane, workdir: Path) -> None:
        self._cp = cp
        self._workdir = workdir
        self.dirs = NodeDirs.under(workdir / "node")
        self.config = workdir / "config.yaml"
        self.started: list[NodedraProcess] = []
        self.pods: list[str] = []

    def write_config(self, config: Mapping[str, Any] | str) -> Path:
        return write_config(self.config, config)

    def identity(self, node_name: str) -> PodIdentity:
        """A pod of nodedra on ``node_name`` and its bound token (deleted after the test)."""
        identity = pod_identity(self._cp, node_name, self._workdir / "identities")
        self.pods.append(identity.pod_name)
        return identity

    def __call__(
        self,
        kubelet: NodeLike,
        *,
        identity: PodIdentity | None = None,
        pod_uid: str | None = None,
        env: Mapping[str, str] | None = None,
        sysfs: Path = NODEDRA_SYSFS,
        node_name: str | None = "",
        kubeconfig: Path | None = None,
        state_dir: Path | None = None,
        metrics_port: int | None = None,
        pinning: str = "off",
        nri_socket: Path | None = None,
        whole_numa_nodes: bool = True,
    ) -> NodedraProcess:
        """Start an instance for ``kubelet``'s node (a KubeletHarness or a RealNode, whose
        registry dir it registers in; ``node_name=None``: pass none).

        ``whole_numa_nodes``: with NODEDRA_ALLOW_WHOLE_NUMA_NODE_DEVICES=true, so that the
        runs whose API server has DRAConsumableCapacity off test the whole-device fallback
        (where it is on, it changes nothing); the default, which withholds those devices, is
        tests/integration/test_whole_numa_nodes.py's.
        """
        if not self.config.exists():
            self.write_config({"policy": "topology-aware", "reservedCPUs": "0"})
        if kubeconfig is None:
            identity = identity or self.identity(kubelet.node_name)
            kubeconfig = identity.kubeconfig
        dirs = (
            self.dirs if state_dir is None else NodeDirs(self.dirs.plugin, self.dirs.cdi, state_dir)
        )
        nodedra = NodedraProcess(
            name=f"nodedra-{len(self.started)}" + (f"-{pod_uid}" if pod_uid else ""),
            node_name=kubelet.node_name if node_name == "" else node_name,
            kubeconfig=kubeconfig,
            registry_dir=kubelet.registry_dir,
            dirs=dirs,
            sysfs=sysfs,
            config=self.config,
            log_path=self._workdir / f"nodedra-{len(self.started)}.log",
            pod_uid=pod_uid,
            env={**({WHOLE_NUMA_NODES_ENV: "true"} if whole_numa_nodes else {}), **(env or {})},
            metrics_port=metrics_port,
            pinning=pinning,
            nri_socket=nri_socket,
        )
        self.started.append(nodedra)
        return nodedra.start()

    def stop_all(self) -> None:
        for nodedra in reversed(self.started):
            nodedra.stop()
        for pod in self.pods:
            delete_pod(self._cp, pod)

    def log_tails(self, lines: int = 60) -> dict[str, str]:
        tails: dict[str, str] = {}
        for nodedra in self.started:
            tails.update(nodedra.log_tails(lines))
        return tails


@pytest.fixture
def nodedra_factory(
    nodedra_installed: ControlPlane, peer_workdir: Path
) -> Iterator[NodedraFactory]:
    factory = NodedraFactory(nodedra_installed, peer_workdir)
    try:
        yield factory
    finally:
        factory.stop_all()


# == nodedra's container image (tests.peers.image) ================================================
# Built right after collection, with the peers and before the test process enters its private
# network namespace (pytest_collection_finish): pip and debootstrap download. A failure is kept
# and fails every test that uses the image, with the reason.

_Built = TypeVar("_Built")
_IMAGE = pytest.StashKey[NodedraImage]()
_IMAGE_BUILD_ERROR = pytest.StashKey[str]()
#: The fixture whose tests need the image (built only then).
_IMAGE_FIXTURE = "nodedra_image"


def _build_nodedra_image(config: pytest.Config) -> None:
    """Build nodedra's image once per session (tests.peers.image caches its base layer)."""
    _build_once(config, _IMAGE, _IMAGE_BUILD_ERROR, lambda: build_nodedra_image(log=sys.stderr))


@pytest.fixture(scope="session")
def nodedra_image(pytestconfig: pytest.Config) -> NodedraImage:
    """nodedra's image, the Dockerfile's recipe built without Docker (tests.peers.image): an
    OCI archive for ``ctr images import`` (``RealNode.import_image``)."""
    return _built(
        pytestconfig,
        _IMAGE,
        _IMAGE_BUILD_ERROR,
        _build_nodedra_image,
        what="nodedra's image",
        downloads="pip and debootstrap",
    )


_DOCKERFILE_IMAGE = pytest.StashKey[NodedraImage]()
_DOCKERFILE_IMAGE_ERROR = pytest.StashKey[str]()
#: The fixture whose tests need the Dockerfile's image (built only then: minutes when cold).
_DOCKERFILE_FIXTURE = "dockerfile_image"


def _build_dockerfile_image(config: pytest.Config) -> None:
    """Build the Dockerfile with buildah once per session (cached across sessions)."""
    _build_once(
        config,
        _DOCKERFILE_IMAGE,
        _DOCKERFILE_IMAGE_ERROR,
        lambda: build_dockerfile_image(log=sys.stderr).image,
    )


@pytest.fixture(scope="session")
def dockerfile_image(pytestconfig: pytest.Config) -> NodedraImage:
    """nodedra's image built from the repository's Dockerfile by buildah
    (tests.peers.dockerfile_image): an OCI archive for ``ctr images import``."""
    return _built(
        pytestconfig,
        _DOCKERFILE_IMAGE,
        _DOCKERFILE_IMAGE_ERROR,
        _build_dockerfile_image,
        what="the Dockerfile's image",
        downloads="apt and pip in buildah's build",
    )


def _build_once(
    config: pytest.Config,
    key: pytest.StashKey[_Built],
    error: pytest.StashKey[str],
    build: Callable[[], _Built],
) -> None:
    """Run ``build`` once per session, keeping its result or its error in the stash."""
    if key in config.stash or error in config.stash:
        return
    with _terminal(config):
        print(file=sys.stderr)
        try:
            config.stash[key] = build()
        except (ImageBuildError, OSError) as err:
            config.stash[error] = str(err)
            print(f"[peers] ERROR: {err}", file=sys.stderr)


def _built(
    config: pytest.Config,
    key: pytest.StashKey[_Built],
    error: pytest.StashKey[str],
    build: Callable[[pytest.Config], None],
    *,
    what: str,
    downloads: str,
) -> _Built:
    """What ``build`` made (it runs now if collection did not run it: a fixture used in a
    way collection did not see), or the test fails with why it could not be made."""
    if key not in config.stash and error not in config.stash:
        if in_private_network():
            config.stash[error] = (
                "it was not built before the test run entered its private network namespace, "
                f"where {downloads} cannot download"
            )
        else:
            build(config)
    if error in config.stash:
        pytest.fail(f"{what} is unavailable: {config.stash[error]}", pytrace=False)
    return config.stash[key]


# == end of nodedra's container image ==============================================================


# == the VM node (tests.peers.vm) ==========================================================
# Its image is built right after collection, before the test process enters its private network
# namespace (debootstrap and apt download); QEMU then runs inside that namespace.

_VM_IMAGE = pytest.StashKey[VMImage]()
_VM_IMAGE_ERROR = pytest.StashKey[str]()
#: The fixture whose tests need the VM image (built only then).
_VM_FACTORY = "vm_node_factory"


def _build_vm_image(config: pytest.Config) -> None:
    """The guest's image, whose containerd has nodedra's image (built first) preloaded."""

    def build() -> VMImage:
        _build_nodedra_image(config)
        if _IMAGE_BUILD_ERROR in config.stash:
            raise ImageBuildError(
                f"the VM node carries nodedra's image: {config.stash[_IMAGE_BUILD_ERROR]}"
            )
        return ensure_vm_image(sys.stderr, [config.stash[_IMAGE].archive])

    _build_once(config, _VM_IMAGE, _VM_IMAGE_ERROR, build)


VMNodeFactory = Callable[..., contextlib.AbstractContextManager[VMNode]]


@pytest.fixture(scope="session")
def vm_node_factory(
    pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory
) -> VMNodeFactory:
    """Boots guests (tests.peers.vm): ``with vm_node_factory(**VMNode options) as node``
    yields one booted to multi-user and kills it afterwards."""

    @contextlib.contextmanager
    def boot(**options: Any) -> Iterator[VMNode]:
        image = _built(
            pytestconfig,
            _VM_IMAGE,
            _VM_IMAGE_ERROR,
            _build_vm_image,
            what="the VM node's image",
            downloads="apt and debootstrap",
        )
        _enter_private_network(pytestconfig)
        if not in_private_network():
            pytest.fail(
                "the VM node runs only in the test run's private network namespace: "
                f"{pytestconfig.stash.get(_NETNS_ERROR, 'not entered')}",
                pytrace=False,
            )
        node = VMNode(image, tmp_path_factory.mktemp("vm"), **options)
        try:
            try:
                node.start()
            except VMError as err:
                pytest.fail(f"the VM node did not boot: {err}", pytrace=False)
            print(f"[vm] guest {node.state} {node.boot_seconds:.1f}s after QEMU started")
            yield node
        finally:
            node.stop()

    return boot
