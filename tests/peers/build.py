"""Locate or build the real Kubernetes peers that the integration tests run.

The peers are built from the official Go modules pinned in ``tests/peers/go.mod``
(kube-apiserver, kube-scheduler, kube-controller-manager from k8s.io/kubernetes,
an etcd server from go.etcd.io/etcd/server/v3) plus our own small Go programs
(the kubelet DRA harness and the Go reference driver). Building takes many
minutes on a small machine, so the binaries are cached outside the repository,
under ``$XDG_CACHE_HOME/nodedra/peers/<kubernetes version>-<source hash>/``
(default ``~/.cache``). The hash covers every Go source, go.mod and go.sum, so
changed harness code gets rebuilt and unchanged code is reused.

Binaries can also be supplied instead of built:

* ``NODEDRA_ETCD``, ``NODEDRA_KUBE_APISERVER``, ``NODEDRA_KUBE_SCHEDULER``,
  ``NODEDRA_KUBE_CONTROLLER_MANAGER``, ``NODEDRA_KUBELET_HARNESS``,
  ``NODEDRA_GO_DRIVER``: the path of that one binary;
* ``KUBEBUILDER_ASSETS``: a directory in the envtest layout (``etcd``,
  ``kube-apiserver``, ...); whatever it holds is used.

Prebuild from the command line with ``python -m tests.peers.build``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

PEERS_DIR = Path(__file__).resolve().parent

#: What each peer is built from, relative to the Go module in PEERS_DIR.
GO_PACKAGES: dict[str, str] = {
    "etcd": "./cmd/etcd",
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kubelet-harness": "./cmd/kubelet-harness",
    "go-driver": "./cmd/go-driver",
}

#: Environment variable that supplies each peer instead of building it.
ENV_OVERRIDES: dict[str, str] = {
    name: "NODEDRA_" + name.upper().replace("-", "_") for name in GO_PACKAGES
}

#: How many cache entries (one per source hash, ~400 MiB each) to keep.
_KEEP_CACHE_ENTRIES = 3

#: Bump when the way binaries are built changes, so old caches are not reused.
_BUILD_SCHEME = "1"

SUPPLY_HINT = (
    "To supply prebuilt binaries instead, set "
    + ", ".join(ENV_OVERRIDES.values())
    + " to their paths, or KUBEBUILDER_ASSETS to a directory holding etcd and "
    "kube-apiserver (envtest layout). To build, install Go (see tests/peers/go.mod for "
    "the version) with access to the Go module proxy and run `python -m tests.peers.build`."
)


class PeerBuildError(RuntimeError):
    """The peers could neither be found nor built; the message says why and what to do."""


@dataclass(frozen=True)
class PeerBinaries:
    """Paths of the peer executables, by role."""

    etcd: Path
    kube_apiserver: Path
    kube_scheduler: Path
    kube_controller_manager: Path
    kubelet_harness: Path
    go_driver: Path

    @classmethod
    def from_mapping(cls, paths: dict[str, Path]) -> PeerBinaries:
        return cls(**{name.replace("-", "_"): path for name, path in paths.items()})


def kubernetes_version(go_mod: Path = PEERS_DIR / "go.mod") -> str:
    """The k8s.io/kubernetes version that go.mod pins (the single source of truth)."""
    match = re.search(
        r"^\s*(?:require\s+)?k8s\.io/kubernetes\s+(v\S+)", go_mod.read_text(), re.MULTILINE
    )
    if match is None:
        raise PeerBuildError(f"{go_mod} does not require k8s.io/kubernetes")
    return match.group(1)


def _source_files() -> list[Path]:
    files = [PEERS_DIR / "go.mod", PEERS_DIR / "go.sum"]
    files += sorted(p for p in PEERS_DIR.rglob("*.go") if p.is_file())
    return files


def source_hash() -> str:
    """Hash of everything that determines the binaries we build."""
    digest = hashlib.sha256(_BUILD_SCHEME.encode())
    for path in _source_files():
        digest.update(str(path.relative_to(PEERS_DIR)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    digest.update(" ".join(_build_flags(kubernetes_version())).encode())
    return digest.hexdigest()[:16]


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nodedra" / "peers"


def cache_dir() -> Path:
    return cache_root() / f"{kubernetes_version()}-{source_hash()}"


def _build_flags(version: str) -> list[str]:
    """Flags of `go build` that shape the binaries (part of the cache key)."""
    return [
        "-trimpath",
        # Our sources live in the nodedra repository; stamping its VCS state
        # into test binaries only breaks builds in unusual checkouts.
        "-buildvcs=false",
        "-ldflags",
        " ".join(_ldflags(version)),
    ]


def _ldflags(version: str) -> list[str]:
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
    return flags


def _supplied(log: TextIO) -> dict[str, Path]:
    """Binaries named by the environment, checked to exist and be executable."""
    found: dict[str, Path] = {}
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        for name in GO_PACKAGES:
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
            f"cannot build the Kubernetes test peers: no `go` command found on PATH. {SUPPLY_HINT}"
        )
    return go


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialise builds between processes (e.g. parallel test runs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _report_progress(lines: Iterable[str], log: TextIO, transcript: TextIO, started: float) -> None:
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


def build(names: Sequence[str], dest: Path, log: TextIO = sys.stderr) -> None:
    """Build the named peers into dest with the Go toolchain."""
    go = _find_go()
    unknown = [n for n in names if n not in GO_PACKAGES]
    if unknown:
        raise ValueError(f"unknown peers: {unknown}")
    dest.mkdir(parents=True, exist_ok=True)
    version = kubernetes_version()
    env = dict(os.environ)
    env["CGO_ENABLED"] = "0"  # Static, as Kubernetes ships its server binaries.
    transcript_path = dest / "build.log"
    print(
        f"[peers] building {', '.join(names)} (Kubernetes {version}) into {dest}",
        file=log,
        flush=True,
    )
    print(
        "[peers] the first build compiles Kubernetes and takes many minutes;"
        " later runs reuse the cache",
        file=log,
        flush=True,
    )
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix=".build-", dir=dest) as tmp,
        open(transcript_path, "w") as transcript,
    ):
        cmd = [
            go,
            "build",
            "-v",
            *_build_flags(version),
            "-o",
            tmp + "/",
        ]
        cmd += [GO_PACKAGES[n] for n in names]
        transcript.write(" ".join(cmd) + "\n")
        try:
            proc = subprocess.Popen(
                cmd,
                cwd=PEERS_DIR,
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
                f"building the Kubernetes test peers failed (go build exit code {rc}"
                f" after {elapsed:.0f}s; full log: {transcript_path}). Last lines:\n"
                f"{tail}\n{SUPPLY_HINT}"
            )
        for name in names:
            # Rename within the same directory: atomic, so a concurrent
            # reader never sees a partial binary.
            os.replace(Path(tmp) / name, dest / name)
    print(f"[peers] built {', '.join(names)} in {elapsed:.0f}s", file=log, flush=True)


def _prune_cache(keep: Path, log: TextIO) -> None:
    """Drop the oldest cache entries: every change to the harness sources
    makes a new one. The newest few stay, for other checkouts in use."""
    entries = sorted(
        (
            p
            for p in cache_root().iterdir()
            if p.is_dir() and p != keep and not p.name.startswith(".")
        ),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in entries[_KEEP_CACHE_ENTRIES - 1 :]:
        print(f"[peers] removing old cache entry {old}", file=log, flush=True)
        shutil.rmtree(old, ignore_errors=True)


def ensure_binaries(log: TextIO = sys.stderr, names: Sequence[str] | None = None) -> PeerBinaries:
    """Return all peer binaries: supplied ones, cached ones, and otherwise
    freshly built ones. Raises PeerBuildError when that is impossible."""
    wanted = list(GO_PACKAGES) if names is None else list(names)
    paths = _supplied(log)
    missing = [n for n in wanted if n not in paths]
    if missing:
        dest = cache_dir()
        with _locked(cache_root() / ".lock"):
            to_build = [n for n in missing if not (dest / n).is_file()]
            if to_build:
                build(to_build, dest, log)
                _prune_cache(keep=dest, log=log)
            else:
                print(
                    f"[peers] using cached {', '.join(missing)} from {dest}", file=log, flush=True
                )
        for name in missing:
            paths[name] = dest / name
    # Callers that asked for a subset still get a complete PeerBinaries;
    # the entries they did not ask for point where the binary would be.
    for name in GO_PACKAGES:
        paths.setdefault(name, cache_dir() / name)
    return PeerBinaries.from_mapping(paths)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.peers.build",
        description="Build (or find) the Kubernetes peers for nodedra's integration tests"
        " and print their paths.",
    )
    parser.add_argument(
        "names", nargs="*", help=f"peers to build, of {', '.join(GO_PACKAGES)} (default: all)"
    )
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in GO_PACKAGES]
    if unknown:
        parser.error(f"unknown peers {unknown}; choose from {', '.join(GO_PACKAGES)}")
    started = time.monotonic()
    try:
        binaries = ensure_binaries(names=args.names or None)
    except PeerBuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for name in args.names or GO_PACKAGES:
        print(f"{name}={getattr(binaries, name.replace('-', '_'))}")
    print(f"[peers] ready in {time.monotonic() - started:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
