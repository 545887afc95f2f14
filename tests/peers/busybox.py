"""The image the samples in manifests/samples/ run: busybox, from Debian's busybox-static.

The samples' pods run ``sh -c "env | grep ^DRA_; cat <metadata file>; sleep 3600"`` in
``busybox:1.35.0``. The test
node pulls nothing, so the image is made here: Debian bookworm's static build of busybox 1.35.0
(the release the tag names), downloaded with ``apt-get download`` (no install on the machine)
and cached, in an image of one layer with the applets the samples use linked to it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
from pathlib import Path

from tests.peers.cache import Log, PeerBuildError, cache_root, locked
from tests.peers.oci import ImageConfig, Layer, write_layers_archive

#: The samples' image (manifests/samples/*.yaml), as containerd names it.
BUSYBOX_IMAGE = "docker.io/library/busybox:1.35.0"
#: Debian's package of that release (bookworm: 1:1.35.0-4).
BUSYBOX_PACKAGE = "busybox-static"
BUSYBOX_VERSION = "1.35.0"
#: The applets the samples' command uses, each a link to /bin/busybox.
APPLETS = ("sh", "env", "grep", "cat", "sleep")


def busybox_binary(log: Log = sys.stderr) -> Path:
    """busybox 1.35.0, static, from Debian's package (downloaded once, then cached)."""
    dest = cache_root() / f"busybox-{BUSYBOX_VERSION}" / "busybox"
    if dest.is_file():
        return dest
    apt = shutil.which("apt-get")
    dpkg_deb = shutil.which("dpkg-deb")
    if apt is None or dpkg_deb is None:
        raise PeerBuildError(
            "the samples' busybox image is made from Debian's busybox-static package, which "
            "takes apt-get and dpkg-deb (a Debian machine)"
        )
    with locked(cache_root() / ".busybox.lock"):
        if dest.is_file():
            return dest
        with tempfile.TemporaryDirectory(prefix="busybox-") as tmp:
            print(f"[peers] downloading Debian's {BUSYBOX_PACKAGE}", file=log, flush=True)
            got = _apt_download(apt, tmp)
            if got.returncode != 0 and os.geteuid() == 0:
                # A fresh machine may not have read the archive's package lists yet.
                subprocess.run([apt, "update", "-qq"], capture_output=True, check=False)
                got = _apt_download(apt, tmp)
            debs = list(Path(tmp).glob(f"{BUSYBOX_PACKAGE}_*.deb"))
            if got.returncode != 0 or len(debs) != 1:
                raise PeerBuildError(
                    f"`apt-get download {BUSYBOX_PACKAGE}` failed (exit {got.returncode}): "
                    f"{got.stderr.strip()[-400:]}; run `apt-get update` first if the package "
                    "is unknown"
                )
            # The file name quotes the epoch's colon: busybox-static_1%3a1.35.0-4..._amd64.deb
            version = urllib.parse.unquote(debs[0].name.split("_")[1])
            if version.split(":")[-1].split("-")[0] != BUSYBOX_VERSION:
                raise PeerBuildError(
                    f"Debian's {BUSYBOX_PACKAGE} is {version}, not busybox {BUSYBOX_VERSION}: "
                    "change BUSYBOX_VERSION and the samples' image tag together"
                )
            root = Path(tmp) / "root"
            subprocess.run([dpkg_deb, "-x", str(debs[0]), str(root)], check=True)
            dest.parent.mkdir(parents=True, exist_ok=True)
            staged = dest.with_suffix(".tmp")
            shutil.copyfile(root / "bin" / "busybox", staged)
            staged.chmod(0o755)
            staged.replace(dest)
    return dest


def _apt_download(apt: str, directory: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [apt, "download", BUSYBOX_PACKAGE],
        cwd=directory,
        capture_output=True,
        text=True,
        check=False,
    )


def busybox_image_archive(directory: Path, log: Log = sys.stderr) -> Path:
    """The samples' image as an OCI archive in ``directory`` (for ``ctr images import``):
    /bin/busybox and the applets the samples run, linked to it."""
    binary = busybox_binary(log)
    directory.mkdir(parents=True, exist_ok=True)
    layer_path = directory / "busybox-layer.tar"
    with tarfile.open(layer_path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in ("bin", "tmp"):
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if name == "tmp" else 0o755
            tar.addfile(info)
        info = tarfile.TarInfo("bin/busybox")
        info.size = binary.stat().st_size
        info.mode = 0o755
        with open(binary, "rb") as stream:
            tar.addfile(info, stream)
        for applet in APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type = tarfile.SYMTYPE
            link.linkname = "busybox"
            link.mode = 0o777
            tar.addfile(link)
    archive = directory / "busybox.tar"
    config = ImageConfig(entrypoint=(), cmd=("sh",), env={"PATH": "/bin"})
    write_layers_archive(BUSYBOX_IMAGE, [Layer.of(layer_path)], config, archive)
    return archive
