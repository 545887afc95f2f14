"""Debian's archive, for this machine and for the trees the images are made of.

The test machines are Debian, and what the peers and images need of Debian comes from one
archive: tools missing on this machine are installed with apt-get (`install_debian_packages`:
the tests' own setup installs what they need, so that ``tox`` works on a fresh machine of the
kind CI runs on), and the root filesystems of the images are made by debootstrap of bookworm
(`run_debootstrap`) from the mirror this machine's apt uses (`debian_mirror`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.peers.cache import Log, PeerBuildError
from tests.peers.image_build import (
    DOCKER_HINT,
    OWN_MOUNT_NAMESPACE,
    ImageBuildError,
    run_step,
)

#: The Debian release of the image (the Dockerfile's ``FROM debian:bookworm-slim``).
SUITE = "bookworm"
#: What debian:bookworm-slim is made from: the Essential and required packages, and apt.
VARIANT = "minbase"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
#: Another Debian mirror for the base layer than the one this machine's apt uses.
MIRROR_ENV = "NODEDRA_DEBIAN_MIRROR"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")

_DEBOOTSTRAP_TIMEOUT = 45 * 60


def install_debian_packages(
    packages: Sequence[str],
    purpose: str,
    log: Log,
    hint: str,
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


def _missing_debootstrap() -> list[str]:
    """The Debian packages the base layer's build lacks on this machine."""
    missing = [] if shutil.which("debootstrap") else ["debootstrap"]
    if not KEYRING.is_file():
        missing.append("debian-archive-keyring")
    if not shutil.which("gpgv"):
        missing.append("gpgv")
    return missing


def ensure_debootstrap(log: Log) -> None:
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


def run_debootstrap(
    packages: Sequence[str], rootfs: Path, mirror: str, *, transcript: Path, log: Log, needs: str
) -> None:
    """debootstrap minbase of SUITE with ``packages`` (none: minbase alone) into ``rootfs``;
    ``needs`` ends the hint of its error (what else it needs than the mirror)."""
    # debootstrap rejects an empty --include=.
    include = [f"--include={','.join(packages)}"] if packages else []
    run_step(
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
