"""Locate or build the real peers that the integration tests run.

The peers are built from official Go modules in groups (tests.peers.peer_groups says what each
group is), by the Go toolchain (tests.peers.go_build). Building takes many minutes on a small
machine, so the binaries are cached outside the repository, under
``$XDG_CACHE_HOME/nodedra/peers/<group>-<source hash>/`` (default ``~/.cache``,
tests.peers.cache). The hash covers the group's Go sources, go.mod, go.sum and build flags, so
changed harness code gets rebuilt and unchanged code is reused.

Binaries can also be supplied instead of built:

* ``NODEDRA_<NAME>`` (``NODEDRA_KUBE_APISERVER``, ... see ``ENV_OVERRIDES``):
  the path of that one binary;
* ``KUBEBUILDER_ASSETS``: a directory in the envtest layout (``etcd``,
  ``kube-apiserver``, ...); whatever it holds is used.

`ensure_binaries` finds or builds them and returns their paths (`PeerBinaries`). Prebuild from
the command line with ``python -m tests.peers.build``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.peers.cache import Log, PeerBuildError, cache_root, locked
from tests.peers.debian import install_debian_packages
from tests.peers.go_build import build
from tests.peers.peer_groups import (
    ENV_OVERRIDES,
    INSTALL_HINT,
    KUBERNETES_PEERS,
    PEERS_DIR,
    SUPPLY_HINT,
    PeerGroup,
    containerd_peer,
    groups_by_peer,
    kubernetes_peer,
    peer_groups,
)

#: How many cache entries of each group to keep.
_KEEP_CACHE_ENTRIES = 3


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
            install_debian_packages(missing, f"running {name}", log, INSTALL_HINT)


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
    group_of = groups_by_peer(groups)
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
        with locked(cache_root() / f".{group.name}.lock", log, group.name):
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
