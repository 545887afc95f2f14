"""Child processes for test peers: own process group, log file, clean stop.

Every peer runs in its own session (process group) with stdout and stderr in
one log file, so that a test failure can show what the peer said, and so that
stopping it also stops anything it spawned: nothing is left running after the
tests, whatever happened to them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO


class PeerProcessError(RuntimeError):
    """A peer failed to start or to become ready; the message has its log tail."""


def tail(path: Path, lines: int = 40) -> str:
    """The last lines of a log file ('' if it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 256 * 1024))
            data = f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


class PeerProcess:
    """One running peer.

    stdin is a pipe when `interactive` is set (the kubelet harness reads
    requests there), otherwise /dev/null.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        interactive: bool = False,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        # Open for the life of the process, closed in stop().
        self._log: IO[bytes] = open(log_path, "ab")  # noqa: SIM115
        self._log.write(f"=== {' '.join(self.argv)}\n".encode())
        self._log.flush()
        self.popen = subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE if interactive else subprocess.DEVNULL,
            stdout=subprocess.PIPE if interactive else self._log,
            stderr=self._log,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 40) -> str:
        return tail(self.log_path, lines)

    def wait_until(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll `ready` until it returns True; fail early if the process
        exits, and with its log tail on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive():
                raise PeerProcessError(
                    f"{self.name} exited with code {self.popen.returncode} before {what}; "
                    f"log {self.log_path}:\n{self.tail()}"
                )
            try:
                if ready():
                    return
            except OSError:
                pass  # Not listening yet.
            if time.monotonic() > deadline:
                raise PeerProcessError(
                    f"{self.name} did not become ready ({what}) within {timeout:.0f}s; "
                    f"log {self.log_path}:\n{self.tail()}"
                )
            time.sleep(0.1)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL what is left after `grace`."""
        if self.popen.stdin is not None:
            with contextlib.suppress(OSError):
                self.popen.stdin.close()
        if self.alive():
            self._signal_group(signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                # Still before reaping the leader, so the group id cannot
                # have been reused by an unrelated process.
                self._signal_group(signal.SIGKILL)
                self.popen.wait()
        if self.popen.stdout is not None:
            self.popen.stdout.close()
        self._log.close()

    def kill(self) -> None:
        """SIGKILL the process group at once (no chance to clean up) and reap it."""
        if self.alive():
            self._signal_group(signal.SIGKILL)
            self.popen.wait()

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)
