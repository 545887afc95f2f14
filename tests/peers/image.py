"""nodedra's container image, built on this machine without Docker or a registry.

The ``Dockerfile`` at the repository root is how nodedra's image is meant to be built, but the
test machines have no Docker daemon. This module builds the same image from the same recipe,
``image/``: ``packages.txt`` (the Debian bookworm packages of the image) and ``install.sh``
(nodedra's venv at /opt/nodedra, from a directory of wheels). The Dockerfile installs exactly
those (tests/unit/test_image_recipe.py checks it), so an image built here is the Dockerfile's
image, and a test that runs it tests what the DaemonSet runs (tests.peers.dockerfile_image
builds the Dockerfile itself with buildah, and ``tox -e dockerfile`` compares the two images).
The result is an OCI image layout archive (tests.peers.oci) that ``ctr images import`` takes,
in two layers:

1. **base**: ``debootstrap --variant=minbase --include=<packages.txt>`` of bookworm (minbase is
   what debian:bookworm-slim is built from), stripped of what a container needs not (apt's
   lists and caches, documentation but the copyright files, /dev: runtimes mount their own).
   It takes minutes and changes only with packages.txt, so it is cached under
   ``tests.peers.build.cache_root()/image-base-<hash>/`` (the hash covers the package list
   and the way the layer is made) and built under a lock, once for parallel runs.
2. **nodedra**: the wheels of nodedra and its dependencies, built on this machine by pip for
   its platform (CPython 3.11, glibc 2.36 like bookworm's, same architecture), installed by
   ``install.sh`` run with chroot in an overlay over the base root filesystem. The overlay's
   upper directory is exactly what the installation changed; it becomes the second layer
   (whiteouts translated to the OCI ``.wh.`` files), in a few tens of seconds per change of
   nodedra's sources.

Everything the build mounts (the overlay, /dev nodes and /tmp in it, what debootstrap mounts)
lives in a mount namespace of the build's own (``unshare --mount``): the kernel drops those
mounts when the build's processes exit, whatever happened to them.

Building needs root and the network (the Debian mirror for the base, PyPI for the wheels); it
installs debootstrap from Debian's packages itself when run as root on a Debian machine. Every
failure raises `ImageBuildError` saying what is missing and what to do.

Build from the command line (prints the archive's path, size and how long it took)::

    python -m tests.peers.image [--out PATH] [--name NAME]
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import json
import os
import platform
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from nodedra import __version__
from tests.peers.build import Log, PeerBuildError, _locked, cache_root, install_debian_packages
from tests.peers.oci import ImageConfig, Layer, write_layers_archive
from tests.peers.process import tail

REPO_ROOT = Path(__file__).resolve().parents[2]
IMAGE_DIR = REPO_ROOT / "image"
PACKAGES_FILE = IMAGE_DIR / "packages.txt"
INSTALL_SCRIPT = IMAGE_DIR / "install.sh"
DOCKERFILE = REPO_ROOT / "Dockerfile"

#: What nodedra's wheel is built from, relative to the repository root: what the Dockerfile's
#: wheel stage copies (setup.cfg reads README.md as the long description).
SOURCES: tuple[str, ...] = ("pyproject.toml", "setup.cfg", "README.md", "operator", "grpc_gen")

#: The Debian release of the image (the Dockerfile's ``FROM debian:bookworm-slim``).
SUITE = "bookworm"
#: What debian:bookworm-slim is made from: the Essential and required packages, and apt.
VARIANT = "minbase"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
#: Another Debian mirror for the base layer than the one this machine's apt uses.
MIRROR_ENV = "NODEDRA_DEBIAN_MIRROR"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")

#: The image's interpreter (Debian's) and nodedra's venv, as image/install.sh makes them.
PYTHON = "/usr/bin/python3.11"
VENV = "/opt/nodedra"
#: The PATH of debian:bookworm-slim, with the venv first.
IMAGE_PATH = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: What a container of the image runs: the Dockerfile's ENTRYPOINT, CMD, ENV, WORKDIR and USER
#: (the drift test compares them).
IMAGE_CONFIG = ImageConfig(
    entrypoint=("nodedra",),
    cmd=("run",),
    env={"PATH": IMAGE_PATH, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"},
    working_dir="/",
    user="root",
)

#: What the base layer leaves out of debootstrap's tree, relative to its root (glob patterns),
#: as debian:bookworm-slim does: apt's lists and caches, the logs of the installation,
#: documentation and translations, the host's name server and name; /dev, /proc, /sys and
#: /tmp are the runtime's to fill.
BASE_STRIP: tuple[str, ...] = (
    "var/lib/apt/lists/*",
    "var/cache/apt/*.bin",
    "var/cache/apt/archives/*.deb",
    "var/cache/apt/archives/partial/*",
    "var/cache/debconf/*-old",
    "var/cache/ldconfig/aux-cache",
    "var/lib/dpkg/*-old",
    "usr/share/man/*",
    "usr/share/info/*",
    "usr/share/groff/*",
    "usr/share/lintian/*",
    "usr/share/linda/*",
    "usr/share/locale/*",
    "etc/resolv.conf",
    "etc/hostname",
    "dev/*",
    "proc/*",
    "sys/*",
    "tmp/*",
    "debootstrap",
)
#: Directories whose files go, their subdirectories staying (as apt and dpkg expect them).
BASE_EMPTY_FILES: tuple[str, ...] = ("var/log",)
#: Documentation of which only the licenses stay (``usr/share/doc/<package>/copyright``).
BASE_DOCS = "usr/share/doc"

#: The modification time of every entry of the nodedra layer: the layer depends on what was
#: installed, not when (install.sh makes .pyc files that do not depend on timestamps).
NODEDRA_LAYER_MTIME = 0

#: Bump when the way the base layer is made changes in a way its cache key does not see.
_IMAGE_SCHEME = "1"
#: How many cached base layers to keep (each some 250 MB: the tree and its layer).
_KEEP_BASE_ENTRIES = 2

_DEBOOTSTRAP_TIMEOUT = 45 * 60
#: A command prefix: what follows runs in a mount namespace of its own, whose mounts the
#: kernel drops when its processes are gone.
OWN_MOUNT_NAMESPACE = ("unshare", "--mount", "--propagation", "private", "--")
_PIP_TIMEOUT = 20 * 60
_INSTALL_TIMEOUT = 10 * 60

DOCKER_HINT = (
    "With Docker, build the image from the repository root instead: "
    "docker build -t nodedra:<version> ."
)


class ImageBuildError(RuntimeError):
    """nodedra's image could not be built; the message says what is missing and what to do."""


@dataclass(frozen=True)
class NodedraImage:
    """A built image: the archive ``ctr images import`` takes and what it holds."""

    name: str
    """The reference containerd names it by (``docker.io/library/nodedra:0.1.0``)."""
    archive: Path
    digest: str
    """Of the image manifest."""
    size_bytes: int
    """Of the archive (its layers are uncompressed: about what the image takes unpacked)."""
    unpacked_bytes: int
    """Of the regular files of the image's layers."""


#: The image's name as manifests/daemonset.yaml says it (``nodedra:<version>``), normalized
#: as containerd normalizes it.
DEFAULT_NAME = f"docker.io/library/nodedra:{__version__}"

_PACKAGE_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]+")


def read_packages(path: Path = PACKAGES_FILE) -> list[str]:
    """The package names of ``packages.txt``: words, ``#`` to the end of a line a comment (as
    the Dockerfile's ``sed -e 's/#.*//'`` reads it)."""
    names = [word for line in path.read_text().splitlines() for word in line.split("#")[0].split()]
    bad = [n for n in names if not _PACKAGE_NAME.fullmatch(n)]
    if bad:
        raise ImageBuildError(f"{path}: not Debian package names: {bad}")
    if not names:
        raise ImageBuildError(f"{path} names no package")
    return names


def debian_mirror(apt_dir: Path = Path("/etc/apt")) -> str:
    """The Debian mirror this machine's apt gets bookworm from (``$NODEDRA_DEBIAN_MIRROR``
    first, deb.debian.org if apt names none): the one known to be reachable from here."""
    override = os.environ.get(MIRROR_ENV)
    if override:
        return override.rstrip("/")
    for uri, suites in _apt_sources(apt_dir):
        if SUITE in suites and uri.startswith(("http://", "https://")):
            return uri.rstrip("/")
    return DEFAULT_MIRROR


def _apt_sources(apt_dir: Path) -> Iterator[tuple[str, list[str]]]:
    """(URI, suites) of the ``deb`` sources of apt's one-line and deb822 files."""
    lists = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*.list"))]
    for path in lists:
        with contextlib.suppress(OSError):
            for line in path.read_text().splitlines():
                words = re.sub(r"\[[^]]*\]", " ", line.split("#")[0]).split()
                if len(words) >= 3 and words[0] == "deb":
                    yield words[1], [words[2]]
    for path in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        with contextlib.suppress(OSError):
            for stanza in re.split(r"\n\s*\n", path.read_text()):
                fields: dict[str, str] = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line:
                        continue
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.strip()
                if "deb" not in fields.get("types", "").split():
                    continue
                if fields.get("enabled", "yes").lower() == "no":
                    continue
                for uri in fields.get("uris", "").split():
                    yield uri, fields.get("suites", "").split()


def base_key(packages: Sequence[str]) -> str:
    """The cache key of the base layer: the package list and how the layer is made of it."""
    digest = hashlib.sha256(_IMAGE_SCHEME.encode())
    for part in (SUITE, VARIANT, platform.machine(), *packages, "|", *BASE_STRIP):
        digest.update(part.encode() + b"\0")
    digest.update("|".join((*BASE_EMPTY_FILES, BASE_DOCS)).encode())
    return digest.hexdigest()[:16]


# -- running the build's commands -----------------------------------------------------------


def _run(
    argv: Sequence[str],
    transcript: Path,
    log: Log,
    *,
    what: str,
    hint: str,
    timeout: float,
    env: Mapping[str, str] | None = None,
) -> None:
    """Run a long build step with its output in ``transcript`` and a heartbeat on ``log``
    every 30 s (the last line it printed), so minutes of downloading visibly progress; on
    failure raise ImageBuildError with the transcript's tail and ``hint``."""
    started = time.monotonic()
    last = [""]
    with open(transcript, "a") as out:
        out.write("$ " + " ".join(argv) + "\n")
        out.flush()
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                env=dict(env) if env is not None else None,
            )
        except OSError as err:
            raise ImageBuildError(f"{what}: cannot run {argv[0]}: {err}. {hint}") from err
        assert proc.stdout is not None

        def copy(lines: IO[str]) -> None:
            for line in lines:
                out.write(line)
                out.flush()
                if line.strip():
                    last[0] = line.strip()

        reader = threading.Thread(target=copy, args=(proc.stdout,), daemon=True)
        reader.start()
        while True:
            try:
                rc = proc.wait(timeout=30)
                break
            except subprocess.TimeoutExpired:
                elapsed = time.monotonic() - started
                if elapsed > timeout:
                    proc.kill()
                    proc.wait()
                    reader.join(5)
                    raise ImageBuildError(
                        f"{what}: {argv[0]} did not finish in {timeout:.0f}s (log: "
                        f"{transcript}); last lines:\n{tail(transcript, 30)}\n{hint}"
                    ) from None
                print(f"[image] ... {elapsed:.0f}s: {last[0][:150]}", file=log, flush=True)
        reader.join()
    if rc != 0:
        raise ImageBuildError(
            f"{what} failed (exit code {rc} after {time.monotonic() - started:.0f}s; full log: "
            f"{transcript}). Last lines:\n{tail(transcript, 30)}\n{hint}"
        )


def _require_root() -> None:
    if os.geteuid() != 0:
        raise ImageBuildError(
            "building nodedra's image needs root: debootstrap, chroot and the build's mounts "
            f"(overlayfs, tmpfs) do. Run it as root. {DOCKER_HINT}"
        )
    missing = [tool for tool in ("unshare", "mount", "chroot") if shutil.which(tool) is None]
    if missing:
        raise ImageBuildError(
            f"building nodedra's image needs {', '.join(missing)} (util-linux, coreutils) on "
            "PATH; install them"
        )


def _missing_debootstrap() -> list[str]:
    """The Debian packages the base layer's build lacks on this machine."""
    missing = [] if shutil.which("debootstrap") else ["debootstrap"]
    if not KEYRING.is_file():
        missing.append("debian-archive-keyring")
    if not shutil.which("gpgv"):
        missing.append("gpgv")
    return missing


def _ensure_debootstrap(log: Log) -> None:
    """Install debootstrap (and the keys it checks the mirror's signatures with) from Debian's
    packages when missing, as root: the build then works on a fresh CI machine; elsewhere
    fail saying what to install."""
    missing = _missing_debootstrap()
    if missing:
        try:
            install_debian_packages(
                missing, "building the image's base layer", log, "Install them. " + DOCKER_HINT
            )
        except PeerBuildError as err:
            raise ImageBuildError(str(err)) from None
    missing = _missing_debootstrap()
    if missing:
        raise ImageBuildError(
            f"building the image's base layer needs the Debian packages {' '.join(missing)} "
            f"(debootstrap and Debian's archive keys); install them. {DOCKER_HINT}"
        )


# -- layers ------------------------------------------------------------------------------------


def _is_whiteout(st: os.stat_result) -> bool:
    """overlayfs marks a deleted lower file by a character device 0/0 in the upper directory."""
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _is_opaque(path: Path) -> bool:
    """overlayfs marks a directory that hides the lower one's entries (made anew where one
    was deleted) with this xattr."""
    try:
        return os.getxattr(path, "trusted.overlay.opaque", follow_symlinks=False) == b"y"
    except OSError:
        return False


def _walk(root: Path, relative: str = "") -> Iterator[tuple[str, Path]]:
    """Every entry below ``root`` as (path in the layer, path here), sorted, parents first."""
    with os.scandir(root / relative if relative else root) as entries:
        names = sorted(entry.name for entry in entries)
    for name in names:
        rel = f"{relative}/{name}" if relative else name
        path = root / rel
        yield rel, path
        if path.is_dir() and not path.is_symlink():
            yield from _walk(root, rel)


def pack_layer(
    root: Path, out: Path, *, overlay_upper: bool = False, mtime: int | None = None
) -> int:
    """Write the tree at ``root`` as an uncompressed layer tar at ``out``; returns the bytes
    of its regular files (what the layer takes unpacked).

    Entries are sorted; owners are numeric only (a name would be looked up on this machine,
    not in the image); permissions, symlinks and hard links (within the layer) are kept, and
    the modification times too unless ``mtime`` fixes them. Device nodes and sockets are left
    out (runtimes give containers their own /dev). With ``overlay_upper``, ``root`` is the
    upper directory of an overlay, and its whiteouts and opaque directories become the OCI
    ``.wh.<name>`` and ``.wh..wh..opq`` entries.
    """
    content = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for rel, path in _walk(root):
            st = os.lstat(path)
            if overlay_upper and _is_whiteout(st):
                parent, _, name = rel.rpartition("/")
                _add_marker(tar, f"{parent}/.wh.{name}" if parent else f".wh.{name}")
                continue
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) or stat.S_ISSOCK(st.st_mode):
                continue
            info = tar.gettarinfo(str(path), arcname=rel)
            info.uname = info.gname = ""
            if mtime is not None:
                info.mtime = mtime
            if info.isreg():
                content += info.size
                with open(path, "rb") as stream:
                    tar.addfile(info, stream)
            else:
                tar.addfile(info)
            if overlay_upper and info.isdir() and _is_opaque(path):
                _add_marker(tar, f"{rel}/.wh..wh..opq")
    return content


def _add_marker(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.mode = 0o644
    tar.addfile(info)


def _mounts_below(root: Path) -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if Path(point).is_relative_to(root):
            points.append(point)
    return points


def strip_rootfs(rootfs: Path) -> None:
    """Remove from a debootstrap tree what the image needs not (BASE_STRIP, BASE_EMPTY_FILES,
    BASE_DOCS but the copyright files)."""
    mounted = _mounts_below(rootfs)
    if mounted:
        raise ImageBuildError(f"refusing to strip {rootfs}: mounts below it: {mounted}")

    def remove(path: Path) -> None:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()

    for pattern in BASE_STRIP:
        for found in sorted(glob.glob(str(rootfs / pattern))):
            remove(Path(found))
    for directory in BASE_EMPTY_FILES:
        for dirpath, _dirs, files in os.walk(rootfs / directory):
            for name in files:
                (Path(dirpath) / name).unlink()
    docs = rootfs / BASE_DOCS
    if docs.is_dir():
        for entry in sorted(docs.iterdir()):
            if entry.is_symlink() or not entry.is_dir():
                entry.unlink()
                continue
            for inner in sorted(entry.iterdir()):
                if inner.name != "copyright" or inner.is_dir():
                    remove(inner)
            if not any(entry.iterdir()):
                entry.rmdir()


@dataclass(frozen=True)
class BaseLayer:
    """The cached base: its root filesystem (the overlay's lower directory) and its layer."""

    rootfs: Path
    layer: Layer
    unpacked_bytes: int


def ensure_base_layer(log: Log = sys.stderr) -> BaseLayer:
    """The base layer of image/packages.txt: cached, or built now (minutes) under a lock."""
    packages = read_packages()
    entry = cache_root() / f"image-base-{base_key(packages)}"
    with _locked(cache_root() / ".image-base.lock"):
        meta = entry / "layer.json"
        if not meta.is_file():
            if entry.exists():
                print(f"[image] removing the unfinished base layer {entry}", file=log)
                shutil.rmtree(entry)
            _build_base(entry, packages, log)
            _prune_base_entries(keep=entry, log=log)
        else:
            print(f"[image] using the cached base layer {entry}", file=log, flush=True)
        info = json.loads(meta.read_text())
        layer = Layer(entry / "layer.tar", info["digest"], info["size"])
        if not (layer.path.is_file() and layer.path.stat().st_size == layer.size):
            raise ImageBuildError(
                f"the cached base layer {layer.path} is damaged (not {layer.size} bytes); "
                f"remove {entry} and build again"
            )
        return BaseLayer(entry / "rootfs", layer, info["unpacked_bytes"])


def _build_base(entry: Path, packages: Sequence[str], log: Log) -> None:
    _ensure_debootstrap(log)
    mirror = debian_mirror()
    rootfs = entry / "rootfs"
    entry.mkdir(parents=True)
    transcript = entry / "debootstrap.log"
    print(
        f"[image] building the base layer: debootstrap {SUITE} ({VARIANT} + "
        f"{', '.join(packages)}) from {mirror} into {rootfs}; log {transcript}",
        file=log,
        flush=True,
    )
    started = time.monotonic()
    run_debootstrap(
        packages,
        rootfs,
        mirror,
        transcript=transcript,
        log=log,
        needs=f"the packages of {PACKAGES_FILE} to exist in {SUITE}. {DOCKER_HINT}",
    )
    strip_rootfs(rootfs)
    missing = [p for p in (PYTHON, "usr/bin/dpkg") if not (rootfs / p.lstrip("/")).exists()]
    if missing:
        raise ImageBuildError(f"debootstrap's tree {rootfs} lacks {missing}; see {transcript}")
    layer_path = entry / "layer.tar"
    unpacked = pack_layer(rootfs, layer_path)
    layer = Layer.of(layer_path)
    (entry / "layer.json").write_text(
        json.dumps(
            {
                "digest": layer.digest,
                "size": layer.size,
                "unpacked_bytes": unpacked,
                "packages": list(packages),
                "mirror": mirror,
            },
            indent=2,
        )
    )
    print(
        f"[image] base layer ready in {time.monotonic() - started:.0f}s: "
        f"{layer.size / 1e6:.1f} MB ({layer.digest[:19]})",
        file=log,
        flush=True,
    )


def run_debootstrap(
    packages: Sequence[str], rootfs: Path, mirror: str, *, transcript: Path, log: Log, needs: str
) -> None:
    """debootstrap minbase of SUITE with ``packages`` (none: minbase alone) into ``rootfs``;
    ``needs`` ends the hint of its error (what else it needs than the mirror)."""
    # debootstrap rejects an empty --include=.
    include = [f"--include={','.join(packages)}"] if packages else []
    _run(
        [
            # In a mount namespace of its own: what debootstrap mounts in the tree (/proc,
            # /sys) goes away with it, even when it is killed.
            *OWN_MOUNT_NAMESPACE,
            "debootstrap",
            f"--variant={VARIANT}",
            *include,
            f"--keyring={KEYRING}",
            SUITE,
            str(rootfs),
            mirror,
        ],
        transcript,
        log,
        what=f"debootstrap of Debian {SUITE} from {mirror}",
        hint=f"It needs network access to that mirror (set {MIRROR_ENV} to another) and {needs}",
        timeout=_DEBOOTSTRAP_TIMEOUT,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )


def _prune_base_entries(keep: Path, log: Log) -> None:
    """Drop the oldest base layers: each change of packages.txt makes a new one."""
    prune_cache_entries("image-base-*", keep, _KEEP_BASE_ENTRIES, log)


def prune_cache_entries(pattern: str, keep: Path, count: int, log: Log) -> None:
    """Keep ``keep`` and the newest others of the cache entries matching ``pattern``, ``count``
    in all: each change of a recipe makes a new entry of some hundreds of MB."""
    entries = sorted(
        (p for p in cache_root().glob(pattern) if p.is_dir() and p != keep),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in entries[count - 1 :]:
        print(f"[image] removing old cache entry {old}", file=log, flush=True)
        shutil.rmtree(old, ignore_errors=True)


# -- the nodedra layer -----------------------------------------------------------------------


def build_wheels(dest: Path, workdir: Path, log: Log) -> list[Path]:
    """Wheels of nodedra (from a copy of SOURCES: the checkout stays untouched), of its
    dependencies and of pip, made by this interpreter's pip for this machine's platform."""
    if sys.implementation.name != "cpython" or sys.version_info[:2] != (3, 11):
        raise ImageBuildError(
            "the image's wheels must be built by CPython 3.11, the image's Python (the "
            "dependencies' binary wheels are made for one version); this is "
            f"{platform.python_implementation()} {platform.python_version()}. Run it with a "
            "CPython 3.11, e.g. .tox/py311/bin/python -m tests.peers.image"
        )
    source = workdir / "source"
    for name in SOURCES:
        origin = REPO_ROOT / name
        if origin.is_dir():
            shutil.copytree(
                origin,
                source / name,
                symlinks=True,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build"),
            )
        else:
            source.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, source / name)
    dest.mkdir(parents=True, exist_ok=True)
    transcript = workdir / "pip-wheel.log"
    print(f"[image] building the wheels with pip; log {transcript}", file=log, flush=True)
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--disable-pip-version-check",
            "--no-input",
            "--progress-bar",
            "off",
            "--wheel-dir",
            str(dest),
            str(source),
            # install.sh runs pip from its wheel.
            "pip",
        ],
        transcript,
        log,
        what="building nodedra's wheels with pip",
        hint="It needs pip in this Python and network access to PyPI (or to the index that "
        f"PIP_INDEX_URL names). {DOCKER_HINT}",
        timeout=_PIP_TIMEOUT,
    )
    wheels = sorted(dest.glob("*.whl"))
    for wanted in ("nodedra", "pip"):
        if not any(w.name.startswith(f"{wanted}-") for w in wheels):
            raise ImageBuildError(f"pip made no {wanted} wheel in {dest}; see {transcript}")
    return wheels


#: Runs image/install.sh with chroot in an overlay over the base tree, in the mount namespace
#: of `unshare` (so every mount here goes when it exits). The container runtime gives a
#: container its /dev and /tmp; so does this, in tmpfs: neither lands in the upper directory,
#: nor do the wheels and install.sh, which are bound into that /tmp. /proc is not needed.
_CHROOT_INSTALL = r"""
set -eu
lower=$1 upper=$2 work=$3 merged=$4 wheels=$5 script=$6
# Plain copy-up: every changed file whole in the upper directory (no metadata-only copies, no
# redirects), which is what a layer is.
features=redirect_dir=off,metacopy=off,index=off,xino=off
mount -t overlay nodedra-image -o "lowerdir=$lower,upperdir=$upper,workdir=$work,$features" \
    "$merged"
mount -t tmpfs -o mode=0755,nosuid nodedra-image-dev "$merged/dev"
for node in null zero full random urandom; do
    : > "$merged/dev/$node"
    mount --bind "/dev/$node" "$merged/dev/$node"
done
mount -t tmpfs -o mode=1777,nosuid,nodev nodedra-image-tmp "$merged/tmp"
mkdir "$merged/tmp/wheels" "$merged/tmp/image"
mount --bind "$wheels" "$merged/tmp/wheels"
cp "$script" "$merged/tmp/image/install.sh"
exec chroot "$merged" /usr/bin/env -i HOME=/root LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /bin/sh /tmp/image/install.sh /tmp/wheels
"""


def install_nodedra(base: BaseLayer, wheels: Path, workdir: Path, log: Log) -> Path:
    """Run image/install.sh over the base tree; returns the overlay's upper directory: what
    the installation added or changed."""
    upper, work, merged = workdir / "upper", workdir / "work", workdir / "merged"
    for directory in (upper, work, merged):
        directory.mkdir(parents=True)
    for path in (base.rootfs, upper, work):
        if re.search(r"[,:\\\s]", str(path)):
            raise ImageBuildError(
                f"{path} cannot be an overlayfs directory (a comma, colon, backslash or "
                "space in it); set XDG_CACHE_HOME to a plain path"
            )
    transcript = workdir / "install.log"
    print(f"[image] running image/install.sh in the image; log {transcript}", file=log, flush=True)
    _run(
        [
            *OWN_MOUNT_NAMESPACE,
            "sh",
            "-c",
            _CHROOT_INSTALL,
            "install",
            str(base.rootfs),
            str(upper),
            str(work),
            str(merged),
            str(wheels),
            str(INSTALL_SCRIPT),
        ],
        transcript,
        log,
        what=f"installing nodedra in the image ({INSTALL_SCRIPT} with chroot over {base.rootfs})",
        hint="The wheels must suit the image (CPython 3.11, glibc 2.36, this architecture), "
        f"and overlayfs must be available. {DOCKER_HINT}",
        timeout=_INSTALL_TIMEOUT,
    )
    entrypoint = upper / VENV.lstrip("/") / "bin" / "nodedra"
    if not entrypoint.is_file():
        raise ImageBuildError(f"install.sh ran but made no {VENV}/bin/nodedra; see {transcript}")
    return upper


#: The working directories of builds: ``<prefix><pid>-<random>`` in the cache root.
_BUILD_PREFIX = ".image-build-"


def _remove_stale_builds(log: Log, prefix: str = _BUILD_PREFIX) -> None:
    """Remove the working directories (``<prefix><pid>-...``) of builds whose process is gone
    (killed before it could clean up: some 200 MB each, a few GB for buildah's). One with a
    mount below it is left, said on ``log``: removing it would reach into what is mounted."""
    for path in cache_root().glob(f"{prefix}*"):
        match = re.fullmatch(re.escape(prefix) + r"(\d+)-.*", path.name)
        if match is None or not path.is_dir():
            continue
        try:
            os.kill(int(match.group(1)), 0)
            continue  # its build still runs
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        mounted = _mounts_below(path)
        if mounted:
            print(f"[image] leaving {path}: mounts below it: {mounted}", file=log)
            continue
        print(f"[image] removing the working directory of a build that is gone: {path}", file=log)
        shutil.rmtree(path, ignore_errors=True)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def build_nodedra_image(
    name: str = DEFAULT_NAME, log: Log = sys.stderr, out: Path | None = None
) -> NodedraImage:
    """Build nodedra's image as an OCI layout archive at ``out`` (default: in the peers'
    cache, named after ``name``) and return it. Raises ImageBuildError when impossible."""
    _require_root()
    started = time.monotonic()
    archive = out or cache_root() / "images" / f"{_safe(name)}.tar"
    base = ensure_base_layer(log)
    cache_root().mkdir(parents=True, exist_ok=True)
    _remove_stale_builds(log)
    # Beside the cache, not in /tmp: the overlay's upper directory must be on a real
    # filesystem (not tmpfs on every machine), and holds some 200 MB.
    prefix = f"{_BUILD_PREFIX}{os.getpid()}-"
    with tempfile.TemporaryDirectory(prefix=prefix, dir=cache_root()) as tmp:
        workdir = Path(tmp)
        wheels = workdir / "wheels"
        build_wheels(wheels, workdir, log)
        upper = install_nodedra(base, wheels, workdir, log)
        layer_path = workdir / "nodedra-layer.tar"
        unpacked = pack_layer(upper, layer_path, overlay_upper=True, mtime=NODEDRA_LAYER_MTIME)
        layer = Layer.of(layer_path)
        digest = write_layers_archive(name, [base.layer, layer], IMAGE_CONFIG, archive)
    image = NodedraImage(
        name=name,
        archive=archive,
        digest=digest,
        size_bytes=archive.stat().st_size,
        unpacked_bytes=base.unpacked_bytes + unpacked,
    )
    print(
        f"[image] {name} ready in {time.monotonic() - started:.0f}s: {archive} "
        f"({image.size_bytes / 1e6:.1f} MB; base {base.layer.size / 1e6:.1f} MB, nodedra "
        f"{layer.size / 1e6:.1f} MB; manifest {digest})",
        file=log,
        flush=True,
    )
    return image


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.peers.image",
        description="Build nodedra's container image without Docker (as root, with network "
        "access to a Debian mirror and PyPI), as an OCI archive for `ctr images import`.",
    )
    parser.add_argument("--out", type=Path, help="where to write the archive (default: cache)")
    parser.add_argument("--name", default=DEFAULT_NAME, help=f"image name (default {DEFAULT_NAME})")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        image = build_nodedra_image(args.name, out=args.out)
    except ImageBuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(image.archive)
    print(
        f"{image.name}: {image.size_bytes} bytes ({image.unpacked_bytes} unpacked), manifest "
        f"{image.digest}, built in {time.monotonic() - started:.1f}s. Import it on a node with: "
        f"ctr --namespace k8s.io images import {image.archive}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
