"""The checks of a node before (and while) nodedra pins it: each a verdict and its fix.

Each check is a pure function of what was read (the kubelet's files, the Node, the
ResourceSlices of the node, the feature gates probed) and answers one :class:`Check`:
``ok``; ``unknown`` when what would tell is not there (never taken for fine); ``warn``
when nodedra works but something is off; ``fail`` when pinning would fight something or
cannot work. ``nodedra preflight`` prints them, and ``nodedra run`` runs the same ones at
start and periodically (:mod:`nodedra.preflight.gather`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from nodedra.topology import format_cpu_list, parse_cpu_list

from .kubelet import Read

Status = Literal["ok", "unknown", "warn", "fail"]
STATUSES: tuple[Status, ...] = ("ok", "unknown", "warn", "fail")

TROUBLESHOOTING = "docs/troubleshooting.md"
CPU_MANAGER_STEPS = (
    "move the node off the kubelet's CPU manager: kubectl drain the node; stop the kubelet; "
    "set cpuManagerPolicy: none in its configuration; remove its state file "
    "(<kubelet root>/cpu_manager_state); start the kubelet; kubectl uncordon the node "
    f"({TROUBLESHOOTING}, 'nodedra is not Ready: the kubelet's CPU manager')"
)
STALE_HINT = (
    "the kubelet has replaced the file since nodedra's pod started and the pod still sees "
    "the old one: delete nodedra's pod on this node (its DaemonSet starts another, which "
    "reads the file again)"
)
OTHER_CPU_DRIVERS = {
    "dra.cpu": "dra-driver-cpu (kubernetes-sigs)",
    "native.cpu": "nri-plugins' topology-aware policy with its DRA driver",
}
"""DRA drivers of other projects that set containers' cpusets through NRI."""
MIN_CONTAINERD = (2, 0)
"""The first containerd with NRI on by default, and the NRI protocol nodedra speaks."""


@dataclass(frozen=True)
class Check:
    """One check's verdict: what was found, and what to do about it (when not ok)."""

    name: str
    status: Status
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        """For ``/readyz`` and ``--json``."""
        return {"name": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}


def cpu_manager(state: Read, config: Read, asked: int = 0) -> Check:
    """The kubelet's CPU manager policy: anything but none pins containers too.

    The state file is the policy in effect; the configuration file what was meant (flags
    may override it). A static policy gives Guaranteed pods exclusive CPUs that nodedra,
    answering the runtime last, would silently take back: a failure, and pinning is held.
    Where neither file tells, ``asked`` (cpusets the kubelet asked for, as the runtime
    reported) is the sign that it pins: a warning, since a count does not say when it stops.
    """
    name = "kubelet-cpu-manager"
    policy = state.get("policyName")
    if isinstance(policy, str) and policy != "none":
        detail = (
            f"the kubelet's CPU manager policy is {policy} ({state.path}): it gives "
            "Guaranteed pods exclusive CPUs and nodedra would override them at every "
            "container; claims are refused and no cpuset is changed until it is none"
        )
        return Check(
            name, "fail", detail, CPU_MANAGER_STEPS + (f"; {STALE_HINT}" if state.stale else "")
        )
    if policy == "none" and not state.stale:
        return Check(name, "ok", f"the kubelet's CPU manager policy is none ({state.path})")
    configured = config.get("cpuManagerPolicy")
    if configured is not None and str(configured) != "none":
        detail = (
            f"the kubelet's configuration file {config.path} sets cpuManagerPolicy: "
            f"{configured}: it gives Guaranteed pods exclusive CPUs that nodedra would "
            "override; claims are refused and no cpuset is changed until it is none"
        )
        return Check(name, "fail", detail, CPU_MANAGER_STEPS)
    why = STALE_HINT if policy == "none" else state.why
    if asked:
        return Check(
            name,
            "warn",
            f"the kubelet asked for a container's cpuset {asked} times since nodedra started, "
            "which it does only with a CPU manager policy other than none (nodedra overrides "
            f"it); the policy cannot be read: {why}",
            CPU_MANAGER_STEPS,
        )
    if config.data is not None:
        said = "cpuManagerPolicy: none" if configured else "no cpuManagerPolicy (default none)"
        return Check(name, "ok", f"{config.path} sets {said}; the state file: {why}")
    return Check(
        name,
        "unknown",
        f"cannot tell the kubelet's CPU manager policy: {why}; {config.why}",
        "mount the kubelet's state file (--kubelet-cpu-manager-state) or its configuration "
        "file (--kubelet-config) into nodedra's pod, or check cpuManagerPolicy by hand",
    )


def kubelet_managers(config: Read) -> Check:
    """The kubelet's memory and topology manager policies, which act on cpusets and NUMA."""
    name = "kubelet-memory-topology-managers"
    if config.data is None:
        return Check(name, "unknown", config.why, "pass --kubelet-config to check them")
    memory = str(config.get("memoryManagerPolicy") or "None")
    topology = str(config.get("topologyManagerPolicy") or "none")
    said = f"memoryManagerPolicy {memory}, topologyManagerPolicy {topology} ({config.path})"
    problems = []
    if memory != "None":
        problems.append(
            "the memory manager's Static policy sets Guaranteed pods' memory nodes too, "
            "where nodedra sets the claims'"
        )
    if topology in ("restricted", "single-numa-node"):
        problems.append(
            f"the topology manager's {topology} policy rejects pods by the kubelet's own "
            "hints, knowing nothing of the NUMA nodes of their claims"
        )
    if problems:
        fix = "set memoryManagerPolicy: None and topologyManagerPolicy: none on nodes nodedra pins"
        return Check(name, "warn", f"{said}: {'; '.join(problems)}", fix)
    return Check(name, "ok", said)


def reserved_cpus(reserved: frozenset[int], config: Read) -> Check:
    """The kubelet's ``reservedSystemCPUs`` must be among nodedra's ``reservedCPUs``.

    The kubelet keeps them for the system's daemons; nodedra would otherwise hand them to
    claims, and the daemons would share a claim's CPUs with its workload.
    """
    name = "reserved-cpus"
    ours = format_cpu_list(reserved) or "none"
    if config.data is None:
        return Check(name, "unknown", f"nodedra reserves {ours}; {config.why}")
    raw = config.get("reservedSystemCPUs")
    if not raw:
        return Check(name, "ok", f"the kubelet reserves no CPUs by list; nodedra reserves {ours}")
    try:
        theirs = parse_cpu_list(str(raw))
    except ValueError as err:
        return Check(name, "unknown", f"reservedSystemCPUs {raw!r} in {config.path}: {err}")
    missing = theirs - reserved
    if missing:
        return Check(
            name,
            "warn",
            f"the kubelet reserves CPUs {format_cpu_list(theirs)} for the system "
            f"(reservedSystemCPUs), nodedra only {ours}: claims may get "
            f"{format_cpu_list(missing)}, which the system's daemons use too",
            f'set reservedCPUs: "{format_cpu_list(reserved | theirs)}" in nodedra\'s configuration',
        )
    return Check(name, "ok", f"the kubelet's reservedSystemCPUs {raw} are among nodedra's {ours}")


def container_runtime(node: Mapping[str, Any] | None, why: str = "") -> Check:
    """The runtime and its version, as the kubelet reports them in the Node's status.

    containerd before 2.0 (1.7) has NRI off by default and speaks an older NRI protocol
    that nodedra is not tested with: refused, naming the version and the ways out.
    """
    name = "container-runtime"
    info = ((node or {}).get("status") or {}).get("nodeInfo") or {}
    version = str(info.get("containerRuntimeVersion") or "")
    if not version:
        return Check(name, "unknown", why or "the Node does not report its container runtime")
    kind, _, number = version.partition("://")
    found = re.match(r"v?(\d+)\.(\d+)", number)
    if kind == "containerd" and found and tuple(map(int, found.groups())) < MIN_CONTAINERD:
        return Check(
            name,
            "fail",
            f"{version}: containerd before 2.0 has NRI off by default and an older NRI "
            "protocol that nodedra is not tested with",
            "upgrade the node to containerd 2.0 or later (NRI on by default); running on "
            '1.7 with NRI enabled ([plugins."io.containerd.nri.v1.nri"] disable = false) '
            "is untested",
        )
    if kind in ("containerd", "cri-o"):
        return Check(name, "ok", version)
    return Check(
        name,
        "warn",
        f"{version}: nodedra is tested with containerd 2.x and CRI-O only",
        "pin through a runtime that serves NRI (containerd 2.x, CRI-O), or run with --pinning=off",
    )


def other_cpu_drivers(slices: Iterable[Mapping[str, Any]] | None, why: str = "") -> Check:
    """Other DRA drivers on this node known to set cpusets through NRI.

    Two NRI plugins setting one container's cpuset make the runtime refuse to create it
    ("plugins ... both tried to set"), so say it before containers fail. NRI plugins
    without a DRA driver (nri-plugins' policies, balloons) publish nothing to see.
    """
    name = "other-cpu-drivers"
    if slices is None:
        return Check(name, "unknown", why)
    found = sorted(
        {str((s.get("spec") or {}).get("driver")) for s in slices} & set(OTHER_CPU_DRIVERS)
    )
    if found:
        named = ", ".join(f"{d} ({OTHER_CPU_DRIVERS[d]})" for d in found)
        return Check(
            name,
            "fail",
            f"this node has ResourceSlices of {named}, which sets cpusets through NRI too: "
            "the runtime refuses a container whose cpuset two plugins set",
            "run one CPU driver per node: remove the other from this node (or nodedra)",
        )
    return Check(
        name,
        "ok",
        f"no ResourceSlices of {', '.join(sorted(OTHER_CPU_DRIVERS))} on this node (NRI "
        "plugins without a DRA driver, such as nri-plugins' policies, cannot be seen so)",
    )


def feature_gates(gates: Mapping[str, bool | None], meaning: Mapping[str, str]) -> Check:
    """The API server's feature gates nodedra probed: on, off (and what it costs), unknown."""
    name = "feature-gates"
    if not gates:
        return Check(name, "unknown", "no feature gate asked of the API server yet")
    off = [g for g, on in gates.items() if on is False]
    unknown = [g for g, on in gates.items() if on is None]
    said = ", ".join(
        f"{g} {'on' if on else 'off' if on is False else 'unknown'}" for g, on in gates.items()
    )
    if off:
        costs = "; ".join(f"{g}: {meaning.get(g, 'off')}" for g in off)
        return Check(name, "warn", f"{said}. {costs}", "turn the gates on, then restart nodedra")
    if unknown:
        return Check(name, "unknown", said)
    return Check(name, "ok", said)


LIST_GATE = "DRAListTypeAttributes"
FIRST_LIST_MATCHING = 37
"""The first Kubernetes minor whose scheduler meets ``matchAttribute`` over list attributes
(at 1.36 a constraint leaves the claim Pending, even between two equal lists)."""
SCALAR_FIX = (
    "leave numaNodeAttribute.form at scalar (its default) until the control plane runs "
    "Kubernetes 1.37 (docs/beside-devices.md)"
)


def numa_attribute(form: str, lists_on: bool | None, server_version: str) -> Check:
    """Whether ``numaNodeAttribute.form: list`` can work with this control plane.

    The list form is published only where the API server keeps lists
    (``DRAListTypeAttributes``); and the scheduler of a release before 1.37 matches no
    list, so a claim that aligns CPUs with another driver's device would stay Pending. The
    API server's release stands for the scheduler's (the same control plane).
    """
    name = "numa-attribute"
    attribute = "resource.kubernetes.io/numaNode"
    if form != "list":
        return Check(name, "ok", f"{attribute} published as the device's NUMA node ({form})")
    if lists_on is None:
        return Check(name, "unknown", f"{LIST_GATE} not asked of the API server yet")
    if not lists_on:
        return Check(
            name,
            "warn",
            f"numaNodeAttribute.form is list, but the API server drops lists ({LIST_GATE} "
            f"off): {attribute} is published as the scalar",
            f"turn {LIST_GATE} on in the API server and the scheduler, or {SCALAR_FIX}",
        )
    found = re.match(r"v?1\.(\d+)", server_version)
    if found is None:
        return Check(
            name, "unknown", f"numaNodeAttribute.form is list; API server {server_version!r}"
        )
    if int(found[1]) < FIRST_LIST_MATCHING:
        return Check(
            name,
            "warn",
            f"numaNodeAttribute.form is list and the API server is {server_version}: the "
            f"scheduler of that release matches no list attribute, so a claim that aligns "
            f"CPUs with another driver's device through matchAttribute on {attribute} stays "
            "Pending",
            SCALAR_FIX,
        )
    return Check(name, "ok", f"{attribute} published as a list (API server {server_version})")
