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

1. **base**: ``debootstrap --variant=minbase --include=<packages.txt>`` of bookworm, stripped
   as debian:bookworm-slim is, cached (tests.peers.image_base).
2. **nodedra**: the wheels of nodedra and its dependencies, built on this machine by pip for
   its platform (CPython 3.11, glibc 2.36 like bookworm's, same architecture), installed by
   ``install.sh`` run with chroot in an overlay over the base root filesystem. The overlay's
   upper directory is exactly what the installation changed; it becomes the second layer
   (whiteouts translated to the OCI ``.wh.`` files), in a few tens of seconds per change of
   nodedra's sources.

Everything the build mounts (the overlay, /dev nodes and /tmp in it, what debootstrap mounts)
lives in a mount namespace of the build's own (``unshare --mount``, tests.peers.image_build): the
kernel drops those mounts when the build's processes exit, whatever happened to them.

Building needs root and the network (the Debian mirror for the base, PyPI for the wheels); it
installs debootstrap from Debian's packages itself when run as root on a Debian machine. Every
failure raises `ImageBuildError` saying what is missing and what to do.

Build from the command line (prints the archive's path, size and how long it took)::

    python -m tests.peers.image [--out PATH] [--name NAME]
"""

from __future__ import annotations

import argparse
import platform
import re
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from nodedra import __version__
from tests.peers.cache import Log, cache_root
from tests.peers.image_base import BaseLayer, ensure_base_layer
from tests.peers.image_build import (
    DOCKER_HINT,
    IMAGE_DIR,
    OWN_MOUNT_NAMESPACE,
    REPO_ROOT,
    ImageBuildError,
    NodedraImage,
    build_workdir,
    require_root,
    run_image_command,
    run_step,
)
from tests.peers.layers import pack_layer
from tests.peers.oci import ImageConfig, Layer, write_layers_archive

INSTALL_SCRIPT = IMAGE_DIR / "install.sh"
DOCKERFILE = REPO_ROOT / "Dockerfile"

#: What nodedra's wheel is built from, relative to the repository root: what the Dockerfile's
#: wheel stage copies (setup.cfg reads README.md as the long description; the wheel carries
#: LICENSE).
SOURCES: tuple[str, ...] = (
    "pyproject.toml",
    "setup.cfg",
    "README.md",
    "LICENSE",
    "operator",
    "grpc_gen",
)

#: nodedra's venv, as image/install.sh makes it.
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

#: The modification time of every entry of the nodedra layer: the layer depends on what was
#: installed, not when (install.sh makes .pyc files that do not depend on timestamps).
NODEDRA_LAYER_MTIME = 0

_PIP_TIMEOUT = 20 * 60
_INSTALL_TIMEOUT = 10 * 60

#: The image's name as manifests/daemonset.yaml says it (``nodedra:<version>``), normalized
#: as containerd normalizes it.
DEFAULT_NAME = f"docker.io/library/nodedra:{__version__}"


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
    run_step(
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
    run_step(
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


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def build_nodedra_image(
    name: str = DEFAULT_NAME, log: Log = sys.stderr, out: Path | None = None
) -> NodedraImage:
    """Build nodedra's image as an OCI layout archive at ``out`` (default: in the peers'
    cache, named after ``name``) and return it. Raises ImageBuildError when impossible."""
    require_root()
    started = time.monotonic()
    archive = out or cache_root() / "images" / f"{_safe(name)}.tar"
    base = ensure_base_layer(log)
    with build_workdir(_BUILD_PREFIX, log) as workdir:
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
    return run_image_command(lambda: (build_nodedra_image(args.name, out=args.out), "built", ()))


if __name__ == "__main__":
    sys.exit(main())
