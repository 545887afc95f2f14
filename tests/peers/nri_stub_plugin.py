"""Python side of the Go pinning plugin (tests/peers/nri/cmd/nri-stub-plugin), the Go
reference plugin that tests connect to the NRI runtime harness.

:class:`GoStubPlugin` runs the Go reference plugin;
:class:`~tests.peers.nri_runtime.NRIFactory` starts it for a test.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Mapping
from pathlib import Path

from tests.peers.nri_protocol import NRIRuntimeError
from tests.peers.process import PeerProcess

__all__ = ["GoStubPlugin"]


class GoStubPlugin:
    """The Go pinning plugin (cmd/nri-stub-plugin) connected to a runtime's socket.

    ``claims`` maps claim UID to (cpus, mems); :meth:`set_claims` rewrites them and makes
    the plugin reload them, after which it sends unsolicited updates (marked
    ignore_failure with ``ignore_failure``).
    """

    def __init__(
        self,
        binary: Path,
        socket: Path,
        workdir: Path,
        *,
        online_cpus: str,
        online_mems: str = "",
        claims: Mapping[str, tuple[str, str]] | None = None,
        name: str = "stub",
        index: str = "10",
        driver: str = "",
        ignore_failure: bool = False,
    ) -> None:
        self.binary = binary
        self.socket = socket
        self.workdir = workdir
        self.online_cpus = online_cpus
        self.online_mems = online_mems
        self.name = name
        self.index = index
        self.driver = driver
        self.ignore_failure = ignore_failure
        self.claims_path = workdir / f"claims-{index}-{name}.json"
        self.log_path = workdir / f"nri-stub-plugin-{index}-{name}.log"
        self._claims: dict[str, tuple[str, str]] = dict(claims or {})
        self._process: PeerProcess | None = None

    @property
    def plugin_name(self) -> str:
        """How the runtime names it: "<idx>-<name>"."""
        return f"{self.index}-{self.name}"

    def start(self) -> GoStubPlugin:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._write_claims()
        argv = [
            str(self.binary),
            f"--socket={self.socket}",
            f"--name={self.name}",
            f"--idx={self.index}",
            f"--online-cpus={self.online_cpus}",
            f"--claims={self.claims_path}",
        ]
        if self.online_mems:
            argv.append(f"--online-mems={self.online_mems}")
        if self.driver:
            argv.append(f"--driver={self.driver}")
        if self.ignore_failure:
            argv.append("--ignore-failure")
        self._process = PeerProcess(f"nri-stub-plugin {self.plugin_name}", argv, self.log_path)
        return self

    def set_claims(self, claims: Mapping[str, tuple[str, str]]) -> None:
        """Replace the claims and make the plugin reload them (SIGHUP)."""
        self._claims = dict(claims)
        self._write_claims()
        proc = self._process
        if proc is None or not proc.alive():
            raise NRIRuntimeError(f"the stub plugin is not running; log:\n{self.log_tail()}")
        proc.popen.send_signal(signal.SIGHUP)

    def _write_claims(self) -> None:
        data = {uid: {"cpus": cpus, "mems": mems} for uid, (cpus, mems) in self._claims.items()}
        tmp = self.claims_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.claims_path)

    def alive(self) -> bool:
        return self._process is not None and self._process.alive()

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop()
            self._process = None

    def log_tail(self, lines: int = 40) -> str:
        return self._process.tail(lines) if self._process is not None else ""

    def log_tails(self, lines: int = 40) -> dict[str, str]:
        return {f"nri-stub-plugin {self.plugin_name} ({self.log_path})": self.log_tail(lines)}
