"""Benchmark 6: the pinning path, nodedra's NRI handling against a Go plugin on NRI's stub.

Every container the node creates passes through the NRI plugins before it runs, so this is
the hot path pinning adds. Two NRI runtime harnesses (``tests/peers/nri``: containerd's NRI
adaptation, driven as containerd's CRI plugin drives it) at the newest NRI version: one
with ``nodedra run`` connected (pinning required, its claims prepared through the kubelet
harness), one with the Go stub plugin (``cmd/nri-stub-plugin``, on
``github.com/containerd/nri/pkg/stub``) given the same claim UIDs and the same cpusets. Both
plugins do the same lookup: the claims named by the container's CDI devices, their CPUs,
and the shared pool for everything else. Timed by the harness, the same way for both (the
adaptation's own call, transport and plugin included): CreateContainer of a container with
a claim and of one without, the kubelet's UpdateContainerResources of a claim's container,
and Synchronize of a runtime with 1000 containers (a restart of the runtime, after which
each plugin reconnects and synchronizes).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.claims import Allocation, create_claims
from bench.env import TOPOLOGY_AWARE, BenchCluster, complete_pool, poll
from bench.plan import Plan
from bench.prepare import CONSUMED, start_timed
from bench.stats import ratio, summary_ms
from nodedra.dra.kube import RESOURCE_API
from tests.peers.cluster import ensure_test_namespace
from tests.peers.kubelet import KubeletHarness
from tests.peers.nri_protocol import BulkSpec, ContainerSpec, PodSpec, Resources
from tests.peers.nri_runtime import NRIFactory, NRIRuntime
from tests.peers.peer_groups import NRI_VERSIONS

NODE = "bench-nri"
NAMESPACE = "bench-nri"
VERSION = NRI_VERSIONS[-1]
ONLINE = "0-159"
"""The generated sysfs of the benchmarks: 160 CPUs in 4 NUMA nodes."""
MEMS = "0-3"
CLAIM_PODS = 16
SYNC_CONTAINERS = 1000
CASES = ("create, with a claim", "create, no claim", "update, with a claim")


@dataclass(frozen=True)
class ClaimPod:
    """A pod whose claim the kubelet prepared, and the CDI devices its container gets."""

    name: str
    uid: str
    claim_uid: str
    cdi_devices: list[str]


@dataclass
class Side:
    """One plugin under test and the runtime it is connected to."""

    name: str
    runtime: NRIRuntime
    plugin_name: str
    timings: dict[str, list[int]]


def run(env: BenchCluster, sysfs: Path, plan: Plan, say: Callable[[str], None]) -> dict[str, Any]:
    """Run benchmark 6; its results."""
    kubelet = env.kubelet(NODE)
    nri = NRIFactory(env.binaries, env.workdir / "nri")
    env.on_exit(nri.stop_all)
    ours = nri(VERSION, online_cpus=ONLINE, online_mems=MEMS)
    op, _ = start_timed(
        kubelet,
        TOPOLOGY_AWARE,
        lambda: env.nodedra_run(
            NODE, kubelet.registry_dir, sysfs, name="nodedra-run-nri", nri_socket=ours.socket
        ),
    )
    plugin = poll(lambda: _connected(ours), 60, "nodedra's NRI connection")
    pods = _claim_pods(env, kubelet)
    theirs = nri(VERSION, online_cpus=ONLINE, online_mems=MEMS)
    stub = nri.stub_plugin(
        theirs,
        claims={pod.claim_uid: (f"{i + 1}", "0") for i, pod in enumerate(pods)},
        online_mems=MEMS,
        driver=TOPOLOGY_AWARE,
    )
    try:
        sides = [
            Side("nodedra", ours, plugin, {c: [] for c in CASES}),
            Side("go", theirs, stub.plugin_name, {c: [] for c in CASES}),
        ]
        for side in sides:
            _pods(side.runtime, pods)
        ids = itertools.count()
        per_round = max(1, plan.nri_iterations // plan.rounds)
        for round_ in range(plan.rounds):
            for side in sides[round_ % 2 :] + sides[: round_ % 2]:
                _round(side, pods, per_round, ids, warmup=2 if round_ == 0 else 0)
        syncs = {side.name: _syncs(side, plan.nri_syncs) for side in sides}
    finally:
        op.stop()
        nri.stop_all()
    rows: list[dict[str, Any]] = [
        {"case": case, "driver": side.name, "ms": summary_ms(side.timings[case])}
        for case in CASES
        for side in sides
    ]
    rows += [
        {"case": f"synchronize, {SYNC_CONTAINERS} containers", "driver": name, "ms": summary_ms(ns)}
        for name, ns in syncs.items()
    ]
    for row in rows:
        say(
            f"  {row['driver']:8} {row['case']:34} p50 {row['ms']['p50']:.2f} ms "
            f"p99 {row['ms']['p99']:.2f} ms ({row['ms']['n']} calls)"
        )
    by = {(r["case"], r["driver"]): r["ms"] for r in rows}
    return {
        "nri_version": VERSION,
        "claim_pods": CLAIM_PODS,
        "rows": rows,
        "ratios": [
            {
                "case": case,
                "p50": ratio(by[case, "nodedra"]["p50"], by[case, "go"]["p50"]),
                "p99": ratio(by[case, "nodedra"]["p99"], by[case, "go"]["p99"]),
            }
            for case in dict.fromkeys(r["case"] for r in rows)
        ],
    }


def _connected(runtime: NRIRuntime) -> str | None:
    """The name of the plugin synchronized with ``runtime``, once there is one."""
    return next((p.name for p in runtime.plugins() if p.synchronized and not p.closed), None)


def _claim_pods(env: BenchCluster, kubelet: KubeletHarness) -> list[ClaimPod]:
    """Pods with a claim of one CPU each, prepared by the kubelet."""
    devices = poll(lambda: complete_pool(env.api.slices(NODE, TOPOLOGY_AWARE), 4), 60, "slices")
    names = [f"pin-{i}" for i in range(CLAIM_PODS)]
    refs = create_claims(
        env.api,
        NAMESPACE,
        names,
        [Allocation(TOPOLOGY_AWARE, NODE, devices[i % 4], CONSUMED) for i in range(CLAIM_PODS)],
    )
    ensure_test_namespace(env.cp, NAMESPACE)  # pods need its service account
    pods = []
    for name, ref in zip(names, refs, strict=True):
        pod = env.api.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", _pod(name))
        _reserve(env, ref, pod["metadata"])
        (ids,) = kubelet.prepare(NAMESPACE, name).values()
        pods.append(ClaimPod(name, pod["metadata"]["uid"], ref["uid"], ids))
    return pods


def _pod(name: str) -> dict[str, Any]:
    """A pod on the node whose container uses claim ``name`` (bound: no scheduler here)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": NODE,
            "resourceClaims": [{"name": "cpus", "resourceClaimName": name}],
            "containers": [
                {"name": "main", "image": "bench", "resources": {"claims": [{"name": "cpus"}]}}
            ],
        },
    }


def _reserve(env: BenchCluster, ref: Mapping[str, str], pod: Mapping[str, Any]) -> None:
    """Reserve the claim for the pod, as the scheduler does (the kubelet checks it)."""
    path = f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims/{ref['name']}/status"
    claim = env.api.call("GET", path.removesuffix("/status"))
    claim["status"]["reservedFor"] = [{"resource": "pods", "name": pod["name"], "uid": pod["uid"]}]
    env.api.call("PUT", path, claim)


def _pods(runtime: NRIRuntime, pods: Sequence[ClaimPod]) -> None:
    """The claim pods' sandboxes, and one pod without claims."""
    for i, pod in enumerate(pods):
        runtime.run_pod(PodSpec(f"sb-{i}", name=pod.name, namespace=NAMESPACE, uid=pod.uid))
    runtime.run_pod(PodSpec("sb-plain", name="plain", namespace=NAMESPACE, uid="plain"))


def _round(
    side: Side,
    pods: Sequence[ClaimPod],
    count: int,
    ids: Iterator[int],
    warmup: int,
) -> None:
    """``count`` of each case on one side (after ``warmup`` untimed ones)."""
    runtime = side.runtime
    for n in range(warmup + count):
        timed = n >= warmup
        k = next(ids)
        pod = k % len(pods)
        claimed = ContainerSpec(
            f"c-{k}", f"sb-{pod}", name="main", cdi_devices=pods[pod].cdi_devices
        )
        created = runtime.create_container(claimed, start=True)
        updated = runtime.update_container(claimed.id, Resources(cpus=ONLINE))
        plain = runtime.create_container(
            ContainerSpec(f"p-{k}", "sb-plain", name="main"), start=True
        )
        pinned, shared = created.container.cpus, plain.container.cpus
        if not pinned or not shared or pinned in (shared, ONLINE):
            # Timings of a plugin that does not pin would be meaningless.
            raise RuntimeError(
                f"{side.name} ran the claim's container on {pinned!r}, the other on {shared!r}"
            )
        if timed:
            side.timings[CASES[0]].append(created.ns)
            side.timings[CASES[2]].append(updated.ns)
            side.timings[CASES[1]].append(plain.ns)
        for container in (claimed.id, f"p-{k}"):
            runtime.stop_container(container)
            runtime.remove_container(container)


def _syncs(side: Side, count: int) -> list[int]:
    """Synchronize with ``SYNC_CONTAINERS`` containers in the runtime, ``count`` times."""
    runtime = side.runtime
    runtime.add(bulk=BulkSpec(SYNC_CONTAINERS, pods=SYNC_CONTAINERS // 10, prefix="sync"))
    done = len([s for s in runtime.syncs() if s.done])
    timings = []
    for _ in range(count):
        runtime.restart(down=0.2)
        done += 1
        (*_, latest) = runtime.wait_sync(done, timeout=120)
        timings.append(latest.ns)
    return timings
