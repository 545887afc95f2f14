"""nodedra's image built from the repository's own ``Dockerfile``, by buildah, without Docker.

tests.peers.image builds the image from image/ with debootstrap and chroot, and
tests/unit/test_image_recipe.py checks that the Dockerfile's text installs that same recipe.
This module runs the Dockerfile itself, as an admin's ``docker build -t nodedra:<version> .``
would: ``buildah bud`` (Debian bookworm's buildah 1.28, which needs no daemon) of the
repository root with its ``Dockerfile`` and ``.dockerignore`` unchanged, with chroot
isolation, the vfs storage driver (no overlay or FUSE mounts) and a storage of its own in a
working directory under ``tests.peers.cache.cache_root()`` (never /var/lib/containers),
removed after the build. The result is an OCI archive (``buildah push ...
oci-archive:<path>:docker.io/library/nodedra:<version>``) that ``ctr images import`` takes and
names as manifests/daemonset.yaml names the image. tests/integration/test_dockerfile.py
compares it with tests.peers.image's image and runs it as the DaemonSet's (``tox -e
dockerfile``: a cold build takes minutes, so it is not part of the default run).

The base images
---------------
This machine reaches no container registry, so the Dockerfile's two ``FROM`` images are made
here and stored under the Dockerfile's own names; the build never pulls (``--pull=never``):

``debian:bookworm-slim``
    ``debootstrap --variant=minbase`` of bookworm (the official image is minbase too, made with
    debuerreotype), stripped as tests.peers.image_base strips a base (``strip_rootfs``), with
    the official image's dpkg and apt configuration (`DEBIAN_FILES`: what apt installs later
    leaves documentation, manuals and translations out too, and no package cache behind), PATH
    and CMD.
    One layer, with a history entry (buildah refuses to build on an image whose history lists
    fewer layers than it has). Its apt sources are what debootstrap writes: bookworm from the
    Debian mirror this machine's apt uses (``debian_mirror``), the archive tests.peers.image's
    base layer comes from. The official image lists bookworm-updates and bookworm-security too;
    they are left out on purpose, so that both builds install from one archive and a difference
    between their packages is the Dockerfile's doing, not the archive's.
``python:3.11-slim-bookworm``
    That debian:bookworm-slim with Debian's python3 and python3-pip (`PYTHON_CONTAINERFILE`,
    built by buildah too) and the official image's PATH, LANG and CMD. It stands in for the
    official image with a difference: that one has a CPython 3.11 of its own build in
    /usr/local, this one Debian's CPython 3.11 in /usr (and Debian's older pip). The
    Dockerfile's wheels stage only runs ``pip wheel`` there, and the wheels pip picks or
    makes depend on the interpreter's tags, not on who built it: the same CPython minor
    version (cp311 wheels), the same C library (bookworm's glibc 2.36, so the same
    manylinux wheels) and the same architecture give the same binary wheels, and nodedra's
    own wheel is pure Python. tests/integration/test_dockerfile.py checks that the venv the
    wheels make is the one tests.peers.image makes. It also trusts the certificate
    authorities this machine's admin added (``/usr/local/share/ca-certificates``), as this
    machine's pip does: where the network intercepts TLS (this one does), pip reaches PyPI
    only so; those never reach nodedra's image, which only gets the wheels.

Caching
-------
Three entries in the cache, each built under one lock (``locked``), so parallel runs build
once; each build step prints how long it took:

* ``dockerfile-debian-<key>/``: the debian:bookworm-slim archive; the key covers how it is
  made (tests.peers.image_base's ``base_key`` of minbase, `DEBIAN_FILES`).
* ``dockerfile-python-<key>/``: the python:3.11-slim-bookworm archive; its key is the debian
  one's, `PYTHON_CONTAINERFILE` and the added certificate authorities.
* ``dockerfile-image-<key>/``: nodedra's image; the key covers the python one's, the
  Dockerfile, .dockerignore, image/, what the wheels are built from (``SOURCES``), and the
  versions pip resolves now for nodedra's requirements (a few seconds against PyPI): a new
  release of a dependency makes a new image, as it makes tests.peers.image's (built anew in
  each session) differ.

Building needs root and the network (the Debian mirror, PyPI); it installs buildah and
debootstrap from Debian's packages itself when run as root on a Debian machine. Failures raise
`DockerfileBuildError` (an ImageBuildError) saying what failed and where its log is.

From the command line (prints the archive's path and how long each step took)::

    python -m tests.peers.dockerfile_image [--rebuild]
"""

from __future__ import annotations

import argparse
import configparser
import contextlib
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from nodedra import __version__
from tests.peers.cache import Log, PeerBuildError, cache_root, locked, prune_cache_entries
from tests.peers.debian import (
    debian_mirror,
    ensure_debootstrap,
    install_debian_packages,
    run_debootstrap,
)
from tests.peers.image import DEFAULT_NAME, DOCKERFILE, SOURCES
from tests.peers.image_base import base_key, strip_rootfs
from tests.peers.image_build import (
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

#: The Dockerfile's FROM images, as buildah normalizes their short names.
DEBIAN_NAME = "docker.io/library/debian:bookworm-slim"
PYTHON_NAME = "docker.io/library/python:3.11-slim-bookworm"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"
SETUP_CFG = REPO_ROOT / "setup.cfg"

#: debian:bookworm-slim's PATH and CMD.
DEBIAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEBIAN_CONFIG = ImageConfig(entrypoint=(), cmd=("bash",), env={"PATH": DEBIAN_PATH})

#: What the official image adds to debootstrap's tree (debuerreotype's minimizing and slim
#: configuration), by path in the image: dpkg leaves out of what apt installs later the
#: documentation, manuals and translations that the strip of the base removed, and skips
#: fsync; apt removes the packages it downloaded and keeps no binary caches (neither
#: lands in a layer); no service starts during an installation. The Dockerfile's
#: ``apt-get install`` runs with these, as on the official image.
DEBIAN_FILES: dict[str, tuple[int, str]] = {
    "etc/dpkg/dpkg.cfg.d/docker": (
        0o644,
        "# The slim variant: what containers need not is left out of every package.\n"
        "path-exclude /usr/share/doc/*\n"
        "path-exclude /usr/share/groff/*\n"
        "path-exclude /usr/share/info/*\n"
        "path-exclude /usr/share/linda/*\n"
        "path-exclude /usr/share/lintian/overrides/*\n"
        "path-exclude /usr/share/locale/*\n"
        "path-exclude /usr/share/man/*\n"
        "path-include /usr/share/doc/*/copyright\n"
        "path-include /usr/share/locale/locale.alias\n",
    ),
    "etc/dpkg/dpkg.cfg.d/docker-apt-speedup": (0o644, "force-unsafe-io\n"),
    "etc/apt/apt.conf.d/docker-clean": (
        0o644,
        'DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb '
        '/var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };\n'
        'APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb '
        '/var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };\n'
        'Dir::Cache::pkgcache "";\n'
        'Dir::Cache::srcpkgcache "";\n',
    ),
    "etc/apt/apt.conf.d/docker-autoremove-suggests": (
        0o644,
        'Apt::AutoRemove::SuggestsImportant "false";\n',
    ),
    "etc/apt/apt.conf.d/docker-gzip-indexes": (0o644, 'Acquire::GzipIndexes "true";\n'),
    "etc/apt/apt.conf.d/docker-no-languages": (0o644, 'Acquire::Languages "none";\n'),
    "usr/sbin/policy-rc.d": (
        0o755,
        "#!/bin/sh\n# No service starts in an image build.\nexit 101\n",
    ),
}

#: Where a Debian machine's admin puts the certificate authorities it trusts beyond Debian's.
LOCAL_CA_DIR = Path("/usr/local/share/ca-certificates")
#: The stand-in for python:3.11-slim-bookworm (see the module): Debian's CPython 3.11 and pip,
#: with the official image's PATH (/usr/local/bin first), LANG and CMD. It trusts the
#: certificate authorities this machine's admin added (the build context's local-ca/, from
#: LOCAL_CA_DIR), as the machine's own pip does: where the network intercepts TLS, pip
#: reaches PyPI only so. Only the wheels stage runs on it: nodedra's image never holds them.
PYTHON_CONTAINERFILE = f"""\
FROM {DEBIAN_NAME}
RUN apt-get update \\
    && apt-get install -y --no-install-recommends python3 python3-pip \\
    && rm -rf /var/lib/apt/lists/*
RUN --mount=type=bind,source=local-ca,target=/local-ca \\
    find /local-ca -name '*.crt' -exec cp {{}} /usr/local/share/ca-certificates/ ';' \\
    && update-ca-certificates
ENV PATH=/usr/local/bin:{DEBIAN_PATH} \\
    LANG=C.UTF-8
CMD ["python3"]
"""

#: Bump when the way an entry is made changes in a way its key does not see.
_SCHEME = "1"
#: How many entries of each kind to keep (an image's archive is some 300 MB).
_KEEP_ENTRIES = 2
#: The working directories of builds (buildah's storage: a few GB with vfs).
_BUILD_PREFIX = ".dockerfile-build-"

_BUD_TIMEOUT = 30 * 60
_COPY_TIMEOUT = 10 * 60
_RESOLVE_TIMEOUT = 5 * 60

HINT = (
    "The build runs buildah (Debian's package) as root with chroot isolation and the vfs "
    "storage driver, and needs the Debian mirror and PyPI; the log names what failed."
)


class DockerfileBuildError(ImageBuildError):
    """The Dockerfile could not be built; the message says what failed and where its log is."""


@dataclass(frozen=True)
class Step:
    """One timed step of a build, for the summary."""

    what: str
    seconds: float


class _Timer:
    """Times a build's steps and prints each as it ends."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.steps: list[Step] = []

    @contextlib.contextmanager
    def step(self, what: str) -> Iterator[None]:
        print(f"[dockerfile] {what} ...", file=self.log, flush=True)
        started = time.monotonic()
        yield
        seconds = time.monotonic() - started
        self.steps.append(Step(what, seconds))
        print(f"[dockerfile] {what}: {seconds:.1f}s", file=self.log, flush=True)


# -- cache keys --------------------------------------------------------------------------------


def _digest(*parts: str | bytes) -> hashlib._Hash:
    digest = hashlib.sha256(_SCHEME.encode())
    for part in parts:
        digest.update((part.encode() if isinstance(part, str) else part) + b"\0")
    return digest


def debian_key() -> str:
    """The key of the debian:bookworm-slim stand-in: minbase as tests.peers.image_base makes
    a base layer (its key with no package), and the files added to it."""
    files = [
        part
        for path, (mode, text) in sorted(DEBIAN_FILES.items())
        for part in (path, oct(mode), text)
    ]
    return _digest("debian", base_key(()), *files).hexdigest()[:16]


def local_cas(directory: Path = LOCAL_CA_DIR) -> list[Path]:
    """The certificate authorities this machine's admin added (``*.crt``, as Debian's
    update-ca-certificates reads them)."""
    return sorted(directory.glob("*.crt")) if directory.is_dir() else []


def python_key() -> str:
    """The key of the python:3.11-slim-bookworm stand-in: the debian one's, its recipe and the
    certificate authorities it is given."""
    cas = [part for ca in local_cas() for part in (ca.name, ca.read_bytes())]
    return _digest("python", debian_key(), PYTHON_CONTAINERFILE, *cas).hexdigest()[:16]


def _ignored(relative: Path) -> bool:
    """What neither build reads from the sources: byte code, egg-info, build directories."""
    return any(
        part in ("__pycache__", "build") or part.endswith((".egg-info", ".pyc"))
        for part in relative.parts
    )


def _hash_tree(digest: hashlib._Hash, names: Sequence[str]) -> None:
    """Add the files below the repository's ``names`` to ``digest``: paths, contents, and the
    targets of symbolic links (not followed)."""
    for name in names:
        root = REPO_ROOT / name
        paths = [root]
        if root.is_dir() and not root.is_symlink():
            paths = []
            for directory, dirs, files in os.walk(root):
                dirs.sort()
                paths += [Path(directory) / f for f in sorted(files)]
                # Links to directories are entries too (os.walk does not enter them).
                paths += [Path(directory) / d for d in dirs if (Path(directory) / d).is_symlink()]
        for path in paths:
            relative = path.relative_to(REPO_ROOT)
            if _ignored(relative):
                continue
            content = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
            digest.update(str(relative).encode() + b"\0" + content + b"\0")


def requirements(setup_cfg: Path = SETUP_CFG) -> list[str]:
    """nodedra's requirements as setup.cfg lists them (``install_requires``)."""
    parser = configparser.ConfigParser()
    parser.read(setup_cfg)
    lines = parser["options"]["install_requires"].splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def resolved_requirements(log: Log) -> list[str]:
    """``name==version`` of what pip installs now for nodedra's requirements, and of pip (the
    Dockerfile's ``pip wheel . pip``), as this CPython resolves them: a dry run that
    downloads only the indexes' metadata."""
    argv = [
        sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
        "--quiet", "--disable-pip-version-check", "--no-input", "--report", "-",
        *requirements(), "pip",
    ]  # fmt: skip
    started = time.monotonic()
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=_RESOLVE_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise DockerfileBuildError(f"resolving nodedra's requirements failed: {err}") from err
    if done.returncode != 0:
        raise DockerfileBuildError(
            f"resolving nodedra's requirements with `{' '.join(argv)}` failed (needs pip 22.2 "
            f"or later and PyPI): {done.stderr.strip()[-1500:]}"
        )
    report = json.loads(done.stdout)
    resolved = sorted(
        f"{item['metadata']['name'].lower()}=={item['metadata']['version']}"
        for item in report["install"]
    )
    print(
        f"[dockerfile] pip resolves {len(resolved)} distributions for nodedra's requirements "
        f"({time.monotonic() - started:.1f}s)",
        file=log,
        flush=True,
    )
    return resolved


def image_key(resolved: Sequence[str]) -> str:
    """The key of nodedra's image: everything the Dockerfile's build reads (see the module)."""
    digest = _digest("image", python_key(), platform.python_version(), *resolved)
    _hash_tree(digest, [DOCKERFILE.name, DOCKERIGNORE.name, IMAGE_DIR.name, *SOURCES])
    return digest.hexdigest()[:16]


# -- buildah -----------------------------------------------------------------------------------


def _ensure_buildah(timer: _Timer, log: Log) -> None:
    """Install buildah from Debian's packages when missing (as root: the build then works on
    a fresh CI machine); elsewhere fail saying what to install."""
    if shutil.which("buildah") is None:
        try:
            with timer.step("installing buildah (Debian)"):
                install_debian_packages(["buildah"], "building the Dockerfile", log, "Install it.")
        except PeerBuildError as err:
            raise DockerfileBuildError(str(err)) from None
    if shutil.which("buildah") is None:
        raise DockerfileBuildError("building the Dockerfile needs buildah; install it")


class Buildah:
    """buildah with a storage of its own in ``workdir`` (vfs), each command in a mount
    namespace of its own (whatever it mounts goes when it exits), its output in
    ``workdir``/buildah.log."""

    def __init__(self, workdir: Path, log: Log) -> None:
        self.workdir = workdir
        self.log = log
        self.transcript = workdir / "buildah.log"
        storage = workdir / "storage"
        self.root, self.runroot = storage / "root", storage / "run"
        tmp = workdir / "tmp"
        for directory in (self.root, self.runroot, tmp):
            directory.mkdir(parents=True)
        # The host's containers configuration stays out: a storage.conf and a signature
        # policy of the build's own (images come from archives made here, unsigned).
        conf = workdir / "storage.conf"
        conf.write_text(
            f'[storage]\ndriver = "vfs"\ngraphroot = "{self.root}"\nrunroot = "{self.runroot}"\n'
        )
        self.policy = workdir / "policy.json"
        self.policy.write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
        self.env = {
            **os.environ,
            "CONTAINERS_STORAGE_CONF": str(conf),
            # Where buildah unpacks archives it reads and writes: here, not /var/tmp.
            "TMPDIR": str(tmp),
        }
        for name in ("BUILDAH_ISOLATION", "BUILDAH_LAYERS", "BUILDAH_FORMAT", "STORAGE_DRIVER"):
            self.env.pop(name, None)

    def argv(self, *args: str) -> list[str]:
        """A buildah command line with the storage options (the command shown in logs)."""
        return [
            "buildah", "--root", str(self.root), "--runroot", str(self.runroot),
            "--storage-driver", "vfs", *args,
        ]  # fmt: skip

    def run(self, *args: str, what: str, timeout: float = _COPY_TIMEOUT) -> None:
        """A long buildah command, its output in the transcript (a heartbeat on the log)."""
        run_step(
            [*OWN_MOUNT_NAMESPACE, *self.argv(*args)],
            self.transcript,
            self.log,
            what=what,
            hint=HINT,
            timeout=timeout,
            env=self.env,
        )

    def output(self, *args: str, what: str) -> str:
        """A short buildah command's standard output."""
        argv = [*OWN_MOUNT_NAMESPACE, *self.argv(*args)]
        with open(self.transcript, "a") as out:
            out.write("$ " + " ".join(argv) + "\n")
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                env=self.env,
                timeout=_COPY_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            raise DockerfileBuildError(f"{what}: {err}. {HINT}") from err
        with open(self.transcript, "a") as out:
            out.write(done.stdout + done.stderr)
        if done.returncode != 0:
            raise DockerfileBuildError(
                f"{what} failed (exit code {done.returncode}): {done.stderr.strip()[-1500:]}"
            )
        return done.stdout.strip()

    def load(self, archive: Path, name: str) -> None:
        """Store the image of an OCI archive under ``name`` (as if pulled from a registry)."""
        image_id = self.output(
            "pull", "--quiet", "--signature-policy", str(self.policy), f"oci-archive:{archive}",
            what=f"loading {archive} into buildah's storage",
        )  # fmt: skip
        self.output("tag", image_id.splitlines()[-1], name, what=f"naming {archive} {name}")

    def bud(self, dockerfile: Path, context: Path, name: str, what: str) -> None:
        """``buildah bud`` of ``dockerfile`` in ``context``, tagged ``name``: chroot isolation
        (no runtime, no network namespace), never pulling, no intermediate images kept."""
        self.run(
            "bud", "--isolation", "chroot", "--pull=never", "--layers=false", "--format", "oci",
            "--signature-policy", str(self.policy), "--file", str(dockerfile), "--tag", name,
            str(context),
            what=what, timeout=_BUD_TIMEOUT,
        )  # fmt: skip

    def push(self, name: str, archive: Path) -> None:
        """Write image ``name`` as an OCI archive at ``archive`` (gzip layers: buildah 1.28
        compresses them for an OCI archive even with --disable-compression), its reference
        name ``name`` whole, so that ``ctr images import`` names the image so."""
        archive.parent.mkdir(parents=True, exist_ok=True)
        partial = archive.with_name(f".{archive.name}.{os.getpid()}.partial")
        partial.unlink(missing_ok=True)
        self.run(
            "push", "--format", "oci", "--signature-policy",
            str(self.policy), name, f"oci-archive:{partial}:{name}",
            what=f"writing {name} to {archive}",
        )  # fmt: skip
        os.replace(partial, archive)


# -- the base images ---------------------------------------------------------------------------


def _entry_archive(entry: Path, name: str) -> Path | None:
    """The archive of a finished cache entry (its ``done`` file is written last), or None;
    an unfinished entry is removed."""
    archive = entry / name
    if (entry / "done").is_file() and archive.is_file():
        return archive
    if entry.exists():
        shutil.rmtree(entry)
    return None


def ensure_debian_archive(timer: _Timer, log: Log) -> Path:
    """The debian:bookworm-slim stand-in's archive (see the module): cached, or made now."""
    entry = cache_root() / f"dockerfile-debian-{debian_key()}"
    found = _entry_archive(entry, "debian.tar")
    if found is not None:
        print(f"[dockerfile] using the cached {DEBIAN_NAME} {found}", file=log, flush=True)
        return found
    ensure_debootstrap(log)
    rootfs = entry / "rootfs"
    entry.mkdir(parents=True)
    mirror = debian_mirror()
    with timer.step(f"debootstrap of {DEBIAN_NAME} (minbase) from {mirror}"):
        run_debootstrap(
            (),
            rootfs,
            mirror,
            transcript=entry / "debootstrap.log",
            log=log,
            needs="nothing else",
        )
    with timer.step(f"packing {DEBIAN_NAME}"):
        strip_rootfs(rootfs)
        for relative, (mode, text) in DEBIAN_FILES.items():
            path = rootfs / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            path.chmod(mode)
        layer_path = entry / "layer.tar"
        pack_layer(rootfs, layer_path)
        archive = entry / "debian.tar"
        write_layers_archive(
            DEBIAN_NAME,
            [Layer.of(layer_path)],
            DEBIAN_CONFIG,
            archive,
            history=[f"debootstrap --variant=minbase bookworm {mirror} (tests.peers)"],
        )
        # The archive holds the layer; neither the tree nor the loose layer is needed again.
        shutil.rmtree(rootfs)
        layer_path.unlink()
    (entry / "done").write_text("")
    prune_cache_entries("dockerfile-debian-*", entry, _KEEP_ENTRIES, log)
    return archive


def _python_image(buildah: Buildah, timer: _Timer, log: Log) -> None:
    """Store python:3.11-slim-bookworm in ``buildah``'s storage: from the cache, or built now
    from the debian stand-in (already stored) and cached."""
    entry = cache_root() / f"dockerfile-python-{python_key()}"
    found = _entry_archive(entry, "python.tar")
    if found is not None:
        with timer.step(f"loading the cached {PYTHON_NAME}"):
            buildah.load(found, PYTHON_NAME)
        return
    context = buildah.workdir / "python-context"
    (context / "local-ca").mkdir(parents=True)
    for ca in local_cas():
        shutil.copy(ca, context / "local-ca" / ca.name)
    containerfile = context / "Containerfile"
    containerfile.write_text(PYTHON_CONTAINERFILE)
    with timer.step(f"building {PYTHON_NAME} (Debian's python3 and python3-pip)"):
        buildah.bud(containerfile, context, PYTHON_NAME, f"building {PYTHON_NAME}")
    with timer.step(f"caching {PYTHON_NAME}"):
        entry.mkdir(parents=True)
        buildah.push(PYTHON_NAME, entry / "python.tar")
        (entry / "done").write_text("")
    prune_cache_entries("dockerfile-python-*", entry, _KEEP_ENTRIES, log)


# -- nodedra's image ---------------------------------------------------------------------------


def read_archive_image(archive: Path) -> tuple[str, int]:
    """The manifest digest of an OCI archive's one image, and the bytes of its layers'
    regular files (what it takes unpacked, whiteouts aside)."""
    with tarfile.open(archive) as tar:
        index_file = tar.extractfile("index.json")
        if index_file is None:
            raise DockerfileBuildError(f"{archive} has no index.json")
        (descriptor,) = json.load(index_file)["manifests"]
        digest = str(descriptor["digest"])
        manifest_file = tar.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
        if manifest_file is None:
            raise DockerfileBuildError(f"{archive} has no manifest {digest}")
        unpacked = 0
        for layer in json.load(manifest_file)["layers"]:
            blob = tar.extractfile(f"blobs/sha256/{layer['digest'].removeprefix('sha256:')}")
            if blob is None:
                raise DockerfileBuildError(f"{archive} has no layer {layer['digest']}")
            with tarfile.open(fileobj=blob, mode="r|*") as layer_tar:
                unpacked += sum(m.size for m in layer_tar if m.isreg())
    return digest, unpacked


@dataclass(frozen=True)
class DockerfileImage:
    """nodedra's image built from the Dockerfile, and how it was built."""

    image: NodedraImage
    cached: bool
    steps: tuple[Step, ...]
    """The build's steps and their durations (none when it came from the cache)."""


def build_dockerfile_image(log: Log = sys.stderr, rebuild: bool = False) -> DockerfileImage:
    """nodedra's image from the repository's Dockerfile (see the module): cached, or built now
    with buildah (minutes) under a lock; ``rebuild`` drops the cached image (not the bases)."""
    require_root()
    timer = _Timer(log)
    with locked(cache_root() / ".dockerfile-image.lock", log, "the Dockerfile's image"):
        resolved = resolved_requirements(log)
        entry = cache_root() / f"dockerfile-image-{image_key(resolved)}"
        if rebuild and entry.exists():
            shutil.rmtree(entry)
        archive = _entry_archive(entry, "nodedra.tar")
        if archive is None:
            archive = _build(entry, resolved, timer, log)
            cached = False
        else:
            print(f"[dockerfile] using the cached image {archive}", file=log, flush=True)
            cached = True
        info = json.loads((entry / "image.json").read_text())
    if archive.stat().st_size != info["size_bytes"]:
        raise DockerfileBuildError(
            f"the cached {archive} is damaged (not {info['size_bytes']} bytes); remove {entry}"
        )
    image = NodedraImage(
        name=info["name"],
        archive=archive,
        digest=info["digest"],
        size_bytes=info["size_bytes"],
        unpacked_bytes=info["unpacked_bytes"],
    )
    return DockerfileImage(image, cached, tuple(timer.steps))


def _build(entry: Path, resolved: Sequence[str], timer: _Timer, log: Log) -> Path:
    started = time.monotonic()
    _ensure_buildah(timer, log)
    debian = ensure_debian_archive(timer, log)
    with build_workdir(_BUILD_PREFIX, log) as workdir:
        buildah = Buildah(workdir, log)
        print(f"[dockerfile] buildah's storage and log: {workdir}", file=log, flush=True)
        try:
            with timer.step(f"loading {DEBIAN_NAME}"):
                buildah.load(debian, DEBIAN_NAME)
            _python_image(buildah, timer, log)
            with timer.step(f"buildah bud of {DOCKERFILE}"):
                buildah.bud(DOCKERFILE, REPO_ROOT, DEFAULT_NAME, f"building {DOCKERFILE}")
            entry.mkdir(parents=True)
            archive = entry / "nodedra.tar"
            with timer.step(f"writing {archive}"):
                buildah.push(DEFAULT_NAME, archive)
                digest, unpacked = read_archive_image(archive)
        except ImageBuildError as err:
            # The working directory goes, and buildah's log with it: keep that.
            kept = cache_root() / "dockerfile-failed-build.log"
            shutil.copy(buildah.transcript, kept)
            raise DockerfileBuildError(f"{err}\n(buildah's whole log: {kept})") from None
        shutil.copy(buildah.transcript, entry / "buildah.log")
    total = time.monotonic() - started
    (entry / "image.json").write_text(
        json.dumps(
            {
                "name": DEFAULT_NAME,
                "digest": digest,
                "size_bytes": archive.stat().st_size,
                "unpacked_bytes": unpacked,
                "version": __version__,
                "resolved": list(resolved),
                "steps": {step.what: round(step.seconds, 1) for step in timer.steps},
                "seconds": round(total, 1),
            },
            indent=2,
        )
    )
    (entry / "done").write_text("")
    prune_cache_entries("dockerfile-image-*", entry, _KEEP_ENTRIES, log)
    print(
        f"[dockerfile] {DEFAULT_NAME} built from {DOCKERFILE} in {total:.0f}s: {archive} "
        f"({archive.stat().st_size / 1e6:.1f} MB, manifest {digest})",
        file=log,
        flush=True,
    )
    return archive


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.peers.dockerfile_image",
        description="Build nodedra's image from the repository's Dockerfile with buildah (as "
        "root, with the Debian mirror and PyPI), as an OCI archive for `ctr images import`.",
    )
    parser.add_argument(
        "--rebuild", action="store_true", help="build the image anew (the base images stay)"
    )
    args = parser.parse_args(argv)

    def build() -> tuple[NodedraImage, str, list[str]]:
        built = build_dockerfile_image(rebuild=args.rebuild)
        steps = [f"  {step.seconds:7.1f}s  {step.what}" for step in built.steps]
        return built.image, "from the cache" if built.cached else "built", steps

    return run_image_command(build)


if __name__ == "__main__":
    sys.exit(main())
