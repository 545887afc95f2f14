"""What every image build here shares: its root-only steps, working directories and command.

nodedra's image (tests.peers.image), the Dockerfile's (tests.peers.dockerfile_image) and the
VM node's (tests.peers.vm_image) are built on this machine, as root, in long steps (debootstrap,
pip, chroot, buildah) whose mounts live in a mount namespace of their own, from the recipe in
the repository's ``image/`` (`IMAGE_DIR`). This module runs
such a step with its output in a transcript and a heartbeat on the log, gives a build a working
directory beside the cache (and removes those of builds that were killed), and is the command
line of the builds of nodedra's image: every failure is an `ImageBuildError` saying what is
missing and what to do.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tests.peers.cache import Log, cache_root
from tests.peers.process import tail

REPO_ROOT = Path(__file__).resolve().parents[2]
IMAGE_DIR = REPO_ROOT / "image"

#: A command prefix: what follows runs in a mount namespace of its own, whose mounts the
#: kernel drops when its processes are gone.
OWN_MOUNT_NAMESPACE = ("unshare", "--mount", "--propagation", "private", "--")

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
    """The reference containerd names it by (``docker.io/library/nodedra:<version>``)."""
    archive: Path
    digest: str
    """Of the image manifest."""
    size_bytes: int
    """Of the archive (its layers are uncompressed: about what the image takes unpacked)."""
    unpacked_bytes: int
    """Of the regular files of the image's layers."""


def run_step(
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


def require_root() -> None:
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


def mounts_below(root: Path) -> list[str]:
    """The mount points at or below ``root`` that this process sees."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if Path(point).is_relative_to(root):
            points.append(point)
    return points


def remove_stale_builds(log: Log, prefix: str) -> None:
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
        mounted = mounts_below(path)
        if mounted:
            print(f"[image] leaving {path}: mounts below it: {mounted}", file=log)
            continue
        print(f"[image] removing the working directory of a build that is gone: {path}", file=log)
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def build_workdir(prefix: str, log: Log) -> Iterator[Path]:
    """A build's working directory beside the cache (not /tmp: hundreds of MB, and an overlay's
    upper directory must be on a real filesystem), ``<prefix><pid>-<random>``; removed
    afterwards unless something is still mounted below it. Those of builds that are gone go
    first (`remove_stale_builds`)."""
    cache_root().mkdir(parents=True, exist_ok=True)
    remove_stale_builds(log, prefix)
    path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=cache_root()))
    try:
        yield path
    finally:
        mounted = mounts_below(path)
        if mounted:
            print(f"[image] leaving {path}: mounts below it: {mounted}", file=log)
        else:
            shutil.rmtree(path, ignore_errors=True)


def run_image_command(build: Callable[[], tuple[NodedraImage, str, Sequence[str]]]) -> int:
    """The end of ``python -m tests.peers.image`` and ``python -m tests.peers.dockerfile_image``:
    run ``build`` (which returns the image, how it was had: ``built`` or ``from the cache``,
    and lines about its steps); print the archive's path on standard output, and on standard
    error the steps, what the image is and how to import it, or the error. Returns the exit
    status."""
    started = time.monotonic()
    try:
        image, had, steps = build()
    except ImageBuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(image.archive)
    for line in steps:
        print(line, file=sys.stderr)
    print(
        f"{image.name}: {image.size_bytes} bytes ({image.unpacked_bytes} unpacked), manifest "
        f"{image.digest}, {had} in {time.monotonic() - started:.1f}s. Import it on a node with: "
        f"ctr --namespace k8s.io images import {image.archive}",
        file=sys.stderr,
    )
    return 0
