"""Python side of the NRI runtime harness (tests/peers/nri/cmd/nri-runtime).

The harness is containerd's NRI integration without containerd: the official
``github.com/containerd/nri/pkg/adaptation`` (the code containerd embeds), driven the way
containerd's CRI plugin drives it, around a model of the runtime's pods and containers. A
test plays the kubelet (``run_pod``, ``create_container``, ``update_container``, ...) and
asserts on the model, which changes exactly as containerd's stores would under the plugins'
adjustments and updates. It is built at each NRI version in ``NRI_VERSIONS``, i.e. as
each line of containerd releases embeds NRI, so a plugin is tested against all of them.

:class:`NRIRuntime` speaks the harness's JSON-lines protocol (documented in
``cmd/nri-runtime/protocol.go``) with one method per operation and typed answers (the
records of ``nri_protocol.py``). :class:`NRIFactory` starts runtimes and Go reference
plugins (``nri_stub_plugin.py``) for a test (the ``nri_runtime_factory`` fixture) and stops
them afterwards.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.peers.build import PeerBinaries
from tests.peers.nri_protocol import (
    BulkSpec,
    Container,
    ContainerSpec,
    CreateResult,
    NRIRuntimeError,
    PluginEvent,
    PluginRecord,
    Pod,
    PodSpec,
    Refusal,
    Resources,
    RuntimeInfo,
    StopResult,
    SyncRecord,
    UnsolicitedCall,
    UpdateOutcome,
    UpdateResult,
    _outcomes,
    _refusals,
)
from tests.peers.nri_stub_plugin import GoStubPlugin
from tests.peers.peer_groups import NRI_VERSIONS
from tests.peers.process import PeerProcess

__all__ = ["NRIFactory", "NRIRuntime"]

#: How long an operation may take in the harness unless a call says otherwise. Longer than
#: containerd's request timeout times the events of one operation, so a plugin's timeout
#: shows as the harness's answer, not as ours.
DEFAULT_TIMEOUT = 60.0

#: Unix socket paths must fit sockaddr_un.sun_path (108 bytes with the terminating NUL).
MAX_SOCKET_PATH = 107


# -- the harness ------------------------------------------------------------------------------


class NRIRuntime:
    """One runtime-side NRI harness at NRI ``version``, listening on ``socket``.

    Requests may be made from several threads at once (answers are matched by id), which
    lets a test, say, create a container while a plugin's sync is under way.
    """

    def __init__(
        self,
        binary: Path,
        version: str,
        socket: Path,
        workdir: Path,
        *,
        online_cpus: str = "",
        online_mems: str = "",
        registration_timeout: float | None = None,
        request_timeout: float | None = None,
        runtime_version: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        if len(str(socket)) > MAX_SOCKET_PATH:
            raise ValueError(
                f"NRI socket path {socket} is {len(str(socket))} bytes; Unix socket paths"
                f" must stay under {MAX_SOCKET_PATH + 1}: use a shorter directory"
            )
        self.binary = binary
        self.version = version
        self.socket = socket
        self.workdir = workdir
        self.log_path = workdir / f"nri-runtime-{version}.log"
        self.online_cpus = online_cpus
        self.online_mems = online_mems
        self.registration_timeout = registration_timeout
        self.request_timeout = request_timeout
        self.runtime_version = runtime_version
        self.extra_args = list(extra_args)
        self.info: RuntimeInfo | None = None
        self._process: PeerProcess | None = None
        self._ids = itertools.count(1)
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._answers: dict[int, dict[str, Any]] = {}
        self._answered = threading.Condition(self._read_lock)
        self._reader_busy = False
        self._buffer = b""
        self._gone: str | None = None

    def __enter__(self) -> NRIRuntime:
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
            raise NRIRuntimeError("the NRI runtime harness is not running")
        return self._process

    def start(self, timeout: float = 30.0) -> RuntimeInfo:
        """Start the harness and check it embeds the NRI version it was asked for."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        argv = [str(self.binary), f"--socket={self.socket}"]
        if self.online_cpus:
            argv.append(f"--online-cpus={self.online_cpus}")
        if self.online_mems:
            argv.append(f"--online-mems={self.online_mems}")
        if self.registration_timeout is not None:
            argv.append(f"--registration-timeout={self.registration_timeout}s")
        if self.request_timeout is not None:
            argv.append(f"--request-timeout={self.request_timeout}s")
        if self.runtime_version is not None:
            argv.append(f"--runtime-version={self.runtime_version}")
        argv += self.extra_args
        self._gone = None
        self._process = PeerProcess(
            f"nri-runtime-{self.version}", argv, self.log_path, interactive=True
        )
        try:
            self.info = self.ping(timeout=timeout)
        except BaseException:
            self.stop()
            raise
        if self.info.nri_version != self.version:
            self.stop()
            raise NRIRuntimeError(
                f"{self.binary} embeds NRI {self.info.nri_version}, not {self.version}:"
                " a stale or misbuilt peer; rebuild with `python -m tests.peers.build`"
            )
        return self.info

    def stop(self) -> None:
        """Ask the harness to stop (it closes every plugin connection), then make sure."""
        if self._process is None:
            return
        if self._process.alive():
            with contextlib.suppress(NRIRuntimeError, OSError):
                self.call("stop", timeout=5.0)
        self._process.stop()
        self._process = None

    def log_tail(self, lines: int = 40) -> str:
        return self._process.tail(lines) if self._process is not None else ""

    def log_tails(self, lines: int = 40) -> dict[str, str]:
        return {f"nri-runtime {self.version} ({self.log_path})": self.log_tail(lines)}

    def log_text(self) -> str:
        """The whole log so far (the adaptation's own lines included)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    # -- protocol ---------------------------------------------------------------------

    def call(self, op: str, timeout: float = DEFAULT_TIMEOUT, **params: Any) -> dict[str, Any]:
        """Send one request and wait for its answer.

        The harness gets ``timeout`` for the operation; we wait a little longer, so that
        its own timeout error, which says what it waited for, is what the caller sees.
        """
        proc = self.process
        request_id = next(self._ids)
        message = {"id": request_id, "op": op, "timeout": timeout, **params}
        stdin = proc.popen.stdin
        assert stdin is not None
        with self._write_lock:
            try:
                stdin.write(json.dumps(message).encode() + b"\n")
                stdin.flush()
            except (BrokenPipeError, ValueError):
                raise NRIRuntimeError(f"the NRI runtime harness is gone; {self._why()}") from None
        answer = self._wait_answer(request_id, time.monotonic() + timeout + 10.0)
        if not answer.get("ok"):
            raise NRIRuntimeError(f"NRI runtime {op} failed: {answer.get('error')}")
        return answer

    def _wait_answer(self, request_id: int, deadline: float) -> dict[str, Any]:
        """Wait for the answer with ``request_id``. One waiting thread at a time reads
        stdout and files every answer it reads; the others wait to be woken."""
        with self._answered:
            while True:
                if request_id in self._answers:
                    return self._answers.pop(request_id)
                if self._gone is not None:
                    raise NRIRuntimeError(self._gone)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise NRIRuntimeError(
                        f"no answer from the NRI runtime harness in time; {self._why()}"
                    )
                if self._reader_busy:
                    self._answered.wait(min(remaining, 1.0))
                    continue
                self._reader_busy = True
                self._answered.release()
                try:
                    lines = self._read_lines(min(remaining, 1.0))
                finally:
                    self._answered.acquire()
                    self._reader_busy = False
                for answer in lines:
                    answer_id = answer.get("id")
                    if isinstance(answer_id, int):
                        self._answers[answer_id] = answer
                self._answered.notify_all()

    def _read_lines(self, wait: float) -> list[dict[str, Any]]:
        proc = self.process
        stdout = proc.popen.stdout
        assert stdout is not None
        ready, _, _ = select.select([stdout], [], [], wait)
        if not ready:
            if not proc.alive():
                self._gone = f"the NRI runtime harness exited; {self._why()}"
            return []
        # Unbuffered read: select() cannot see data hidden in a Python-level buffer.
        chunk = os.read(stdout.fileno(), 1 << 20)
        if not chunk:
            with contextlib.suppress(Exception):
                proc.popen.wait(timeout=10)
            self._gone = f"the NRI runtime harness exited; {self._why()}"
            return []
        self._buffer += chunk
        *complete, self._buffer = self._buffer.split(b"\n")
        return [json.loads(line) for line in complete if line.strip()]

    def _why(self) -> str:
        proc = self._process
        if proc is None:
            return "not running"
        return f"exit code {proc.popen.poll()}, log {proc.log_path}:\n{proc.tail()}"

    # -- operations -------------------------------------------------------------------

    def ping(self, timeout: float = 10.0) -> RuntimeInfo:
        return RuntimeInfo.from_json(self.call("ping", timeout=timeout))

    def add(
        self,
        pods: Iterable[PodSpec] = (),
        containers: Iterable[ContainerSpec] = (),
        bulk: BulkSpec | None = None,
    ) -> tuple[int, int]:
        """Put pods and containers into the runtime's stores without any event, as if
        they existed before (e.g. before a plugin connects). Returns how many of each."""
        answer = self.call(
            "add",
            pods=[p.to_json() for p in pods],
            containers=[c.to_json() for c in containers],
            generate=bulk.to_json() if bulk else None,
        )
        return int(answer["pods"]), int(answer["containers"])

    def run_pod(self, pod: PodSpec) -> Pod:
        """RunPodSandbox: relays RUN_POD_SANDBOX; a plugin's error fails it."""
        return Pod.from_json(self.call("run_pod", pod=pod.to_json())["pod"])

    def stop_pod(self, pod_id: str) -> tuple[UpdateOutcome, ...]:
        """StopPodSandbox: stops the pod's containers (their STOP_CONTAINER events), then
        relays STOP_POD_SANDBOX. Returns what became of the updates plugins asked for."""
        return _outcomes(self.call("stop_pod", pod_id=pod_id)["updates"])

    def remove_pod(self, pod_id: str) -> tuple[UpdateOutcome, ...]:
        """RemovePodSandbox: stops the pod if needed, removes its containers, then relays
        REMOVE_POD_SANDBOX."""
        return _outcomes(self.call("remove_pod", pod_id=pod_id)["updates"])

    def update_pod(
        self, pod_id: str, resources: Resources, overhead: Resources | None = None
    ) -> None:
        """UpdatePodSandboxResources (containerd 2.3 on, i.e. the v0.12 build only)."""
        self.call(
            "update_pod",
            pod_id=pod_id,
            resources=resources.to_json(),
            overhead=overhead.to_json() if overhead else None,
        )

    def create_container(
        self,
        container: ContainerSpec,
        *,
        start: bool = False,
        unseen: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> CreateResult:
        """CreateContainer (then StartContainer with ``start``, as the kubelet does next).

        A plugin's error fails it (NRIRuntimeError); a failed start is reported in
        ``start_error`` and leaves the container stopped. With ``unseen`` NRI hears nothing
        of the creation, as of a container a runtime created while it synchronized a plugin
        (containerd#13698, cri-o#10090): its start is then NRI's first word of it.
        """
        answer = self.call(
            "create_container",
            timeout=timeout,
            container=container.to_json(),
            start=start,
            unseen=unseen,
        )
        return CreateResult.from_json(answer)

    def start_container(self, container_id: str) -> Container:
        return Container.from_json(
            self.call("start_container", container_id=container_id)["container"]
        )

    def update_container(self, container_id: str, resources: Resources) -> UpdateResult:
        """UpdateContainerResources as the kubelet sends it (cpus/mems as the CPU manager
        would, shares/quota/memory limit as for a resize)."""
        answer = self.call(
            "update_container", container_id=container_id, resources=resources.to_json()
        )
        return UpdateResult.from_json(answer)

    def stop_container(self, container_id: str, exit_code: int = 0) -> StopResult:
        answer = self.call("stop_container", container_id=container_id, exit_code=exit_code)
        ctr = answer.get("container")
        return StopResult(
            updates=_outcomes(answer.get("updates")),
            container=Container.from_json(ctr) if ctr else None,
            ns=int(answer.get("ns") or 0),
        )

    def remove_container(self, container_id: str) -> tuple[UpdateOutcome, ...]:
        return _outcomes(self.call("remove_container", container_id=container_id)["updates"])

    def containers(self, pod_id: str = "", *, with_spec: bool = False) -> list[Container]:
        answer = self.call("containers", pod_id=pod_id, with_spec=with_spec)
        return [Container.from_json(c) for c in answer["containers"]]

    def container(self, container_id: str, *, with_spec: bool = False) -> Container:
        answer = self.call("container", container_id=container_id, with_spec=with_spec)
        return Container.from_json(answer["container"])

    def pods(self) -> list[Pod]:
        return [Pod.from_json(p) for p in self.call("pods")["pods"]]

    def syncs(self) -> list[SyncRecord]:
        return [SyncRecord.from_json(s) for s in self.call("syncs")["syncs"]]

    def wait_sync(self, count: int, timeout: float = 30.0) -> list[SyncRecord]:
        """Wait until ``count`` Synchronize calls (in total, all plugins and restarts)
        have completed; returns every sync record."""
        answer = self.call("wait_sync", timeout=timeout, count=count)
        return [SyncRecord.from_json(s) for s in answer["syncs"]]

    def unsolicited(self) -> list[UnsolicitedCall]:
        return self._unsolicited(self.call("unsolicited"))

    def wait_unsolicited(self, count: int, timeout: float = 30.0) -> list[UnsolicitedCall]:
        """Wait until plugins have made ``count`` UpdateContainers calls in total."""
        return self._unsolicited(self.call("wait_unsolicited", timeout=timeout, count=count))

    @staticmethod
    def _unsolicited(answer: Mapping[str, Any]) -> list[UnsolicitedCall]:
        return [
            UnsolicitedCall(
                at=int(c["at"]),
                updates=int(c["updates"]),
                outcomes=_outcomes(c.get("outcomes")),
                failed=tuple(c.get("failed") or ()),
                error=c.get("error") or "",
            )
            for c in answer["calls"]
        ]

    def events(self, since: int = 0) -> list[PluginEvent]:
        """Requests sent to plugins after sequence number ``since``."""
        answer = self.call("events", since=since)
        return [
            PluginEvent(
                seq=int(e["seq"]),
                at=int(e["at"]),
                method=e["method"],
                event=e["event"],
                pod=e.get("pod") or "",
                container=e.get("container") or "",
                ns=int(e.get("ns") or 0),
                error=e.get("error") or "",
            )
            for e in answer["events"]
        ]

    def plugins(self) -> list[PluginRecord]:
        return [PluginRecord.from_json(p) for p in self.call("plugins")["plugins"]]

    def refusals(self) -> list[Refusal]:
        return _refusals(self.call("plugins").get("refused"))

    def wait_refused(self, count: int, timeout: float = 30.0) -> list[Refusal]:
        """Wait until the adaptation has refused ``count`` plugin connections in total."""
        return _refusals(self.call("wait_refused", timeout=timeout, count=count)["refused"])

    def wait_plugin(self, name: str, timeout: float = 30.0) -> PluginRecord:
        """Wait until plugin ``name`` ("<idx>-<name>") is connected and synchronized to the
        adaptation as it runs now (after a restart: reconnected and resynchronized)."""
        answer = self.call("wait_plugin", timeout=timeout, name=name)
        return PluginRecord.from_json(answer["plugin"])

    def wait_plugin_closed(self, name: str, timeout: float = 30.0) -> PluginRecord:
        answer = self.call("wait_plugin_closed", timeout=timeout, name=name)
        return PluginRecord.from_json(answer["plugin"])

    def fail_updates(self, container_ids: Iterable[str], error: str = "injected failure") -> None:
        """Make updates of these containers fail from now on, as a runc error would;
        ``error=""`` heals them."""
        self.call("fail_updates", container_ids=list(container_ids), error=error)

    def restart(self, down: float = 0.2) -> int:
        """A containerd restart: every plugin connection closes, the socket is gone for
        ``down`` seconds, then a new adaptation listens on it. The model survives.
        Returns the new generation number."""
        return int(self.call("restart", down=down)["generation"])


# -- for tests --------------------------------------------------------------------------------


class NRIFactory:
    """Starts NRI runtime harnesses (and Go stub plugins) for a test, each on a short
    socket path of its own, and stops them all afterwards (``nri_runtime_factory``)."""

    def __init__(self, binaries: PeerBinaries, workdir: Path) -> None:
        self._binaries = binaries
        self._workdir = workdir
        self.runtimes: list[NRIRuntime] = []
        self.plugins: list[GoStubPlugin] = []

    def __call__(
        self,
        version: str,
        *,
        online_cpus: str = "0-15",
        online_mems: str = "",
        registration_timeout: float | None = None,
        request_timeout: float | None = None,
        runtime_version: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> NRIRuntime:
        """A started runtime harness at NRI ``version`` (one of NRI_VERSIONS)."""
        if version not in NRI_VERSIONS:
            raise ValueError(f"no NRI harness for {version}; known: {', '.join(NRI_VERSIONS)}")
        workdir = self._workdir / f"nri-{len(self.runtimes)}"
        runtime = NRIRuntime(
            self._binaries.nri_runtime(version),
            version,
            workdir / "nri.sock",
            workdir,
            online_cpus=online_cpus,
            online_mems=online_mems,
            registration_timeout=registration_timeout,
            request_timeout=request_timeout,
            runtime_version=runtime_version,
            extra_args=extra_args,
        )
        self.runtimes.append(runtime)
        runtime.start()
        return runtime

    def stub_plugin(
        self,
        runtime: NRIRuntime,
        *,
        claims: Mapping[str, tuple[str, str]] | None = None,
        online_cpus: str | None = None,
        online_mems: str = "",
        name: str = "stub",
        index: str = "10",
        driver: str = "",
        ignore_failure: bool = False,
        wait: bool = True,
    ) -> GoStubPlugin:
        """Start the Go stub plugin (built at the runtime's NRI version) on ``runtime``'s
        socket and, with ``wait``, wait until it is connected and synchronized."""
        plugin = GoStubPlugin(
            self._binaries.nri_stub_plugin(runtime.version),
            runtime.socket,
            runtime.workdir,
            online_cpus=online_cpus or runtime.online_cpus or "0-15",
            online_mems=online_mems,
            claims=claims,
            name=name,
            index=index,
            driver=driver,
            ignore_failure=ignore_failure,
        )
        self.plugins.append(plugin)
        plugin.start()
        if wait:
            runtime.wait_plugin(plugin.plugin_name)
        return plugin

    def stop_all(self) -> None:
        for plugin in reversed(self.plugins):
            plugin.stop()
        for runtime in reversed(self.runtimes):
            runtime.stop()

    def log_tails(self, lines: int = 40) -> dict[str, str]:
        tails: dict[str, str] = {}
        for runtime in self.runtimes:
            tails.update(runtime.log_tails(lines))
        for plugin in self.plugins:
            tails.update(plugin.log_tails(lines))
        return tails
