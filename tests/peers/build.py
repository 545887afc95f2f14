"""Locate or build the real peers that the integration tests run.

The peers are built from official Go modules in groups, one Go module each (see
:func:`peer_groups`): the Kubernetes group pinned in ``tests/peers/go.mod``
(kube-apiserver, kube-scheduler, kube-controller-manager and the kubelet from
k8s.io/kubernetes, an etcd server from go.etcd.io/etcd/server/v3, plus our own small
Go programs: the kubelet DRA harness and the Go reference driver), and groups of their
own for peers whose dependency pins differ: the NRI runtime harness and Go stub plugin of
``tests/peers/nri`` (one group per version in :data:`NRI_VERSIONS`), containerd (one group
per version in :data:`CONTAINERD_VERSIONS`), runc, and the programs of the test node's
images. Building takes many minutes on a small machine, so the binaries are cached outside
the repository, under
``$XDG_CACHE_HOME/nodedra/peers/<group>-<source hash>/`` (default ``~/.cache``).
The hash covers the group's Go sources, go.mod, go.sum and build flags, so changed
harness code gets rebuilt and unchanged code is reused.

Binaries can also be supplied instead of built:

* ``NODEDRA_<NAME>`` (``NODEDRA_KUBE_APISERVER``, ... see ``ENV_OVERRIDES``):
  the path of that one binary;
* ``KUBEBUILDER_ASSETS``: a directory in the envtest layout (``etcd``,
  ``kube-apiserver``, ...); whatever it holds is used.

Prebuild from the command line with ``python -m tests.peers.build``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TextIO

PEERS_DIR = Path(__file__).resolve().parent


class PeerBuildError(RuntimeError):
    """The peers could neither be found nor built; the message says why and what to do."""


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
)


def _group_of(groups: Sequence[PeerGroup]) -> dict[str, PeerGroup]:
    return {name: group for group in groups for name in group.binaries}


#: Environment variable that supplies each peer instead of building it.
ENV_OVERRIDES: dict[str, str] = {
    name: "NODEDRA_" + re.sub(r"[^A-Z0-9]", "_", name.upper()) for name in _group_of(peer_groups())
}


def peer_names() -> list[str]:
    """The name of every peer, in build order."""
    return list(ENV_OVERRIDES)


#: How many cache entries of each group to keep.
_KEEP_CACHE_ENTRIES = 3

#: Bump when the way binaries are built changes, so old caches are not reused.
_BUILD_SCHEME = "2"

SUPPLY_HINT = (
    "To supply prebuilt binaries instead, set "
    + ", ".join(ENV_OVERRIDES.values())
    + " to their paths, or KUBEBUILDER_ASSETS to a directory holding etcd and "
    "kube-apiserver (envtest layout). To build, install Go (see tests/peers/go.mod for "
    "the version) with access to the Go module proxy and run `python -m tests.peers.build`."
)


class Log(Protocol):
    """Where build progress goes: any text stream."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


@dataclass(frozen=True)
class PeerBinaries:
    """Paths of the peer executables, by name."""

    paths: Mapping[str, Path]

    def __getitem__(self, name: str) -> Path:
        return self.paths[name]

    @property
    def etcd(self) -> Path:
        return self.paths["etcd"]

    @property
    def kube_apiserver(self) -> Path:
        return self.paths["kube-apiserver"]

    @property
    def kube_scheduler(self) -> Path:
        return self.paths["kube-scheduler"]

    @property
    def kube_controller_manager(self) -> Path:
        return self.paths["kube-controller-manager"]

    @property
    def kubelet_harness(self) -> Path:
        return self.paths["kubelet-harness"]

    @property
    def go_driver(self) -> Path:
        return self.paths["go-driver"]

    def nri_runtime(self, version: str) -> Path:
        """The NRI runtime-side harness (pkg/adaptation) at NRI ``version``."""
        return self.paths[f"nri-runtime-{version}"]

    def nri_stub_plugin(self, version: str) -> Path:
        """The Go pinning plugin on pkg/stub at NRI ``version``."""
        return self.paths[f"nri-stub-plugin-{version}"]

    @property
    def kubelet(self) -> Path:
        return self.paths["kubelet"]

    @property
    def runc(self) -> Path:
        return self.paths["runc"]

    @property
    def pause(self) -> Path:
        return self.paths["pause"]

    @property
    def workload(self) -> Path:
        return self.paths["workload"]

    @property
    def kube_proxy(self) -> Path:
        return self.paths["kube-proxy"]

    @property
    def kubectl(self) -> Path:
        return self.paths["kubectl"]

    @property
    def helm(self) -> Path:
        return self.paths["helm"]

    def for_kubernetes(self, version: str) -> PeerBinaries:
        """These binaries with the Kubernetes peers of ``version`` under their plain names
        (``kube-apiserver`` is then ``kube-apiserver-<version>``)."""
        rebound = {name: self.paths[kubernetes_peer(name, version)] for name in KUBERNETES_PEERS}
        return PeerBinaries({**self.paths, **rebound})

    def containerd(self, version: str, command: str = "containerd") -> Path:
        """A containerd binary (``containerd``, ``containerd-shim-runc-v2``, ``ctr``) of
        ``version`` (one of CONTAINERD_VERSIONS)."""
        return self.paths[containerd_peer(command, version)]


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nodedra" / "peers"


def _supplied(log: Log) -> dict[str, Path]:
    """Binaries named by the environment, checked to exist and be executable."""
    found: dict[str, Path] = {}
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        for name in ENV_OVERRIDES:
            candidate = Path(assets) / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                found[name] = candidate
        print(
            f"[peers] KUBEBUILDER_ASSETS={assets} supplies: {', '.join(found) or 'nothing'}",
            file=log,
        )
    for name, var in ENV_OVERRIDES.items():
        value = os.environ.get(var)
        if not value:
            continue
        path = Path(value)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise PeerBuildError(f"{var}={value} is not an executable file. {SUPPLY_HINT}")
        found[name] = path
    return found


def _find_go() -> str:
    go = shutil.which("go")
    if go is None:
        for candidate in (
            "/usr/local/go/bin/go",
            str(Path.home() / "go" / "bin" / "go"),
            "/usr/lib/go/bin/go",
        ):
            if os.access(candidate, os.X_OK):
                go = candidate
                break
    if go is None:
        raise PeerBuildError(
            f"cannot build the test peers: no `go` command found on PATH. {SUPPLY_HINT}"
        )
    return go


@contextlib.contextmanager
def _locked(path: Path, log: Log | None = None, what: str = "") -> Iterator[None]:
    """Serialise builds between processes (e.g. parallel test runs, or a build started in
    the background); says on ``log`` that it waits when another process holds the lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if log is not None:
                print(f"[peers] waiting for another process building {what}", file=log, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _report_progress(lines: Iterable[str], log: Log, transcript: TextIO, started: float) -> None:
    """Copy `go build -v` output to the transcript and print a heartbeat,
    so a build of many minutes visibly makes progress."""
    compiled = 0
    last_report = started
    last_line = ""
    for line in lines:
        transcript.write(line)
        last_line = line.strip()
        if last_line and " " not in last_line:
            compiled += 1  # `go build -v` prints one package path per line
        else:
            print(f"[peers] {last_line}", file=log, flush=True)
        now = time.monotonic()
        if now - last_report >= 30:
            print(
                f"[peers] ... {now - started:.0f}s, {compiled} packages compiled"
                f" (last: {last_line})",
                file=log,
                flush=True,
            )
            last_report = now


def _cgo_missing(group: PeerGroup, env: Mapping[str, str]) -> list[str]:
    """The Debian packages a cgo build of ``group`` (or its C programs) lacks here."""
    missing = [] if shutil.which(env.get("CC") or "gcc") else ["gcc", "libc6-dev"]
    if not group.cgo:
        return missing
    if not shutil.which("pkg-config"):
        missing.append("pkg-config")
    for library in group.c_libraries:
        found = shutil.which("pkg-config") and (
            subprocess.run(["pkg-config", "--exists", library], check=False).returncode == 0
        )
        if not found:
            missing.append(f"{library}-dev")
    return missing


def install_debian_packages(
    packages: Sequence[str],
    purpose: str,
    log: Log,
    hint: str = "Install them, or supply the binaries. " + SUPPLY_HINT,
) -> None:
    """Install ``packages`` from Debian's archive with apt-get, as root; without root or
    apt-get, or when the install fails, raise PeerBuildError saying what to install.

    The tests' own setup installs what they need, so that ``tox`` works on a fresh machine
    of the kind CI runs on; elsewhere the message says what to install.
    """
    apt = shutil.which("apt-get")
    if os.geteuid() != 0 or apt is None:
        raise PeerBuildError(
            f"{purpose} needs the Debian packages {' '.join(packages)} (or their equivalents). "
            + hint
        )
    print(f"[peers] installing {' '.join(packages)} (Debian) for {purpose}", file=log)
    quiet = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        [apt, "update", "-qq"],
        [apt, "install", "-qq", "-y", "--no-install-recommends", *packages],
    ):
        done = subprocess.run(argv, env=quiet, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise PeerBuildError(
                f"cannot install {' '.join(packages)} for {purpose}: {' '.join(argv)} "
                f"failed: {done.stderr.strip()[-500:]}. " + hint
            )


def _ensure_cgo(group: PeerGroup, names: Sequence[str], env: Mapping[str, str], log: Log) -> None:
    """Install what a cgo build lacks from Debian's packages, or fail saying what."""
    missing = _cgo_missing(group, env)
    if missing:
        install_debian_packages(missing, f"building {', '.join(names)} ({group.name})", log)
    missing = _cgo_missing(group, env)
    if missing:
        raise PeerBuildError(
            f"cannot build {', '.join(names)} ({group.name}): the cgo build needs the Debian "
            f"packages {' '.join(missing)} (or their equivalents). Install them, or supply "
            f"the binaries. {SUPPLY_HINT}"
        )


#: Programs of the machine a peer runs (command -> Debian package), installed with it.
RUNTIME_TOOLS: Mapping[str, Mapping[str, str]] = {
    # kube-proxy's nftables mode programs the rules with the nft command.
    "kube-proxy": {"nft": "nftables"},
    # CRI-O runs each container under conmon (Debian's, as most distributions ship it).
    "crio": {"conmon": "conmon"},
}


def _ensure_runtime_tools(names: Iterable[str], log: Log) -> None:
    for name in names:
        tools = RUNTIME_TOOLS.get(name, {})
        missing = sorted({pkg for cmd, pkg in tools.items() if shutil.which(cmd) is None})
        if missing:
            install_debian_packages(missing, f"running {name}", log)


def _build_c_programs(
    go: str, group: PeerGroup, names: Sequence[str], dest: Path, *, env: Mapping[str, str], log: Log
) -> None:
    """Compile the C programs ``names`` of ``group`` from the sources of the module that
    ``group``'s go.mod pins (downloaded first, as a Go build would)."""
    for name in names:
        module, directory = group.c_programs[name]
        modfile = [f"-modfile={group.modfile}"] if group.modfile else []
        found = subprocess.run(
            [go, "mod", "download", "-json", *modfile, module],
            cwd=group.module,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        try:
            sources = Path(json.loads(found.stdout)["Dir"]) / directory
        except (ValueError, KeyError) as err:
            raise PeerBuildError(
                f"cannot find the sources of {name} in {module}: `go mod download` said "
                f"{(found.stderr or found.stdout).strip()[-500:]} ({err}). {SUPPLY_HINT}"
            ) from None
        files = sorted(str(p) for p in sources.glob("*.c"))
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=".build-", dir=dest) as tmp:
            cc = env.get("CC") or "gcc"
            argv = [cc, "-std=c99", "-Os", "-Wall", "-Wextra", "-static", *files, "-o"]
            done = subprocess.run(
                [*argv, f"{tmp}/{name}"], env=env, capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                raise PeerBuildError(
                    f"compiling {name} from {sources} failed: {done.stderr.strip()[-1500:]}. "
                    + SUPPLY_HINT
                )
            os.replace(f"{tmp}/{name}", dest / name)
        print(f"[peers] built {name} in {time.monotonic() - started:.0f}s", file=log, flush=True)


def build(group: PeerGroup, names: Sequence[str], dest: Path, log: Log = sys.stderr) -> None:
    """Build the named peers of ``group`` into ``dest`` with the Go toolchain."""
    go = _find_go()
    unknown = [n for n in names if n not in group.binaries]
    if unknown:
        raise ValueError(f"unknown peers of {group.name}: {unknown}")
    env = dict(os.environ)
    env["CGO_ENABLED"] = "1" if group.cgo else "0"  # static where it can be
    c_names = [n for n in names if n in group.c_programs]
    names = [n for n in names if n in group.packages]
    if group.cgo or c_names:
        _ensure_cgo(group, [*names, *c_names], env, log)
    dest.mkdir(parents=True, exist_ok=True)
    if c_names:
        _build_c_programs(go, group, c_names, dest, env=env, log=log)
    if not names:
        return
    transcript_path = dest / "build.log"
    print(f"[peers] building {', '.join(names)} ({group.name}) into {dest}", file=log, flush=True)
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix=".build-", dir=dest) as tmp,
        open(transcript_path, "w") as transcript,
    ):
        cmd = [go, "build", "-v", *group.build_flags(), "-o", tmp + "/"]
        cmd += [group.packages[n] for n in names]
        transcript.write(" ".join(cmd) + "\n")
        try:
            proc = subprocess.Popen(
                cmd,
                cwd=group.module,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        except OSError as err:
            raise PeerBuildError(f"cannot run {go}: {err}. {SUPPLY_HINT}") from err
        assert proc.stdout is not None
        # Read in a thread so that the heartbeat is independent of how the
        # output is buffered.
        reader = threading.Thread(
            target=_report_progress, args=(proc.stdout, log, transcript, started), daemon=True
        )
        reader.start()
        rc = proc.wait()
        reader.join()
        elapsed = time.monotonic() - started
        if rc != 0:
            transcript.flush()
            tail = "".join(transcript_path.read_text().splitlines(keepends=True)[-30:])
            raise PeerBuildError(
                f"building the test peers {', '.join(names)} failed (go build exit code {rc}"
                f" after {elapsed:.0f}s; full log: {transcript_path}). Last lines:\n"
                f"{tail}\n{SUPPLY_HINT}"
            )
        for name in names:
            # `go build -o dir/` names each binary after its package's last element. Rename
            # within the same directory: atomic, so a concurrent reader never sees a partial
            # binary.
            os.replace(Path(tmp) / Path(group.packages[name]).name, dest / name)
    print(f"[peers] built {', '.join(names)} in {elapsed:.0f}s", file=log, flush=True)


def _prune_cache(group: PeerGroup, keep: Path, log: Log) -> None:
    """Drop the oldest cache entries of ``group``: every change to its sources makes a
    new one. The newest few stay, for other checkouts in use."""
    entries = sorted(
        (
            p
            for p in cache_root().glob(f"{group.name}-*")
            if p.is_dir() and p != keep and re.fullmatch(r"[0-9a-f]{16}", p.name[-16:])
        ),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in entries[_KEEP_CACHE_ENTRIES - 1 :]:
        print(f"[peers] removing old cache entry {old}", file=log, flush=True)
        shutil.rmtree(old, ignore_errors=True)


def ensure_binaries(log: Log = sys.stderr, names: Sequence[str] | None = None) -> PeerBinaries:
    """Return the peer binaries: supplied ones, cached ones, and otherwise freshly built
    ones (all peers, or ``names``). Raises PeerBuildError when that is impossible."""
    groups = peer_groups()
    group_of = _group_of(groups)
    wanted = list(group_of) if names is None else list(names)
    unknown = [n for n in wanted if n not in group_of]
    if unknown:
        raise PeerBuildError(f"unknown peers {unknown}; known: {', '.join(group_of)}")
    paths = _supplied(log)
    _ensure_runtime_tools(wanted, log)
    for group in groups:
        missing = [n for n in wanted if n not in paths and group_of[n] is group]
        if not missing:
            continue
        dest = group.cache_dir()
        with _locked(cache_root() / f".{group.name}.lock", log, group.name):
            to_build = [n for n in missing if not (dest / n).is_file()]
            if to_build:
                build(group, to_build, dest, log)
                _prune_cache(group, keep=dest, log=log)
            else:
                print(
                    f"[peers] using cached {', '.join(missing)} from {dest}", file=log, flush=True
                )
        for name in missing:
            paths[name] = dest / name
    # Callers that asked for a subset still get every name; the entries they did not ask
    # for point where the binary would be.
    for name, group in group_of.items():
        paths.setdefault(name, group.cache_dir() / name)
    return PeerBinaries(paths)


def release_peers(version: str) -> list[str]:
    """The peers built at Kubernetes ``version`` (its group's)."""
    return list(_kubernetes_group(version).packages)


def build_in_background(names: Sequence[str], log_path: Path) -> Callable[[], None]:
    """Start a process that builds ``names`` at the lowest CPU priority, its output in
    ``log_path``, once the returned function is called (or this process ends).

    A test run that will need more peers later (tox's compat environment after py311)
    builds them while its own tests leave the CPUs mostly idle, and says when that is: the
    process waits for the end of its standard input, which stays open until then. It is
    started at once, though, while the test run still has the machine's network (the build
    downloads modules). Whoever needs the peers next finds them cached, or waits on the
    group's lock while the build finishes; the process outlives the test run.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as out:
        process = subprocess.Popen(
            ["nice", "-n", "19", sys.executable, "-m", "tests.peers.build", "--when-told", *names],
            cwd=PEERS_DIR.parent.parent,
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    assert process.stdin is not None
    return process.stdin.close


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.peers.build",
        description="Build (or find) the peers (Kubernetes, NRI) for nodedra's integration tests"
        " and print their paths.",
    )
    parser.add_argument(
        "names", nargs="*", help=f"peers to build, of {', '.join(ENV_OVERRIDES)} (default: all)"
    )
    parser.add_argument(
        "--when-told",
        action="store_true",
        help="build once standard input ends (a test run holds it open until it can spare the"
        " CPUs)",
    )
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in ENV_OVERRIDES]
    if unknown:
        parser.error(f"unknown peers {unknown}; choose from {', '.join(ENV_OVERRIDES)}")
    if args.when_told:
        sys.stdin.buffer.read()
    started = time.monotonic()
    try:
        binaries = ensure_binaries(names=args.names or None)
    except PeerBuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for name in args.names or ENV_OVERRIDES:
        print(f"{name}={binaries[name]}")
    print(f"[peers] ready in {time.monotonic() - started:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
