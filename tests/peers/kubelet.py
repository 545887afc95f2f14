"""Python side of the kubelet DRA harness (tests/peers/cmd/kubelet-harness).

The harness runs the kubelet's own plugin manager and DRA manager; this class
starts it and speaks its JSON-lines protocol, so a test can say "the kubelet
now starts pod ns/name" (prepare) and "the pod's containers are gone"
(unprepare), and can wait for a DRA driver to be registered the way a kubelet
registers it.
"""

from __future__ import annotations

import itertools
import json
import os
import select
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.peers.process import PeerProcess

DEFAULT_TIMEOUT = 60.0


class KubeletError(RuntimeError):
    """The kubelet code answered a request with an error (its message)."""


@dataclass(frozen=True)
class RegisteredPlugin:
    """A DRA plugin as the kubelet registered it."""

    driver: str
    endpoint: str
    versions: tuple[str, ...]
    #: The DRA gRPC service the kubelet chose, e.g. "v1.DRAPlugin".
    chosen_service: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RegisteredPlugin:
        return cls(
            driver=data["driver"],
            endpoint=data["endpoint"],
            versions=tuple(data.get("versions") or ()),
            chosen_service=data.get("chosen_service", ""),
        )


@dataclass(frozen=True)
class SliceWipe:
    """The kubelet deleted the node's ResourceSlices (all drivers if driver is '')."""

    driver: str
    field_selector: str


class KubeletHarness:
    """One kubelet stand-in for node `node_name`, built from kubelet code.

    `registry_dir` is the plugin registration directory the plugin watcher
    observes (a kubelet's /var/lib/kubelet/plugins_registry); `state_dir`
    holds the DRA manager's checkpoint (a kubelet's /var/lib/kubelet).
    """

    def __init__(
        self,
        binary: Path,
        kubeconfig: Path,
        node_name: str,
        workdir: Path,
        *,
        feature_gates: str = "",
        verbosity: int = 4,
    ) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig
        self.node_name = node_name
        self.workdir = workdir
        self.registry_dir = workdir / "plugins_registry"
        self.state_dir = workdir / "state"
        self.log_path = workdir / "kubelet-harness.log"
        self.feature_gates = feature_gates
        self.verbosity = verbosity
        self._process: PeerProcess | None = None
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._buffer = b""

    def __enter__(self) -> KubeletHarness:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def process(self) -> PeerProcess:
        if self._process is None:
            raise RuntimeError("kubelet harness is not running")
        return self._process

    def start(self, timeout: float = 30.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = [
            str(self.binary),
            f"--kubeconfig={self.kubeconfig}",
            f"--node-name={self.node_name}",
            f"--registry-dir={self.registry_dir}",
            f"--state-dir={self.state_dir}",
            f"--v={self.verbosity}",
        ]
        if self.feature_gates:
            argv.append(f"--feature-gates={self.feature_gates}")
        self._process = PeerProcess("kubelet-harness", argv, self.log_path, interactive=True)
        try:
            answer = self.call("ping", timeout=timeout)
        except BaseException:
            self.stop()
            raise
        if answer.get("node") != self.node_name:
            raise KubeletError(f"harness answered ping with {answer!r}")

    def stop(self) -> None:
        """Close stdin (the harness then shuts down cleanly), then make sure."""
        if self._process is not None:
            self._process.stop()
            self._process = None

    def log_tail(self, lines: int = 40) -> str:
        return self._process.tail(lines) if self._process is not None else ""

    # -- protocol ------------------------------------------------------

    def call(self, op: str, timeout: float = DEFAULT_TIMEOUT, **params: Any) -> dict[str, Any]:
        """Send one request and wait for its answer.

        The harness gets `timeout` for the operation; we wait a little
        longer for its answer, so that its own timeout error, which says
        what it was waiting for, is what the caller sees.
        """
        with self._lock:
            proc = self.process
            request_id = next(self._ids)
            message = {"id": request_id, "op": op, "timeout": timeout, **params}
            assert proc.popen.stdin is not None
            try:
                proc.popen.stdin.write(json.dumps(message).encode() + b"\n")
                proc.popen.stdin.flush()
            except BrokenPipeError:
                raise KubeletError(
                    f"kubelet harness is gone; log {proc.log_path}:\n{proc.tail()}"
                ) from None
            deadline = time.monotonic() + timeout + 10.0
            while True:
                answer = self._read_line(deadline)
                if answer.get("id") == request_id:
                    break
                # An answer to an earlier request that timed out on our
                # side: drop it.
        if not answer.get("ok"):
            raise KubeletError(f"kubelet {op} failed: {answer.get('error')}")
        return answer

    def _read_line(self, deadline: float) -> dict[str, Any]:
        proc = self.process
        stdout = proc.popen.stdout
        assert stdout is not None
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KubeletError(f"no answer from the kubelet harness in time; {self._gone()}")
            ready, _, _ = select.select([stdout], [], [], min(remaining, 1.0))
            if not ready:
                if not proc.alive():
                    raise KubeletError(f"kubelet harness exited; {self._gone()}")
                continue
            # Unbuffered read: select() cannot see data hidden in a
            # Python-level buffer.
            chunk = os.read(stdout.fileno(), 65536)
            if not chunk:
                proc.popen.wait(timeout=10)
                raise KubeletError(f"kubelet harness exited; {self._gone()}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        decoded: dict[str, Any] = json.loads(line)
        return decoded

    def _gone(self) -> str:
        proc = self.process
        return f"exit code {proc.popen.poll()}, log {proc.log_path}:\n{proc.tail()}"

    # -- kubelet operations --------------------------------------------

    def prepare(
        self, namespace: str, pod: str, timeout: float = DEFAULT_TIMEOUT
    ) -> dict[str, list[str]]:
        """Prepare the pod's claims as the kubelet does before starting it.

        Returns the CDI device IDs the kubelet would hand the container
        runtime, per container name.
        """
        answer = self.call("prepare", timeout=timeout, namespace=namespace, pod=pod)
        containers: dict[str, list[str]] = {
            name: list(ids) for name, ids in answer["containers"].items()
        }
        return containers

    def unprepare(self, namespace: str, pod: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Unprepare the pod's claims as the kubelet does once it stopped."""
        self.call("unprepare", timeout=timeout, namespace=namespace, pod=pod)

    def registered_plugins(self) -> list[RegisteredPlugin]:
        answer = self.call("plugins")
        return [RegisteredPlugin.from_json(p) for p in answer["plugins"] or ()]

    def wait_registered(self, driver: str, timeout: float = 30.0) -> RegisteredPlugin:
        """Wait until the kubelet has registered a plugin of `driver`."""
        answer = self.call("wait_registered", timeout=timeout, driver=driver)
        return RegisteredPlugin.from_json(answer["plugin"])

    def wait_unregistered(self, driver: str, timeout: float = 30.0) -> None:
        """Wait until the kubelet has no plugin of `driver` any more."""
        self.call("wait_unregistered", timeout=timeout, driver=driver)

    def wait_refused(self, driver: str, timeout: float = 30.0) -> str:
        """Wait until the kubelet refused a plugin of `driver` (validation or
        registration failed) and return its reason."""
        answer = self.call("wait_refused", timeout=timeout, driver=driver)
        refusal: str = answer["refusal"]
        return refusal

    def slice_wipes(self) -> list[SliceWipe]:
        answer = self.call("slice_wipes")
        return [
            SliceWipe(driver=w["driver"], field_selector=w["field_selector"])
            for w in answer["wipes"]
        ]

    def wait_slice_wipe(self, driver: str = "", timeout: float = 30.0) -> None:
        """Wait until the kubelet has deleted the node's ResourceSlices of
        `driver`, or of all drivers for driver="": it does that once at
        start-up (as soon as the Node object exists), so a driver started
        after that wipe keeps its slices; and 30 s after the last plugin of
        a driver went away."""
        self.call("wait_slice_wipe", timeout=timeout, driver=driver)

    def bench_prepare(
        self,
        driver: str,
        claims: Sequence[Mapping[str, str]],
        iterations: int,
        *,
        warmup: int = 0,
        parallel: int = 1,
        timeout: float = 600.0,
    ) -> tuple[list[int], list[int], int]:
        """Time `driver`'s NodePrepareResources and NodeUnprepareResources of `claims`.

        The harness calls the plugin the kubelet registered for `driver` through the
        kubelet's own DRA client: `warmup` untimed rounds, then `iterations` timed ones
        of prepare-all-claims then unprepare-all-claims. With `parallel` > 1 the claims
        are dealt into that many groups whose rounds run concurrently, as for pods that
        start together. `claims` are mappings with namespace, name and uid; each must be
        allocated to `driver`. Returns the nanoseconds of each timed prepare call, of
        each timed unprepare call, and the wall time of all timed rounds. Any claim
        error fails the whole call (a benchmark of errors would be meaningless).
        """
        answer = self.call(
            "bench_prepare",
            timeout=timeout,
            driver=driver,
            claims=[dict(c) for c in claims],
            iterations=iterations,
            warmup=warmup,
            parallel=parallel,
        )
        return list(answer["prepare_ns"]), list(answer["unprepare_ns"]), int(answer["total_ns"])
