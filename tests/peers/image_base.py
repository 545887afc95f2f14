"""The base of the images: bookworm as debian:bookworm-slim is, and nodedra's image's base layer.

Every image built here starts from ``debootstrap --variant=minbase`` of Debian bookworm (what
debian:bookworm-slim is built from), stripped of what a container needs not (`strip_rootfs`:
apt's lists and caches, documentation but the copyright files, /dev: runtimes mount their own).
nodedra's image (tests.peers.image) adds the packages of ``image/packages.txt`` to it and makes
it its first layer (`ensure_base_layer`). That takes minutes and changes only with
packages.txt, so it is cached under ``tests.peers.cache.cache_root()/image-base-<hash>/`` (the
hash, `base_key`, covers the package list and the way the layer is made) and built under a
lock, once for parallel runs. The Dockerfile's debian:bookworm-slim stand-in
(tests.peers.dockerfile_image) and the VM node's root filesystem (tests.peers.vm_image) are
stripped the same way.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import platform
import re
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.peers.cache import Log, cache_root, locked, prune_cache_entries
from tests.peers.debian import SUITE, VARIANT, debian_mirror, ensure_debootstrap, run_debootstrap
from tests.peers.image_build import DOCKER_HINT, IMAGE_DIR, ImageBuildError, mounts_below
from tests.peers.layers import pack_layer
from tests.peers.oci import Layer

PACKAGES_FILE = IMAGE_DIR / "packages.txt"
#: The image's interpreter: Debian's, which packages.txt installs in the base layer and
#: image/install.sh makes nodedra's venv with.
PYTHON = "/usr/bin/python3.11"

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

#: Bump when the way the base layer is made changes in a way its cache key does not see.
_IMAGE_SCHEME = "1"
#: How many cached base layers to keep (each some 250 MB: the tree and its layer).
_KEEP_BASE_ENTRIES = 2

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


def base_key(packages: Sequence[str]) -> str:
    """The cache key of the base layer: the package list and how the layer is made of it."""
    digest = hashlib.sha256(_IMAGE_SCHEME.encode())
    for part in (SUITE, VARIANT, platform.machine(), *packages, "|", *BASE_STRIP):
        digest.update(part.encode() + b"\0")
    digest.update("|".join((*BASE_EMPTY_FILES, BASE_DOCS)).encode())
    return digest.hexdigest()[:16]


def strip_rootfs(rootfs: Path) -> None:
    """Remove from a debootstrap tree what the image needs not (BASE_STRIP, BASE_EMPTY_FILES,
    BASE_DOCS but the copyright files)."""
    mounted = mounts_below(rootfs)
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
    with locked(cache_root() / ".image-base.lock"):
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
    ensure_debootstrap(log)
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


def _prune_base_entries(keep: Path, log: Log) -> None:
    """Drop the oldest base layers: each change of packages.txt makes a new one."""
    prune_cache_entries("image-base-*", keep, _KEEP_BASE_ENTRIES, log)
