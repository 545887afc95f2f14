"""Pods on a real test node (tests.peers.node) and the ground truth about their containers.

What a test needs around a real pod: a manifest for the probe image (hostNetwork, never
pulled), waiting until it runs (failing early, with the pod's events, when it cannot), its log
through the API server, the reports the probe writes there, and what the machine itself says
about the container's process: /proc/<pid>/status and the cpuset files of its cgroup.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.peers.build import PeerBinaries
from tests.peers.cgroups import cgroup_path, hierarchy_of
from tests.peers.cluster import get_pod, poll
from tests.peers.controlplane import APIError, ControlPlane
from tests.peers.oci import ImageSpec

#: The node's images (tests.peers.node imports them into every node).
PAUSE_IMAGE = "nodedra.test/pause:v1"
WORKLOAD_IMAGE = "nodedra.test/workload:v1"
WORKLOAD_CONTAINER = "workload"


def node_image_specs(binaries: PeerBinaries) -> tuple[ImageSpec, ...]:
    """The images every node has imported, never pulled: pause and workload (the host's real
    node imports them at start, the VM node's image carries their archives)."""
    return (
        ImageSpec(PAUSE_IMAGE, binaries.pause, "pause"),
        ImageSpec(WORKLOAD_IMAGE, binaries.workload, "workload"),
    )


#: Reasons a container waits for that no amount of waiting fixes.
_HOPELESS = frozenset(
    {
        "ErrImageNeverPull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "CrashLoopBackOff",
        "ImageInspectError",
    }
)


def workload_pod(
    name: str,
    *,
    node_name: str | None = None,
    node_selector: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    report_interval: str | None = None,
    env_prefixes: Sequence[str] | None = None,
    claims: Sequence[Mapping[str, Any]] = (),
    container_claims: Sequence[str] | None = None,
    image: str = WORKLOAD_IMAGE,
    restart_policy: str = "Always",
    resources: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, Any]:
    """A hostNetwork pod running the probe (``cmd/workload``).

    ``node_name`` binds it to a node directly (no scheduler involved); otherwise the scheduler
    places it, e.g. with ``node_selector`` ``{"kubernetes.io/hostname": node}``. ``claims`` are
    the pod's ``spec.resourceClaims``; the container uses all of them unless
    ``container_claims`` names some. ``report_interval`` (a Go duration) makes the probe report
    again periodically; ``env_prefixes`` chooses the variables it reports (default DRA_).
    ``resources``: the container's ``requests`` and ``limits``.
    """
    container_env = dict(env or {})
    if report_interval is not None:
        container_env["WORKLOAD_REPORT_INTERVAL"] = report_interval
    if env_prefixes is not None:
        container_env["WORKLOAD_ENV_PREFIXES"] = ",".join(env_prefixes)
    container: dict[str, Any] = {
        "name": WORKLOAD_CONTAINER,
        "image": image,
        "imagePullPolicy": "Never",
        "env": [{"name": k, "value": v} for k, v in sorted(container_env.items())],
    }
    used = [c["name"] for c in claims] if container_claims is None else list(container_claims)
    container["resources"] = {key: dict(value) for key, value in (resources or {}).items()}
    if used:
        container["resources"]["claims"] = [{"name": c} for c in used]
    spec: dict[str, Any] = {
        "hostNetwork": True,
        # No ServiceAccount token volume: it needs the root CA ConfigMap, which only the
        # controller-manager publishes, and the probe never talks to the API.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "restartPolicy": restart_policy,
        "terminationGracePeriodSeconds": 5,
        "containers": [container],
    }
    if node_name is not None:
        spec["nodeName"] = node_name
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if claims:
        spec["resourceClaims"] = [dict(c) for c in claims]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def create_pod(cp: ControlPlane, namespace: str, pod: Mapping[str, Any]) -> dict[str, Any]:
    created: dict[str, Any] = cp.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
    return created


def pod_events(cp: ControlPlane, namespace: str, name: str) -> list[str]:
    """The pod's events, oldest first, one line each (for failure messages)."""
    query = urllib.parse.urlencode({"fieldSelector": f"involvedObject.name={name}"})
    events = cp.request("GET", f"/api/v1/namespaces/{namespace}/events?{query}")["items"]
    events.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    return [
        f"{e.get('type')} {e.get('reason')}: {e.get('message', '').strip()}"
        + (f" (x{e['count']})" if e.get("count", 1) > 1 else "")
        for e in events
    ]


def _container_states(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    statuses: list[Mapping[str, Any]] = (pod.get("status") or {}).get("containerStatuses") or []
    return statuses


def wait_pod_running(
    cp: ControlPlane, namespace: str, name: str, timeout: float = 120.0
) -> dict[str, Any]:
    """Wait until every container of the pod runs; fail at once when the pod failed or a
    container waits for something that will not come (an image it may not pull, a spec
    the runtime refused), with the pod's status and events."""
    pod: dict[str, Any] = {}

    def check() -> dict[str, Any] | None:
        nonlocal pod
        pod = get_pod(cp, namespace, name)
        status = pod.get("status") or {}
        if status.get("phase") in ("Failed", "Succeeded"):
            raise AssertionError(f"pod {namespace}/{name} ended: {describe()}")
        states = _container_states(pod)
        for state in states:
            waiting = (state.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in _HOPELESS:
                raise AssertionError(f"pod {namespace}/{name} cannot start: {describe()}")
        containers = pod["spec"]["containers"]
        running = [s for s in states if "running" in (s.get("state") or {})]
        return pod if status.get("phase") == "Running" and len(running) == len(containers) else None

    def describe() -> str:
        status = pod.get("status") or {}
        return (
            f"phase {status.get('phase')}, node {pod.get('spec', {}).get('nodeName')}, "
            f"conditions {status.get('conditions')}, containers {_container_states(pod)}; "
            f"events: {pod_events(cp, namespace, name)}"
        )

    return poll(check, timeout, lambda: f"pod {namespace}/{name} to run: {describe()}", 0.2)


def pod_log(cp: ControlPlane, namespace: str, name: str, container: str | None = None) -> str:
    """The container's log, read through the API server (which asks the node's kubelet)."""
    query = f"?{urllib.parse.urlencode({'container': container})}" if container else ""
    return cp.get_text(f"/api/v1/namespaces/{namespace}/pods/{name}/log{query}")


def parse_reports(log: str) -> list[dict[str, Any]]:
    """The probe's JSON reports in a log, in order (other lines are skipped)."""
    reports = []
    for raw in log.splitlines():
        line = raw.strip()
        if line.startswith("{"):
            try:
                reports.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return reports


def wait_reports(
    cp: ControlPlane,
    namespace: str,
    name: str,
    count: int = 1,
    *,
    container: str = WORKLOAD_CONTAINER,
    timeout: float = 60.0,
) -> list[dict[str, Any]]:
    """Wait until the probe's log holds at least ``count`` reports; all of them.

    A kubelet that just (re)started answers for a pod only once it has synced it (until then
    the API server passes on its 404), so errors are retried until the timeout."""
    seen: list[dict[str, Any]] = []
    error = ""

    def check() -> list[dict[str, Any]] | None:
        nonlocal seen, error
        try:
            seen = parse_reports(pod_log(cp, namespace, name, container))
        except APIError as err:
            error = str(err)
            return None
        error = ""
        return seen if len(seen) >= count else None

    def describe() -> str:
        return f"{count} reports in the log of {namespace}/{name}: {seen}" + (
            f"; last error: {error}" if error else ""
        )

    return poll(check, timeout, describe, 0.2)


def container_id(pod: Mapping[str, Any], container: str = WORKLOAD_CONTAINER) -> str:
    """The runtime's ID of a running container of the pod (from its status)."""
    for state in _container_states(pod):
        if state.get("name") == container and state.get("containerID"):
            return str(state["containerID"]).split("://", 1)[-1]
    raise LookupError(f"pod {pod['metadata']['name']} has no container {container} with an ID")


# -- ground truth from the machine --------------------------------------------------------------


def proc_status(pid: int) -> dict[str, str]:
    """The fields of /proc/<pid>/status (``Cpus_allowed_list``, ``Mems_allowed_list``, ...)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


@dataclass(frozen=True)
class CpusetCgroup:
    """A process's cpuset cgroup (cgroup v1) as the machine sees it."""

    path: str
    directory: Path
    cpus: str
    mems: str
    effective_cpus: str
    effective_mems: str


def cpuset_cgroup(pid: int) -> CpusetCgroup:
    """Read the cpuset files of the cgroup that process ``pid`` is in."""
    path = cgroup_path(pid, "cpuset")
    directory = hierarchy_of("cpuset").mount / path.lstrip("/")

    def read(name: str) -> str:
        return (directory / name).read_text().strip()

    return CpusetCgroup(
        path=path,
        directory=directory,
        cpus=read("cpuset.cpus"),
        mems=read("cpuset.mems"),
        effective_cpus=read("cpuset.effective_cpus"),
        effective_mems=read("cpuset.effective_mems"),
    )


def online_cpus() -> str:
    """The machine's online CPUs as a list (``0-1``)."""
    return Path("/sys/devices/system/cpu/online").read_text().strip()


def online_mems() -> str:
    """The machine's memory nodes as a list (``0``)."""
    return Path("/sys/devices/system/node/has_memory").read_text().strip()
