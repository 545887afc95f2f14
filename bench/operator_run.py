"""Benchmarks 3 and 4: ``nodedra run`` as a process, and what its ResourceClaim watch costs.

3. The operator (``python -m nodedra run``, kopf and all, the claim watch on) on a node of
   its own with a kubelet harness: time from process start to registration with the
   kubelet and to its slices being published; RSS and CPU at idle once start-up has
   settled, beside an idle Go driver; RSS and CPU under prepare/unprepare load through the
   kubelet's client (where the claim status writes and watch events it triggers come on
   top), one-claim prepares alone and while ``plan.status_readers`` clients read ``/status``
   in a loop, and the time to restore its slices after the kubelet-style wipe of the node's
   slices (its slice watch included), beside the Go driver's.
4. With the watch on and with ``NODEDRA_WATCH_CLAIMS=false``: the operator's CPU time and
   RSS while 1000 claims that are not its own are created (a third unallocated, a third
   allocated to the same driver on another node, a third to another driver), and what a
   fresh start costs when those claims exist (kopf lists them all first).
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.claims import Allocation, create_claims, delete_claims
from bench.env import GO_DRIVER, TOPOLOGY_AWARE, BenchCluster, Spawned, complete_pool, poll
from bench.plan import Plan
from bench.prepare import CONSUMED, start_timed
from bench.procstat import MIB, Sampler, measure, settle, usage, wait_quiet
from bench.stats import summary_ms
from tests.peers.kubelet import KubeletHarness

NODE = "bench-operator"
OTHER_NODE = "bench-elsewhere"
OTHER_DRIVER = "other.bench.nodedra.test"


def _start(
    env: BenchCluster,
    kubelet: KubeletHarness,
    sysfs: Path,
    name: str,
    *,
    watch_claims: bool = True,
) -> tuple[Spawned, dict[str, float]]:
    """Start ``nodedra run``; it and the seconds from start to socket, registered, published."""
    started = time.monotonic()
    op, times = start_timed(
        kubelet,
        TOPOLOGY_AWARE,
        lambda: env.nodedra_run(
            NODE, kubelet.registry_dir, sysfs, name=name, watch_claims=watch_claims
        ),
    )
    # The slices may still be those of an earlier instance: a new one rewrites them with
    # the same devices, so "published" is only meaningful for the first start on a node.
    poll(lambda: complete_pool(env.api.slices(NODE, TOPOLOGY_AWARE), 4), 60, "the slices")
    return op, {**times, "published": round(time.monotonic() - started, 3)}


def _stop(op: Spawned, kubelet: KubeletHarness) -> None:
    """Stop the operator and wait until the kubelet has dropped its registration.

    Otherwise the next start's wait for registration could see this instance's.
    """
    op.stop()
    kubelet.wait_unregistered(TOPOLOGY_AWARE, timeout=60)


def run(env: BenchCluster, sysfs: Path, plan: Plan, say: Callable[[str], None]) -> dict[str, Any]:
    """Run benchmarks 3 and 4 on one node and kubelet; their results."""
    kubelet = env.kubelet(NODE)
    env.node(OTHER_NODE)
    process = _process(env, kubelet, sysfs, plan, say)
    watch = {
        "on" if on else "off": _watch_cost(env, kubelet, sysfs, plan, say, watch_claims=on)
        for on in (True, False)
    }
    starts = [process["nodedra"]["start_seconds"]]
    starts += [w[k]["start_seconds"] for w in watch.values() for k in ("fresh", "relist")]
    process["nodedra"]["start_seconds_all"] = starts
    return {
        "process": process,
        "claim_watch": _watch_summary(watch, plan),
        "claim_watch_raw": watch,
    }


def _process(
    env: BenchCluster, kubelet: KubeletHarness, sysfs: Path, plan: Plan, say: Callable[[str], None]
) -> dict[str, Any]:
    op, start = _start(env, kubelet, sysfs, "nodedra-run")
    go, go_start = start_timed(
        kubelet,
        GO_DRIVER,
        lambda: env.go_driver(NODE, kubelet.registry_dir, devices=4, name="go-operator-node"),
    )
    floor = env.dependency_floor()
    settle([op.pid, floor.pid], plan.settle_seconds)
    started_cpu = usage(op.pid).cpu_seconds
    with Sampler(go.pid) as go_idle, Sampler(floor.pid) as floor_idle:
        idle = measure(op.pid, plan.idle_seconds)
    floor.stop()
    say(
        f"  nodedra run: socket {start['socket']:.2f} s, registered {start['registered']:.2f} s "
        f"after start; idle RSS "
        f"{idle.rss_end / MIB:.0f} MiB, {idle.cpu_percent:.2f}% CPU "
        f"(Go: {go_idle.result().rss_end / MIB:.0f} MiB, {go_idle.result().cpu_percent:.2f}%; "
        f"the dependencies' floor: {floor_idle.result().rss_end / MIB:.0f} MiB, "
        f"{floor_idle.result().cpu_percent:.2f}%)"
    )
    load = [_load(env, kubelet, op, size, plan) for size in sorted(plan.operator_iterations)]
    for row in load:
        say(
            f"  nodedra run under load ({row['claims']} claims a request): prepare p50 "
            f"{row['prepare_ms']['p50']:.1f} ms p99 {row['prepare_ms']['p99']:.1f} ms, peak RSS "
            f"{row['window']['rss_peak_mib']:.0f} MiB, {row['window']['cpu_percent']:.0f}% CPU"
        )
    burst = {
        name: _during_burst(env, kubelet, driver, name, plan)
        for name, driver in (("nodedra", TOPOLOGY_AWARE), ("go", GO_DRIVER))
    }
    for name, row in burst.items():
        say(
            f"  {name} while {row['claims']} claims are created: prepare p50 "
            f"{row['prepare_ms']['p50']:.1f} ms p99 {row['prepare_ms']['p99']:.1f} ms "
            f"({row['prepare_ms']['n']} calls)"
        )
    readers = _during_status_readers(env, kubelet, op, plan)
    say(
        f"  nodedra prepare p50/p99 alone {_ms(readers['alone'])}, while "
        f"{readers['readers']} clients read /status in a loop {_ms(readers['with_readers'])} "
        f"({readers['reads']} reads)"
    )
    after_load = usage(op.pid)
    wiped = time.monotonic()
    env.api.wipe_slices(f"spec.nodeName={NODE}")
    restored = {
        "nodedra": _restored(env, TOPOLOGY_AWARE, 4, wiped),
        "go": _restored(env, GO_DRIVER, 4, wiped),
    }
    say(f"  slices restored after the node's slices were wiped: {restored}")
    go_usage = usage(go.pid)
    go.stop()
    _stop(op, kubelet)
    return {
        "nodedra": {
            "start_seconds": start,
            "startup_cpu_seconds": round(started_cpu, 3),
            "idle": idle.as_json(),
            "load": load,
            "rss_after_load_mib": round(after_load.rss_bytes / MIB, 1),
            "rss_high_water_mib": round(after_load.hwm_bytes / MIB, 1),
            "restore_after_wipe_seconds": restored["nodedra"],
            "during_claim_burst": burst["nodedra"],
            "during_status_readers": readers,
        },
        "go": {
            "start_seconds": go_start,
            "idle": go_idle.result().as_json(),
            "rss_high_water_mib": round(go_usage.hwm_bytes / MIB, 1),
            "restore_after_wipe_seconds": restored["go"],
            "during_claim_burst": burst["go"],
        },
        "dependency_floor": {"idle": floor_idle.result().as_json()},
    }


def _restored(env: BenchCluster, driver: str, size: int, since: float) -> float:
    poll(lambda: complete_pool(env.api.slices(NODE, driver), size), 120, f"{driver} restored")
    return round(time.monotonic() - since, 3)


def _load(
    env: BenchCluster, kubelet: KubeletHarness, op: Spawned, size: int, plan: Plan
) -> dict[str, Any]:
    """Prepare/unprepare ``size`` claims a request against the operator, sampled."""
    devices = poll(lambda: complete_pool(env.api.slices(NODE, TOPOLOGY_AWARE), 4), 60, "slices")
    refs = create_claims(
        env.api,
        "bench-operator",
        [f"op-{size}-{i}" for i in range(size)],
        [Allocation(TOPOLOGY_AWARE, NODE, devices[i % 4], CONSUMED) for i in range(size)],
    )
    iterations = plan.operator_iterations[size]
    before = usage(op.pid)
    with Sampler(op.pid, interval=0.05) as sampler:
        prepare, unprepare, _ = kubelet.bench_prepare(
            TOPOLOGY_AWARE, refs, iterations, warmup=1, timeout=900
        )
    # The claim status writes the requests queued go on after the last answer: count them.
    drained = wait_quiet(op.pid, window=1.0, timeout=120)
    after = usage(op.pid)
    claims = size * (iterations + 1)
    return {
        "claims": size,
        "iterations": iterations,
        "prepare_ms": summary_ms(prepare),
        "unprepare_ms": summary_ms(unprepare),
        "window": sampler.result().as_json(),
        "cpu_ms_per_claim_cycle": round(1000 * sampler.result().cpu_seconds / claims, 3),
        "cpu_ms_per_claim_cycle_with_status_writes": round(
            1000 * (after.cpu_seconds - before.cpu_seconds) / claims, 3
        ),
        "quiet_after_seconds": round(drained, 1),
    }


def _during_burst(
    env: BenchCluster, kubelet: KubeletHarness, driver: str, name: str, plan: Plan
) -> dict[str, Any]:
    """One-claim prepares while ``plan.watch_claims`` claims of other nodes are created.

    nodedra's claim watch receives every one of them (and drops them unparsed); the Go
    driver watches no claims, so beside it this is the API server's share of the burst.
    """
    devices = poll(lambda: complete_pool(env.api.slices(NODE, driver), 4), 60, "slices")
    consumed = CONSUMED if driver == TOPOLOGY_AWARE else None
    refs = create_claims(
        env.api,
        "bench-operator",
        [f"burst-{name}"],
        [Allocation(driver, NODE, devices[-1], consumed)],
    )
    namespace = f"bench-burst-{name}"
    allocations = [
        Allocation(TOPOLOGY_AWARE, OTHER_NODE, "cpudevnuma000", CONSUMED)
        for _ in range(plan.watch_claims)
    ]
    kubelet.bench_prepare(driver, refs, 1, warmup=3, timeout=120)
    creating = threading.Thread(
        target=create_claims,
        args=(env.api, namespace, [f"b-{i}" for i in range(plan.watch_claims)], allocations),
    )
    prepare: list[int] = []
    started = time.monotonic()
    creating.start()
    while creating.is_alive():
        prepare += kubelet.bench_prepare(driver, refs, 10, timeout=120)[0]
    seconds = time.monotonic() - started
    delete_claims(env.api, namespace)
    return {
        "claims": plan.watch_claims,
        "creating_seconds": round(seconds, 2),
        "prepare_ms": summary_ms(prepare),
    }


def _ms(case: dict[str, Any]) -> str:
    return f"{case['prepare_ms']['p50']:.1f}/{case['prepare_ms']['p99']:.1f} ms"


def _during_status_readers(
    env: BenchCluster, kubelet: KubeletHarness, op: Spawned, plan: Plan
) -> dict[str, Any]:
    """One-claim prepares alone, then while clients read ``/status`` as fast as it answers.

    What a person with ``watch nodedra status``, or a script, costs the kubelet: readers
    are served a copy and take no lock, but they are served by nodedra's process.
    """
    assert op.status_url is not None
    url = op.status_url
    devices = poll(lambda: complete_pool(env.api.slices(NODE, TOPOLOGY_AWARE), 4), 60, "slices")
    refs = create_claims(
        env.api,
        "bench-operator",
        ["status-readers"],
        [Allocation(TOPOLOGY_AWARE, NODE, devices[-1], CONSUMED)],
    )
    kubelet.bench_prepare(TOPOLOGY_AWARE, refs, 1, warmup=3, timeout=120)
    alone = kubelet.bench_prepare(TOPOLOGY_AWARE, refs, plan.status_prepares, timeout=300)[0]
    stopping = threading.Event()
    reads = [0] * plan.status_readers

    def read(index: int) -> None:
        while not stopping.is_set():
            with urllib.request.urlopen(url, timeout=30) as answer:
                answer.read()
            reads[index] += 1

    threads = [
        threading.Thread(target=read, args=(i,), daemon=True) for i in range(plan.status_readers)
    ]
    for thread in threads:
        thread.start()
    try:
        busy = kubelet.bench_prepare(TOPOLOGY_AWARE, refs, plan.status_prepares, timeout=300)[0]
    finally:
        stopping.set()
        for thread in threads:
            thread.join(60)
    return {
        "readers": plan.status_readers,
        "reads": sum(reads),
        "alone": {"prepare_ms": summary_ms(alone)},
        "with_readers": {"prepare_ms": summary_ms(busy)},
    }


def _watch_cost(
    env: BenchCluster,
    kubelet: KubeletHarness,
    sysfs: Path,
    plan: Plan,
    say: Callable[[str], None],
    *,
    watch_claims: bool,
) -> dict[str, Any]:
    """CPU and RSS of the operator while claims are created, and of a start with them."""
    mode = "on" if watch_claims else "off"
    namespace = f"bench-watch-{mode}"
    op, start = _start(env, kubelet, sysfs, f"nodedra-watch-{mode}", watch_claims=watch_claims)
    settle([op.pid], plan.settle_seconds)
    fresh = usage(op.pid)
    count = plan.watch_claims
    allocations: list[Allocation | None] = [
        None
        if i % 3 == 0
        else Allocation(TOPOLOGY_AWARE, OTHER_NODE, "cpudevnuma000", CONSUMED)
        if i % 3 == 1
        else Allocation(OTHER_DRIVER, OTHER_NODE, "dev-0")
        for i in range(count)
    ]
    with Sampler(op.pid, interval=0.1) as sampler:
        created_at = time.monotonic()
        create_claims(env.api, namespace, [f"c-{i}" for i in range(count)], allocations)
        creating = time.monotonic() - created_at
        quiet = wait_quiet(op.pid, timeout=90)
    created = sampler.result()
    _stop(op, kubelet)
    # A fresh start with the claims in the cluster: kopf lists them all before watching.
    again, restart = _start(
        env, kubelet, sysfs, f"nodedra-watch-{mode}-relist", watch_claims=watch_claims
    )
    settle([again.pid], plan.settle_seconds)
    relisted = usage(again.pid)
    _stop(again, kubelet)
    delete_claims(env.api, namespace)
    say(
        f"  watch {mode}: {count} claims created in {creating:.1f} s: operator CPU "
        f"{created.cpu_seconds:.2f} s, RSS {created.rss_start / MIB:.1f} -> "
        f"{created.rss_end / MIB:.1f} MiB (peak {created.rss_peak / MIB:.1f}); a start with "
        f"them: {relisted.cpu_seconds:.2f} s CPU, {relisted.rss_bytes / MIB:.1f} MiB "
        f"(without: {fresh.cpu_seconds:.2f} s, {fresh.rss_bytes / MIB:.1f} MiB)"
    )
    return {
        "claims": count,
        "creating_seconds": round(creating, 2),
        "quiet_after_seconds": round(quiet, 1),
        "created": created.as_json(),
        "fresh": {
            "start_seconds": start,
            "cpu_seconds_since_start": round(fresh.cpu_seconds, 3),
            "rss_mib": round(fresh.rss_bytes / MIB, 1),
        },
        "relist": {
            "start_seconds": restart,
            "cpu_seconds_since_start": round(relisted.cpu_seconds, 3),
            "rss_mib": round(relisted.rss_bytes / MIB, 1),
        },
    }


def _watch_summary(watch: dict[str, dict[str, Any]], plan: Plan) -> dict[str, Any]:
    """Per 1000 claims: each mode's costs, and the watch's share (on minus off)."""
    per = 1000 / plan.watch_claims

    def figures(w: dict[str, Any]) -> dict[str, float]:
        created = w["created"]
        return {
            "create_cpu_seconds": round(created["cpu_seconds"] * per, 3),
            "create_rss_delta_mib": round(
                (created["rss_end_mib"] - created["rss_start_mib"]) * per, 1
            ),
            "create_rss_peak_delta_mib": round(
                (created["rss_peak_mib"] - created["rss_start_mib"]) * per, 1
            ),
            "start_cpu_delta_seconds": round(
                (w["relist"]["cpu_seconds_since_start"] - w["fresh"]["cpu_seconds_since_start"])
                * per,
                3,
            ),
            "start_rss_delta_mib": round((w["relist"]["rss_mib"] - w["fresh"]["rss_mib"]) * per, 1),
        }

    on, off = figures(watch["on"]), figures(watch["off"])
    return {
        "per_1000_claims": {
            "watch_on": on,
            "watch_off": off,
            "watch_cost": {k: round(on[k] - off[k], 3) for k in on},
        }
    }
