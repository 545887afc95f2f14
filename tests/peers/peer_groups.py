"""What each group of test peers is: its Go module, packages, build flags and source hash.

The peers the integration tests run are built from official Go modules in groups, one Go module
each (see :func:`peer_groups`): the Kubernetes group pinned in ``tests/peers/go.mod``
(kube-apiserver, kube-scheduler, kube-controller-manager and the kubelet from
k8s.io/kubernetes, an etcd server from go.etcd.io/etcd/server/v3, plus our own small
Go programs: the kubelet DRA harness and the Go reference driver), and groups of their
own for peers whose dependency pins differ: the NRI runtime harness and Go stub plugin of
``tests/peers/nri`` (one group per version in :data:`NRI_VERSIONS`), containerd (one group
per version in :data:`CONTAINERD_VERSIONS`), runc, and the programs of the test node's
images. Each group's binaries are cached under a key of the group's name and a hash of its Go
sources, go.mod, go.sum and build flags (:meth:`PeerGroup.cache_dir`), so changed harness
code gets rebuilt and unchanged code is reused.

This module only describes the groups (the versions the tests parametrize over come from
here too); tests.peers.build finds or builds their binaries, tests.peers.go_build runs the
Go toolchain.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.peers.cache import PeerBuildError, cache_root

PEERS_DIR = Path(__file__).resolve().parent

#: Bump when the way binaries are built changes, so old caches are not reused.
_BUILD_SCHEME = "2"


@dataclass(frozen=True)
class PeerGroup:
    """Peers built together, by one ``go build``, from one Go module.

    Each group is cached on its own (its name plus a hash of its sources and flags), so a
    change to one group's sources rebuilds that group only. ``modfile`` builds the same
    sources against another version of their dependencies: an alternative ``go.mod`` (with
    its ``.sum`` beside it) in the module, as ``go build -modfile`` takes it.
    """

    name: str
    module: Path
    packages: Mapping[str, str]
    """Binary name -> Go package, relative to the module."""
    modfile: str | None = None
    tags: tuple[str, ...] = ()
    cgo: bool = False
    ldflags: tuple[str, ...] = ("-s", "-w")
    c_libraries: tuple[str, ...] = ()
    """pkg-config names of the C libraries a cgo build links (checked before building)."""
    c_programs: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """Binary name -> (Go module, directory in it) of a C program whose sources come with a
    module the group requires (each ``.c`` file of the directory, compiled into one static
    program by gcc)."""

    @property
    def binaries(self) -> list[str]:
        """The names of everything the group builds."""
        return [*self.packages, *self.c_programs]

    def source_files(self) -> list[Path]:
        """Everything that decides what this group's binaries are."""
        mod = self.module / (self.modfile or "go.mod")
        # A module without dependencies has no go.sum.
        files = [p for p in (mod, mod.with_suffix(".sum")) if p == mod or p.exists()]
        nested = [p.parent for p in self.module.rglob("go.mod") if p.parent != self.module]
        files += sorted(
            p
            for p in self.module.rglob("*.go")
            if p.is_file() and not any(p.is_relative_to(n) for n in nested)
        )
        return files

    def build_flags(self) -> list[str]:
        """Flags of ``go build`` that shape the binaries (part of the cache key)."""
        flags = [
            "-trimpath",
            # Our sources live in the nodedra repository; stamping its VCS state
            # into test binaries only breaks builds in unusual checkouts.
            "-buildvcs=false",
            # The linker leaves debug information out (-s -w), so the compiler need not make
            # it: a cold build of helm took 77 s instead of 86 to 95.
            "-gcflags=all=-dwarf=false",
            "-ldflags",
            " ".join(self.ldflags),
        ]
        if self.modfile:
            flags.append(f"-modfile={self.modfile}")
        if self.tags:
            flags.append("-tags=" + ",".join(self.tags))
        return flags

    def source_hash(self) -> str:
        """Hash of everything that determines the binaries of this group."""
        digest = hashlib.sha256(_BUILD_SCHEME.encode())
        for path in self.source_files():
            digest.update(str(path.relative_to(self.module)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
        digest.update(" ".join(self.build_flags()).encode())
        digest.update(b"cgo" if self.cgo else b"static")
        if self.c_programs:
            digest.update(repr(sorted(self.c_programs.items())).encode())
        return digest.hexdigest()[:16]

    def cache_dir(self) -> Path:
        """Where this group's binaries are cached."""
        return cache_root() / f"{self.name}-{self.source_hash()}"


def kubernetes_version(go_mod: Path = PEERS_DIR / "go.mod") -> str:
    """The k8s.io/kubernetes version that go.mod pins (the single source of truth)."""
    match = re.search(
        r"^\s*(?:require\s+)?k8s\.io/kubernetes\s+(v\S+)", go_mod.read_text(), re.MULTILINE
    )
    if match is None:
        raise PeerBuildError(f"{go_mod} does not require k8s.io/kubernetes")
    return match.group(1)


def _kubernetes_ldflags(version: str) -> tuple[str, ...]:
    """Version stamping as Kubernetes' own build does, so the components
    report the release they were built from (not v0.0.0-master)."""
    major, minor = version.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
        ]
    return tuple(flags)


#: The Kubernetes releases the control plane and the kubelet harness are built at, newest
#: first: the newest is what ``go.mod`` pins (the whole suite runs there, and the real node's
#: kubelet and the Go driver are built only there); each other one builds the same sources
#: with ``go.k8s-<version>.mod`` (written by ``python -m tests.peers.kubernetes_mod``) and
#: the build tags ``k8s_before_1_<minor>`` of every later minor release, which select what
#: the harness calls differently there (``cmd/kubelet-harness/kubelet_before_1_*.go``).
KUBERNETES_VERSIONS: tuple[str, ...] = (kubernetes_version(), "v1.36.3", "v1.35.4", "v1.34.4")

#: The control plane's peers, built at every release of KUBERNETES_VERSIONS.
KUBERNETES_PEERS: Mapping[str, str] = {
    "etcd": "./cmd/etcd",
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kubelet-harness": "./cmd/kubelet-harness",
}


def kubernetes_modfile(version: str) -> str:
    """The module file (in tests/peers) that builds the Kubernetes peers at ``version``."""
    return f"go.k8s-{version}.mod"


def kubernetes_peer(name: str, version: str) -> str:
    """The peer name of one Kubernetes binary at ``version``: plain for the newest release,
    suffixed for the others (``kube-apiserver-v1.34.4``)."""
    return name if version == KUBERNETES_VERSIONS[0] else f"{name}-{version}"


#: The oldest release a real node runs at besides the newest (its kubelet, for the node's
#: core tests in the compatibility runs).
OLDEST_NODE_RELEASE = KUBERNETES_VERSIONS[-1]


def _kubernetes_group(version: str) -> PeerGroup:
    packages = {kubernetes_peer(name, version): pkg for name, pkg in KUBERNETES_PEERS.items()}
    if version == OLDEST_NODE_RELEASE:
        packages[kubernetes_peer("kubelet", version)] = "k8s.io/kubernetes/cmd/kubelet"
    if version != KUBERNETES_VERSIONS[0]:
        minor, newest = (int(v.split(".")[1]) for v in (version, KUBERNETES_VERSIONS[0]))
        return PeerGroup(
            name=f"kubernetes-{version}",
            module=PEERS_DIR,
            packages=packages,
            modfile=kubernetes_modfile(version),
            tags=tuple(f"k8s_before_1_{later}" for later in range(minor + 1, newest + 1)),
            ldflags=_kubernetes_ldflags(version),
        )
    return PeerGroup(
        name=f"kubernetes-{version}",
        module=PEERS_DIR,
        packages={
            **packages,
            "kubelet": "k8s.io/kubernetes/cmd/kubelet",
            "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy",
            "kubectl": "k8s.io/kubernetes/cmd/kubectl",
            "kubeadm": "k8s.io/kubernetes/cmd/kubeadm",
            "go-driver": "./cmd/go-driver",
        },
        ldflags=_kubernetes_ldflags(version),
    )


#: The NRI versions the runtime-side harness is built at, oldest first; tests parametrize
#: over this. Each is what a line of containerd releases embeds (see NRI_CONTAINERD).
NRI_VERSIONS: tuple[str, ...] = ("v0.8.0", "v0.11.0", "v0.12.5")

#: Which containerd releases embed each NRI version (for documentation and test ids).
#: containerd 2.3.x vendors v0.12.0 and 2.4.x v0.12.3; v0.12.5 is the newest patch release
#: of that line, with the same protocol plus optional failure policies.
NRI_CONTAINERD: dict[str, str] = {
    "v0.8.0": "containerd 2.0/2.1",
    "v0.11.0": "containerd 2.2",
    "v0.12.5": "containerd 2.3/2.4",
}

#: How each NRI version is built: the module file of tests/peers/nri and the build tag
#: selecting what differs between the containerd releases that embed it.
_NRI_BUILDS: dict[str, tuple[str | None, str]] = {
    "v0.8.0": ("v0.8.0.mod", "nri_v08"),
    "v0.11.0": ("v0.11.0.mod", "nri_v11"),
    "v0.12.5": (None, "nri_v12"),
}

NRI_MODULE = PEERS_DIR / "nri"


def _nri_group(version: str) -> PeerGroup:
    modfile, tag = _NRI_BUILDS[version]
    return PeerGroup(
        name=f"nri-{version}",
        module=NRI_MODULE,
        packages={
            f"nri-runtime-{version}": "./cmd/nri-runtime",
            f"nri-stub-plugin-{version}": "./cmd/nri-stub-plugin",
        },
        modfile=modfile,
        tags=(tag,),
    )


CONTAINERD_DIR = PEERS_DIR / "containerd"

#: The containerd versions the real node runs, newest first; node tests parametrize over them.
#: v2.4 passes the CDI device names of a container to NRI plugins (NRI v0.12); v2.2 (NRI v0.11)
#: does not, so there only the environment a CDI spec adds tells a plugin a container's claims.
#: The first is pinned by ``containerd/go.mod``, each other one by ``containerd/go.<version>.mod``
#: (with its ``.sum``): the same module built against another containerd.
CONTAINERD_VERSIONS: tuple[str, ...] = ("v2.4.2", "v2.2.9")

#: Binaries of each containerd group; their peer names carry the version (``ctr-v2.2.9``).
CONTAINERD_COMMANDS: Mapping[str, str] = {
    "containerd": "github.com/containerd/containerd/v2/cmd/containerd",
    "containerd-shim-runc-v2": "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
    "ctr": "github.com/containerd/containerd/v2/cmd/ctr",
}


def _required_version(go_mod: Path, module: str) -> str:
    match = re.search(
        rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", go_mod.read_text(), re.MULTILINE
    )
    if match is None:
        raise PeerBuildError(f"{go_mod} does not require {module}")
    return match.group(1)


def containerd_peer(command: str, version: str) -> str:
    """The peer name of one containerd binary of one version, e.g. ``ctr-v2.4.2``."""
    return f"{command}-{version}"


def _containerd_group(version: str) -> PeerGroup:
    modfile = None if version == CONTAINERD_VERSIONS[0] else f"go.{version}.mod"
    pinned = _required_version(
        CONTAINERD_DIR / (modfile or "go.mod"), "github.com/containerd/containerd/v2"
    )
    if pinned != version:
        raise PeerBuildError(
            f"{CONTAINERD_DIR / (modfile or 'go.mod')} pins containerd {pinned}, not {version}: "
            "CONTAINERD_VERSIONS and the module files disagree"
        )
    return PeerGroup(
        name=f"containerd-{version}",
        module=CONTAINERD_DIR,
        packages={containerd_peer(cmd, version): pkg for cmd, pkg in CONTAINERD_COMMANDS.items()},
        modfile=modfile,
        # Stamped as containerd's own release build does; the node reports it.
        ldflags=("-s", "-w", f"-X github.com/containerd/containerd/v2/version.Version={version}"),
    )


def _runc_group() -> PeerGroup:
    # cgo: runc's nsenter is C, and so is libseccomp, which runc needs: the kubelet asks for
    # the runtime's default seccomp profile for every pod sandbox, whatever the pod says, and
    # a runc built without the seccomp tag refuses to start a container that has one.
    module = PEERS_DIR / "runc"
    version = _required_version(module / "go.mod", "github.com/opencontainers/runc")
    return PeerGroup(
        name=f"runc-{version}",
        module=module,
        packages={"runc": "github.com/opencontainers/runc"},
        tags=("seccomp",),
        cgo=True,
        c_libraries=("libseccomp",),
    )


CRIO_DIR = PEERS_DIR / "crio"
CRIO_MODULE = "github.com/cri-o/cri-o"

#: The CRI-O release a real node can run instead of containerd (``crio/go.mod`` pins it).
CRIO_VERSION = _required_version(CRIO_DIR / "go.mod", CRIO_MODULE)


def _crio_group() -> PeerGroup:
    # Without cgo, and with the tags of CRI-O's own Makefile that drop the C libraries this
    # machine lacks (gpgme, btrfs, ostree): no seccomp filter of CRI-O's own (the test
    # node's pods ask for none) and no signature checks (its images are the tests' own).
    return PeerGroup(
        name=f"cri-o-{CRIO_VERSION}",
        module=CRIO_DIR,
        packages={"crio": f"{CRIO_MODULE}/cmd/crio", "crio-import": "./cmd/crio-import"},
        tags=(
            "containers_image_ostree_stub",
            "containers_image_openpgp",
            "exclude_graphdriver_btrfs",
            "btrfs_noversion",
        ),
        # CRI-O creates a pod's namespaces with pinns, a C program of its module.
        c_programs={"pinns": (f"{CRIO_MODULE}@{CRIO_VERSION}", "pinns/src")},
    )


def _workloads_group() -> PeerGroup:
    return PeerGroup(
        name="workloads",
        module=PEERS_DIR / "workloads",
        packages={"pause": "./cmd/pause", "workload": "./cmd/workload"},
    )


#: The CNI plugins of the real node's pod network (containernetworking/plugins).
CNI_PLUGINS: Mapping[str, str] = {
    "bridge": "github.com/containernetworking/plugins/plugins/main/bridge",
    "host-local": "github.com/containernetworking/plugins/plugins/ipam/host-local",
    "loopback": "github.com/containernetworking/plugins/plugins/main/loopback",
}


def _cni_group() -> PeerGroup:
    module = PEERS_DIR / "cni"
    version = _required_version(module / "go.mod", "github.com/containernetworking/plugins")
    return PeerGroup(name=f"cni-plugins-{version}", module=module, packages=CNI_PLUGINS)


def _helm_group() -> PeerGroup:
    module = PEERS_DIR / "helm"
    version = _required_version(module / "go.mod", "helm.sh/helm/v3")
    return PeerGroup(
        name=f"helm-{version}",
        module=module,
        packages={"helm": "helm.sh/helm/v3/cmd/helm"},
        # Stamped as helm's own release build does (`helm version` reports it).
        ldflags=("-s", "-w", f"-X helm.sh/helm/v3/internal/version.version={version}"),
    )


def peer_groups() -> tuple[PeerGroup, ...]:
    """Every group of peers the tests and benchmarks use."""
    return (
        *(_kubernetes_group(v) for v in KUBERNETES_VERSIONS),
        *(_nri_group(v) for v in NRI_VERSIONS),
        *(_containerd_group(v) for v in CONTAINERD_VERSIONS),
        _crio_group(),
        _runc_group(),
        _workloads_group(),
        _cni_group(),
        _helm_group(),
    )


#: The peers of a real node (tests.peers.node), beyond the control plane: built only when a
#: selected test runs one.
NODE_PEERS: tuple[str, ...] = (
    "kubelet",
    *(containerd_peer(cmd, v) for v in CONTAINERD_VERSIONS for cmd in CONTAINERD_COMMANDS),
    "crio",
    "crio-import",
    "pinns",
    "runc",
    "pause",
    "workload",
    # What deploying nodedra as a DaemonSet on the node takes: the pod network (CNI plugins,
    # kube-proxy for the API server's Service) and the admin's tools.
    *CNI_PLUGINS,
    "kube-proxy",
    "kubectl",
    "helm",
    # kubeadm checks the configuration files docs/lifecycle.md gives an admin.
    "kubeadm",
)


def groups_by_peer(groups: Sequence[PeerGroup]) -> dict[str, PeerGroup]:
    """The group of each peer, by name."""
    return {name: group for group in groups for name in group.binaries}


#: Environment variable that supplies each peer instead of building it.
ENV_OVERRIDES: dict[str, str] = {
    name: "NODEDRA_" + re.sub(r"[^A-Z0-9]", "_", name.upper())
    for name in groups_by_peer(peer_groups())
}


def peer_names() -> list[str]:
    """The name of every peer, in build order."""
    return list(ENV_OVERRIDES)


SUPPLY_HINT = (
    "To supply prebuilt binaries instead, set "
    + ", ".join(ENV_OVERRIDES.values())
    + " to their paths, or KUBEBUILDER_ASSETS to a directory holding etcd and "
    "kube-apiserver (envtest layout). To build, install Go (see tests/peers/go.mod for "
    "the version) with access to the Go module proxy and run `python -m tests.peers.build`."
)

#: What a missing Debian package that a peer's build or run needs says when it cannot be
#: installed.
INSTALL_HINT = "Install them, or supply the binaries. " + SUPPLY_HINT


def release_peers(version: str) -> list[str]:
    """The peers built at Kubernetes ``version`` (its group's)."""
    return list(_kubernetes_group(version).packages)
