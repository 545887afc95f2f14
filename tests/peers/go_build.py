"""Build one peer group's binaries with the Go toolchain (and the C compiler where it needs).

tests.peers.build decides what to build and where it is cached; this runs the build of one
group (tests.peers.peer_groups) into a directory: ``go build`` with the group's flags, its
output kept in a transcript with a heartbeat on the log (a cold build takes many minutes),
the Debian packages a cgo build needs installed first, and the C programs some groups carry
compiled by gcc from their module's sources. Binaries appear in the directory atomically.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from tests.peers.cache import Log, PeerBuildError
from tests.peers.debian import install_debian_packages
from tests.peers.peer_groups import INSTALL_HINT, SUPPLY_HINT, PeerGroup


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


def _ensure_cgo(group: PeerGroup, names: Sequence[str], env: Mapping[str, str], log: Log) -> None:
    """Install what a cgo build lacks from Debian's packages, or fail saying what."""
    missing = _cgo_missing(group, env)
    if missing:
        install_debian_packages(
            missing, f"building {', '.join(names)} ({group.name})", log, INSTALL_HINT
        )
    missing = _cgo_missing(group, env)
    if missing:
        raise PeerBuildError(
            f"cannot build {', '.join(names)} ({group.name}): the cgo build needs the Debian "
            f"packages {' '.join(missing)} (or their equivalents). Install them, or supply "
            f"the binaries. {SUPPLY_HINT}"
        )


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
