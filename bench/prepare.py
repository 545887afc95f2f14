"""Benchmark 1: prepare and unprepare latency and throughput over the real Unix sockets.

The kubelet harness calls each driver's NodePrepareResources then NodeUnprepareResources
through the kubelet's own DRA client (op ``bench_prepare``) for 1, 8 and 64 claims per
request, and for 8 concurrent requests of one claim (pods starting together), and reports
every call's duration. The drivers do the same work for a claim: GET it from the real API
server, decide, write a CDI spec. nodedra also saves its checkpoint (fsync'd) once per
request, before the specs: that is its durability contract, and it is measured, not left
out. nodedra is measured as deployed (``nodedra run``: kopf, the claim watch, metrics and
the claim status writes included) and as its ResourceManager alone in a Python process
(``bench.manager_proc``, on a node of its own, since both are the same driver), to tell
what the operator adds; the Go drivers are the official kubeletplugin helper, bare and
with a durable record per claim.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.claims import Allocation, create_claims
from bench.env import (
    DURABLE_GO_DRIVER,
    GO_DRIVER,
    METADATA_GO_DRIVER,
    TOPOLOGY_AWARE,
    BenchCluster,
    Spawned,
    complete_pool,
    poll,
)
from bench.plan import Case, Plan
from bench.procstat import MIB, Sampler, wait_quiet
from bench.stats import percentile, ratio, summary_ms
from tests.peers.kubelet import KubeletHarness

NODE = "bench-prepare"
MANAGER_NODE = "bench-prepare-manager"
NAMESPACE = "bench-prepare"
CONSUMED = {"cpu": "1", "memory": "256Mi"}
TARGET_P99_RATIO = 1.5
"""The project's aim: one-claim prepare p99 within 1.5x of the Go peer's."""
STATUS_WRITES = "nodedra_claim_status_writes_total"


@dataclass(frozen=True)
class Driver:
    """One driver under test: its name, process, node and the kubelet harness driving it."""

    driver: str
    process: Spawned
    node: str
    kubelet: KubeletHarness


def registration_sockets(registry: Path, driver: str) -> list[Path]:
    """A driver's registration sockets.

    ``<driver>-reg.sock``, or ``<driver>-<pod UID>-reg.sock`` for an instance that may be
    updated beside another (as the DaemonSet runs nodedra).
    """
    return [*registry.glob(f"{driver}-reg.sock"), *registry.glob(f"{driver}-*-reg.sock")]


def start_timed(
    kubelet: KubeletHarness, driver: str, start: Callable[[], Spawned]
) -> tuple[Spawned, dict[str, float]]:
    """Start a driver; it and the seconds until its registration socket and registration.

    The socket appears when the driver is ready to be registered; the kubelet's plugin
    manager notices it on its next reconcile, which runs once a second, so the second
    figure is the first rounded up to that loop.
    """
    started = time.monotonic()
    spawned = start()
    poll(
        lambda: True if registration_sockets(kubelet.registry_dir, driver) else None,
        120,
        f"{driver}'s registration socket in {kubelet.registry_dir}",
        interval=0.005,
    )
    ready = time.monotonic() - started
    kubelet.wait_registered(driver, timeout=120)
    return spawned, {
        "socket": round(ready, 3),
        "registered": round(time.monotonic() - started, 3),
    }


def run(env: BenchCluster, sysfs: Path, plan: Plan, say: Callable[[str], None]) -> dict[str, Any]:
    """Run benchmark 1; its results."""
    kubelet = env.kubelet(NODE)
    manager_kubelet = env.kubelet(MANAGER_NODE)
    devices = max(c.total_claims for c in plan.prepare_cases)
    nodedra, nodedra_start = start_timed(
        kubelet,
        TOPOLOGY_AWARE,
        lambda: env.nodedra_run(NODE, kubelet.registry_dir, sysfs, name="nodedra-run-prepare"),
    )
    manager, manager_start = start_timed(
        manager_kubelet,
        TOPOLOGY_AWARE,
        lambda: env.nodedra_manager(MANAGER_NODE, manager_kubelet.registry_dir, sysfs),
    )
    go, go_start = start_timed(
        kubelet, GO_DRIVER, lambda: env.go_driver(NODE, kubelet.registry_dir, devices=devices)
    )
    durable, durable_start = start_timed(
        kubelet,
        DURABLE_GO_DRIVER,
        lambda: env.go_driver(
            NODE, kubelet.registry_dir, driver=DURABLE_GO_DRIVER, devices=devices, durable=True
        ),
    )
    with_metadata, with_metadata_start = start_timed(
        kubelet,
        METADATA_GO_DRIVER,
        lambda: env.go_driver(
            NODE, kubelet.registry_dir, driver=METADATA_GO_DRIVER, devices=devices, metadata=True
        ),
    )
    drivers = {
        "nodedra": Driver(TOPOLOGY_AWARE, nodedra, NODE, kubelet),
        "manager": Driver(TOPOLOGY_AWARE, manager, MANAGER_NODE, manager_kubelet),
        "go": Driver(GO_DRIVER, go, NODE, kubelet),
        "go-durable": Driver(DURABLE_GO_DRIVER, durable, NODE, kubelet),
        "go-metadata": Driver(METADATA_GO_DRIVER, with_metadata, NODE, kubelet),
    }
    published = {
        name: _devices(env, d, 4 if d.driver == TOPOLOGY_AWARE else devices)
        for name, d in drivers.items()
    }
    idle = _idle({name: d.process for name, d in drivers.items()}, plan)
    cases: list[dict[str, Any]] = []
    per_round_p99: dict[str, list[float | None]] = {}
    for case in plan.prepare_cases:
        refs = _claims(env, case, published, drivers)
        measured = {name: _Accumulated(case) for name in drivers}
        per_round = max(1, case.iterations // plan.rounds)
        for round_ in range(plan.rounds):
            names = list(drivers)
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in order:
                d = drivers[name]
                warmup = case.warmup if round_ == 0 else 1
                writes = (
                    d.process.metric(STATUS_WRITES, {"result": "written"})
                    if name == "nodedra"
                    else 0.0
                )
                with Sampler(d.process.pid, interval=0.05) as sampler:
                    timings = d.kubelet.bench_prepare(
                        d.driver,
                        refs[name],
                        per_round,
                        warmup=warmup,
                        parallel=case.parallel,
                        timeout=900,
                    )
                    if name == "nodedra":
                        # Its claim status writes wait for the kubelet to be quiet: count
                        # their CPU too, then how many there were.
                        wait_quiet(d.process.pid, window=1.0, timeout=60)
                if name == "nodedra":
                    writes = d.process.metric(STATUS_WRITES, {"result": "written"}) - writes
                measured[name].add(timings, sampler, per_round + warmup, writes)
        per_round_p99[case.label] = [
            ratio(percentile(ours, 99), percentile(theirs, 99))
            for ours, theirs in zip(measured["nodedra"].rounds, measured["go"].rounds, strict=True)
        ]
        for name in drivers:
            row = {"driver": name, **measured[name].result()}
            cases.append(row)
            say(
                f"  {name:11} {case.label:>16} claims: prepare p50 {row['prepare_ms']['p50']:.2f} "
                f"ms p99 {row['prepare_ms']['p99']:.2f} ms, {row['claims_per_second']:.0f} claims/s"
            )
    return {
        "node": NODE,
        "fixture": f"generated sysfs {sysfs.name}: 160 CPUs, 4 NUMA nodes",
        "claim": f"one result each; on nodedra's NUMA devices consuming {CONSUMED}, "
        "on the Go drivers a whole device of their own",
        "rounds": plan.rounds,
        "start_seconds": {
            "nodedra_run": nodedra_start,
            "nodedra_manager": manager_start,
            "go": go_start,
            "go_durable": durable_start,
            "go_metadata": with_metadata_start,
        },
        "idle": idle,
        "cases": cases,
        "ratios": _ratios(cases, plan, per_round_p99),
    }


def _devices(env: BenchCluster, d: Driver, count: int) -> list[str]:
    """The devices of the driver's pool on its node, once all ``count`` are published."""
    return poll(
        lambda: complete_pool(env.api.slices(d.node, d.driver), count), 60, f"{d.driver}'s slices"
    )


def _idle(processes: Mapping[str, Spawned], plan: Plan) -> dict[str, Any]:
    """Both drivers' RSS and CPU at rest, side by side, before the load."""
    for process in processes.values():
        wait_quiet(process.pid, timeout=30)
    samplers = {name: Sampler(p.pid) for name, p in processes.items()}
    with contextlib.ExitStack() as stack:
        for sampler in samplers.values():
            stack.enter_context(sampler)
        time.sleep(min(plan.idle_seconds, 5.0))
    return {name: sampler.result().as_json() for name, sampler in samplers.items()}


def _claims(
    env: BenchCluster,
    case: Case,
    published: Mapping[str, list[str]],
    drivers: Mapping[str, Driver],
) -> dict[str, list[dict[str, str]]]:
    """The case's claims of each driver, created and allocated on its node.

    nodedra's claims share its four NUMA devices (consumable capacity); each Go claim gets
    a device of its own.
    """
    prefix = f"{case.claims}x{case.parallel}"
    count = case.total_claims
    claims = {}
    for name, d in drivers.items():
        devices = published[name]
        consumed = CONSUMED if d.driver == TOPOLOGY_AWARE else None
        claims[name] = create_claims(
            env.api,
            NAMESPACE,
            [f"{name}-{prefix}-{i}" for i in range(count)],
            [
                Allocation(d.driver, d.node, devices[i % len(devices)], consumed)
                for i in range(count)
            ],
        )
    return claims


class _Accumulated:
    """The samples and resource use of one driver over the rounds of one case."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self.prepare: list[int] = []
        self.unprepare: list[int] = []
        self.timed_ns = 0
        self.cpu_seconds = 0.0
        self.claim_cycles = 0
        self.rss_peak = 0
        self.rounds: list[list[int]] = []
        self.status_writes = 0.0

    def add(
        self,
        timings: tuple[list[int], list[int], int],
        sampler: Sampler,
        rounds: int,
        status_writes: float,
    ) -> None:
        prepare, unprepare, total_ns = timings
        self.status_writes += status_writes
        window = sampler.result()
        self.prepare += prepare
        self.rounds.append(prepare)
        self.unprepare += unprepare
        self.timed_ns += total_ns
        self.cpu_seconds += window.cpu_seconds  # warmup rounds included, and counted below
        self.claim_cycles += self.case.total_claims * rounds
        self.rss_peak = max(self.rss_peak, window.rss_peak)

    def result(self) -> dict[str, Any]:
        timed_cycles = self.case.claims * len(self.prepare)
        return {
            "case": self.case.label,
            "claims": self.case.claims,
            "parallel": self.case.parallel,
            "prepare_ms": summary_ms(self.prepare),
            "unprepare_ms": summary_ms(self.unprepare),
            "claims_per_second": round(timed_cycles / (self.timed_ns / 1e9), 1),
            "cpu_ms_per_claim_cycle": round(1000 * self.cpu_seconds / self.claim_cycles, 3),
            "rss_peak_mib": round(self.rss_peak / MIB, 1),
            "status_writes_per_claim_cycle": round(self.status_writes / self.claim_cycles, 3),
        }


def _ratios(
    cases: list[dict[str, Any]], plan: Plan, per_round_p99: Mapping[str, list[float | None]]
) -> dict[str, Any]:
    by: Mapping[tuple[str, str], dict[str, Any]] = {(c["driver"], c["case"]): c for c in cases}

    def over(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, float | None]:
        return {
            "prepare_p50": ratio(ours["prepare_ms"]["p50"], theirs["prepare_ms"]["p50"]),
            "prepare_p99": ratio(ours["prepare_ms"]["p99"], theirs["prepare_ms"]["p99"]),
            "unprepare_p50": ratio(ours["unprepare_ms"]["p50"], theirs["unprepare_ms"]["p50"]),
            "unprepare_p99": ratio(ours["unprepare_ms"]["p99"], theirs["unprepare_ms"]["p99"]),
            "throughput": ratio(ours["claims_per_second"], theirs["claims_per_second"]),
        }

    rows: list[dict[str, Any]] = []
    durable: list[dict[str, Any]] = []
    with_metadata: list[dict[str, Any]] = []
    manager: list[dict[str, Any]] = []
    for case in plan.prepare_cases:
        ours = by["nodedra", case.label]
        rows.append(
            {
                "case": case.label,
                **over(ours, by["go", case.label]),
                "prepare_p99_by_round": per_round_p99.get(case.label, []),
            }
        )
        durable.append({"case": case.label, **over(ours, by["go-durable", case.label])})
        with_metadata.append({"case": case.label, **over(ours, by["go-metadata", case.label])})
        manager.append(
            {"case": case.label, **over(by["manager", case.label], by["go", case.label])}
        )
    one = next(r for r in rows if r["case"] == "1")
    aim: dict[str, Any] = {"target_prepare_p99_ratio": TARGET_P99_RATIO}
    if one["prepare_p99"] is not None:
        aim["prepare_p99_ratio"] = one["prepare_p99"]
        aim["met"] = one["prepare_p99"] <= TARGET_P99_RATIO
        rounds = [r for r in one["prepare_p99_by_round"] if r is not None]
        aim["rounds_met"] = f"{sum(r <= TARGET_P99_RATIO for r in rounds)}/{len(rounds)}"
    return {
        "nodedra_over_go": rows,
        "nodedra_over_durable_go": durable,
        "nodedra_over_metadata_go": with_metadata,
        "manager_over_go": manager,
        "aim_one_claim_p99": aim,
    }
