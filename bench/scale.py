"""Benchmark 5 (``--scale``): many nodes' nodedra on one control plane, and what a node pays.

Every node's nodedra watches every ResourceClaim of the cluster, so what matters is the
slope: what each instance keeps and spends per claim that is not its own, and what the API
server spends per watcher. One control plane; ``scale_nodes`` instances of the real
``nodedra run``, each with a node of its own (the first with a kubelet harness, to time
prepares); ``scale_claims`` claims created (a third unallocated, a third of another driver,
a third allocated to nodedra on one of the nodes, round robin), then churned (deleted and
created again at ``churn_rate`` a second) while the first node's prepares are timed, then
one instance restarted with all of them in the cluster. Before any instance starts, the
API server's cost of the same kind of claims without watchers is measured, so that the
difference is what the watchers cost it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.claims import Allocation, create_claim, create_claims, delete_claims
from bench.env import (
    GO_DRIVER,
    RESOURCE_API,
    TOPOLOGY_AWARE,
    BenchCluster,
    Spawned,
    complete_pool,
    poll,
)
from bench.plan import Plan
from bench.prepare import CONSUMED
from bench.procstat import MIB, Usage, settle, usage
from bench.stats import summary_ms

OTHER_DRIVER = "other.bench.nodedra.test"
NAMESPACE = "bench-scale"


def _allocation(i: int, nodes: Sequence[str]) -> Allocation | None:
    if i % 3 == 0:
        return None
    if i % 3 == 1:
        return Allocation(OTHER_DRIVER, nodes[i % len(nodes)], "dev-0")
    node = nodes[(i // 3) % len(nodes)]
    return Allocation(TOPOLOGY_AWARE, node, f"cpudevnuma00{i % 4}", CONSUMED)


class _Watcher:
    """Samples the usage of a set of processes every ``interval`` seconds, in a thread."""

    def __init__(self, pids: Mapping[str, int], interval: float = 2.0) -> None:
        self._pids = dict(pids)
        self._interval = interval
        self._stop = threading.Event()
        self.samples: list[tuple[float, dict[str, Usage]]] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Watcher:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        started = time.monotonic()
        while True:
            now: dict[str, Usage] = {}
            for name, pid in self._pids.items():
                try:
                    now[name] = usage(pid)
                except OSError:
                    continue
            self.samples.append((round(time.monotonic() - started, 1), now))
            if self._stop.wait(self._interval):
                return


def _usages(processes: Mapping[str, int]) -> dict[str, Usage]:
    return {name: usage(pid) for name, pid in processes.items()}


def _spread(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "min": round(ordered[0], 2),
        "median": round(ordered[len(ordered) // 2], 2),
        "max": round(ordered[-1], 2),
    }


def _create(env: BenchCluster, names: Sequence[str], nodes: Sequence[str]) -> float:
    """Create the claims ``names`` (allocated by their index); the seconds it took."""
    started = time.monotonic()
    create_claims(
        env.api,
        NAMESPACE,
        names,
        [_allocation(i, nodes) for i in range(len(names))],
        threads=8,
    )
    return time.monotonic() - started


def _churn(
    env: BenchCluster, nodes: Sequence[str], total: int, rate: float, seconds: float
) -> tuple[int, float]:
    """Delete claims and create them again at ``rate`` a second; (claims churned, seconds)."""
    stop = time.monotonic() + seconds
    done = 0

    def one(i: int) -> None:
        name = f"c-{i}"
        env.api.call("DELETE", f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims/{name}")
        create_claim(env.api, NAMESPACE, name, _allocation(i, nodes))

    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        futures = []
        while time.monotonic() < stop:
            due = started + done / rate
            if due > time.monotonic():
                time.sleep(due - time.monotonic())
            futures.append(pool.submit(one, done % total))
            done += 1
        for future in futures:
            future.result()
    return done, time.monotonic() - started


class _Scale:
    """One scale run, phase by phase; ``results`` fills up as the phases run."""

    def __init__(
        self, env: BenchCluster, sysfs: Path, plan: Plan, say: Callable[[str], None]
    ) -> None:
        self.env, self.sysfs, self.plan, self.say = env, sysfs, plan, say
        self.nodes = [f"scale-{i}" for i in range(plan.scale_nodes)]
        self.kubelet = env.kubelet(self.nodes[0])
        for node in self.nodes[1:]:
            env.node(node)
        self.apiserver = env.cp.processes["kube-apiserver"].pid
        self.instances: dict[str, Spawned] = {}
        self.results: dict[str, Any] = {
            "nodes": plan.scale_nodes,
            "claims": plan.scale_claims,
            "instance": {},
            "apiserver": {},
        }

    @property
    def pids(self) -> dict[str, int]:
        return {node: op.pid for node, op in self.instances.items()}

    def apiserver_alone(self) -> float:
        """The API server's CPU seconds creating the baseline claims with nobody watching."""
        alone = self.plan.scale_baseline_claims
        before = usage(self.apiserver)
        seconds = _create(self.env, [f"b-{i}" for i in range(alone)], self.nodes)
        cpu = usage(self.apiserver).cpu_seconds - before.cpu_seconds
        self.say(f"  API server, no watchers: {alone} claims in {seconds:.0f} s, {cpu:.1f} s CPU")
        delete_claims(self.env.api, NAMESPACE)
        poll(lambda: not _claim_names(self.env) or None, 300, "the baseline claims to be gone")
        self.results["apiserver"].update(baseline_claims=alone, baseline_cpu_seconds=round(cpu, 1))
        return cpu

    def start_instances(self) -> dict[str, Usage]:
        """Every node's nodedra, started and settled; their usage then."""
        rss_before = usage(self.apiserver).rss_bytes
        for i, node in enumerate(self.nodes):
            registry = self.kubelet.registry_dir if i == 0 else self._registry(node)
            self.instances[node] = self.env.nodedra_run(
                node, registry, self.sysfs, name=f"nodedra-{node}"
            )
        for node in self.nodes:
            self._wait_published(node)
        self.kubelet.wait_registered(TOPOLOGY_AWARE, timeout=120)
        settle(self.pids.values(), self.plan.settle_seconds, timeout=120)
        idle = _usages(self.pids)
        rss_idle = usage(self.apiserver).rss_bytes
        rss = _spread([u.rss_bytes / MIB for u in idle.values()])
        self.say(
            f"  {len(self.nodes)} instances idle: RSS {rss} MiB; API server RSS "
            f"{rss_before / MIB:.0f} -> {rss_idle / MIB:.0f} MiB"
        )
        self.results["instance"].update(
            idle_rss_mib=rss,
            idle_cpu_seconds_since_start=_spread([u.cpu_seconds for u in idle.values()]),
        )
        self.results["apiserver"].update(
            rss_mib_before_watchers=round(rss_before / MIB, 1),
            rss_mib_idle_with_watchers=round(rss_idle / MIB, 1),
        )
        return idle

    def create(self, idle: Mapping[str, Usage], alone_cpu: float) -> list[dict[str, Any]]:
        """Create the cluster's claims, sampling every instance and the API server."""
        claims, nodes = self.plan.scale_claims, self.nodes
        apiserver_before = usage(self.apiserver)
        with _Watcher({**self.pids, "kube-apiserver": self.apiserver}) as sampled:
            seconds = _create(self.env, [f"c-{i}" for i in range(claims)], nodes)
            settle(self.pids.values(), 0, timeout=120)
        created = _usages(self.pids)
        apiserver = usage(self.apiserver)
        events = claims + 2 * claims // 3  # every claim created, two thirds allocated after
        cpu = _spread(
            [(created[n].cpu_seconds - idle[n].cpu_seconds) * 1000 / events for n in nodes]
        )
        rss = _spread(
            [(created[n].rss_bytes - idle[n].rss_bytes) / MIB * 10000 / claims for n in nodes]
        )
        apiserver_cpu = apiserver.cpu_seconds - apiserver_before.cpu_seconds
        alone = self.plan.scale_baseline_claims
        per_watcher = (apiserver_cpu - alone_cpu * claims / alone) / len(nodes)
        self.say(
            f"  {claims} claims created in {seconds:.0f} s ({events} watch events): per "
            f"instance CPU s per 1000 events {cpu}, RSS MiB per 10,000 claims {rss}; API "
            f"server {apiserver_cpu:.0f} s CPU, RSS {apiserver.rss_bytes / MIB:.0f} MiB"
        )
        self.results.update(watch_events=events, create_seconds=round(seconds, 1))
        self.results["instance"].update(
            cpu_seconds_per_1000_events=cpu, rss_mib_per_10000_claims=rss
        )
        self.results["apiserver"].update(
            rss_mib_after_claims=round(apiserver.rss_bytes / MIB, 1),
            create_cpu_seconds=round(apiserver_cpu, 1),
            cpu_seconds_per_watcher_per_1000_claims=round(per_watcher * 1000 / claims, 3),
        )
        return [
            {"t": t, **{n: [round(u.cpu_seconds, 2), round(u.rss_bytes / MIB, 1)] for n, u in s}}
            for t, s in ((t, s.items()) for t, s in sampled.samples)
        ]

    def _prepares(
        self, claims: Mapping[str, Sequence[Mapping[str, str]]], until: Callable[[], bool]
    ) -> dict[str, dict[str, float]]:
        """Prepare latency of each driver on the first node, in alternating rounds of 20."""
        timed: dict[str, list[int]] = {driver: [] for driver in claims}
        while not until():
            for driver, claim in claims.items():
                timed[driver] += self.kubelet.bench_prepare(driver, claim, 20, timeout=900)[0]
        return {driver: summary_ms(ns) for driver, ns in timed.items()}

    def prepares(self, claims: Mapping[str, Sequence[Mapping[str, str]]]) -> None:
        """The first node's prepares, nodedra's and the Go driver's, quiet then in a churn.

        The Go driver watches no claims: how much slower it gets is the machine's share.
        """
        plan = self.plan
        rounds = iter(range(plan.scale_prepares // 20))
        quiet = self._prepares(claims, lambda: next(rounds, None) is None)
        before, apiserver_before = _usages(self.pids), usage(self.apiserver)
        churned: dict[str, float] = {}

        def churn() -> None:
            count, seconds = _churn(
                self.env, self.nodes, plan.scale_claims, plan.churn_rate, plan.churn_seconds
            )
            churned.update(claims=count, seconds=round(seconds, 1))

        churner = threading.Thread(target=churn)
        churner.start()
        busy = self._prepares(claims, lambda: not churner.is_alive())
        churner.join()
        settle(self.pids.values(), 0, timeout=120)
        after, apiserver_after = _usages(self.pids), usage(self.apiserver)
        seconds = churned["seconds"]
        rate = churned["claims"] / seconds
        cpu = _spread(
            [(after[n].cpu_seconds - before[n].cpu_seconds) / seconds * 100 for n in self.nodes]
        )
        self.say(
            f"  churn: {churned['claims']:.0f} claims deleted and created in {seconds} s "
            f"({rate:.0f}/s): instance CPU {cpu} % of a core; prepare p50/p99 quiet, churn: "
            + "; ".join(
                f"{d} {quiet[d]['p50']:.1f}/{quiet[d]['p99']:.1f}, "
                f"{busy[d]['p50']:.1f}/{busy[d]['p99']:.1f} ms"
                for d in claims
            )
        )
        self.results["prepare_ms"] = {
            "nodedra" if d == TOPOLOGY_AWARE else "go": {"quiet": quiet[d], "churn": busy[d]}
            for d in claims
        }
        self.results["churn"] = {**churned, "rate_per_second": round(rate, 1)}
        self.results["instance"]["churn_cpu_percent"] = cpu
        self.results["apiserver"]["churn_cpu_percent"] = round(
            (apiserver_after.cpu_seconds - apiserver_before.cpu_seconds) / seconds * 100, 1
        )

    def restart(self, idle: Mapping[str, Usage]) -> None:
        """One instance restarts with every claim in the cluster."""
        node = self.nodes[1]
        self.instances.pop(node).stop()
        again = self.env.nodedra_run(
            node, self._registry(node), self.sysfs, name=f"nodedra-{node}-again"
        )
        self.instances[node] = again
        self._wait_published(node)
        settle([again.pid], self.plan.settle_seconds, timeout=120)
        restart = usage(again.pid)
        first = idle[node]
        self.say(
            f"  restart with {self.plan.scale_claims} claims: {restart.cpu_seconds:.2f} s CPU "
            f"since start, RSS {restart.rss_bytes / MIB:.0f} MiB (first start: "
            f"{first.cpu_seconds:.2f} s, {first.rss_bytes / MIB:.0f} MiB)"
        )
        self.results["instance"]["restart"] = {
            "cpu_seconds_since_start": round(restart.cpu_seconds, 2),
            "rss_mib": round(restart.rss_bytes / MIB, 1),
            "first_start_cpu_seconds": round(first.cpu_seconds, 2),
            "first_start_rss_mib": round(first.rss_bytes / MIB, 1),
        }

    def stop(self) -> None:
        for op in self.instances.values():
            op.stop()
        delete_claims(self.env.api, NAMESPACE)

    def _registry(self, node: str) -> Path:
        """A plugin registry directory no kubelet watches: only the first node has one."""
        directory = self.env.workdir / f"registry-{node}"
        directory.mkdir(parents=True, exist_ok=True)
        return directory

    def _wait_published(self, node: str) -> None:
        poll(lambda: complete_pool(self.env.api.slices(node, TOPOLOGY_AWARE), 4), 120, node)


def run(env: BenchCluster, sysfs: Path, plan: Plan, say: Callable[[str], None]) -> dict[str, Any]:
    """Run the scale benchmark; its results."""
    scale = _Scale(env, sysfs, plan, say)
    alone_cpu = scale.apiserver_alone()
    idle = scale.start_instances()
    node = scale.nodes[0]
    go = env.go_driver(node, scale.kubelet.registry_dir, devices=4, name="go-scale")
    scale.kubelet.wait_registered(GO_DRIVER, timeout=120)
    go_device = poll(lambda: complete_pool(env.api.slices(node, GO_DRIVER), 4), 60, "Go")[0]
    claims = {
        driver: create_claims(env.api, "bench-scale-own", [name], [allocation])
        for driver, name, allocation in (
            (TOPOLOGY_AWARE, "own", Allocation(TOPOLOGY_AWARE, node, "cpudevnuma000", CONSUMED)),
            (GO_DRIVER, "go", Allocation(GO_DRIVER, node, go_device)),
        )
    }
    samples = scale.create(idle, alone_cpu)
    scale.prepares(claims)
    go.stop()
    scale.restart(idle)
    scale.stop()
    return {**scale.results, "samples": samples}


def _claim_names(env: BenchCluster) -> list[str]:
    answer = env.api.call("GET", f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims")
    return [c["metadata"]["name"] for c in answer.get("items") or []]
