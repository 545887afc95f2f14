"""Benchmark 2: ResourceSlice publication and re-publication after a wipe.

nodedra: a ``nodedra.dra.Plugin`` with a trivial owner and policy (the unit tests' fakes)
publishes ``n`` devices; timed from ``publish()`` (the plugin is started right after it,
which is how nodedra starts) until the publisher reports the pass done and until a list on
the API server shows the whole pool. Then the slices are wiped as the kubelet wipes them
(DeleteCollection by field selector) and ``resync()`` is called, which is what the
operator's ResourceSlice watch does on the DELETED event; timed from the wipe's answer to
the pool being whole again. The watch's own delay is not in this figure (see benchmark 3
for the operator's, watch included).

Go: the reference driver started with ``--devices n``, timed from process start (so its
start-up is included; the time until its registration socket appears is recorded beside
it) until the pool is whole. Its resourceslice controller (k8s.io/dynamic-resource-
allocation) waits for its informer in steps of one second before the first publication,
and syncs a pool only 30 s (``DefaultSyncDelay``, which the kubeletplugin helper does not
let a driver change) after the last event of its slices, so a wipe is repaired after up to
30 s: that is measured once, for the largest size, as it costs half a minute each time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.env import Admin, BenchCluster, complete_pool, poll
from bench.plan import Plan
from nodedra.dra import KubeClusterAPI, Options, Plugin
from tests.unit.dra.fakes import FakeOwner, FakePolicy, devices

NODE = "bench-slices"


def run(env: BenchCluster, plan: Plan, say: Callable[[str], None]) -> dict[str, Any]:
    """Run benchmark 2; its results."""
    env.node(NODE)
    rows: list[dict[str, Any]] = []
    for size in plan.slice_sizes:
        ours = [_nodedra_once(env, size, rep) for rep in range(plan.slice_repeats)]
        largest = size == max(plan.slice_sizes)
        go = [
            _go_once(env, size, rep, restore=largest and rep == 0)
            for rep in range(plan.slice_repeats)
        ]
        for name, samples in (("nodedra", ours), ("go", go)):
            row = {"driver": name, "devices": size, **_median(samples)}
            rows.append(row)
            restore = row.get("restore_seconds")
            say(
                f"  {name:8} {size:5} devices: published in {row['publish_seconds']:.3f} s"
                + (f", restored in {restore:.3f} s" if restore is not None else "")
            )
    return {"node": NODE, "repeats": plan.slice_repeats, "rows": rows}


def _median(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure, the median over the repeats (the writes do not vary)."""
    out: dict[str, Any] = {}
    for key in {k: None for s in samples for k in s}:
        values = [s[key] for s in samples if key in s]
        if all(isinstance(v, float) for v in values):
            out[key] = round(statistics.median(values), 4)
            out[f"{key}_all"] = [round(v, 4) for v in values]
        else:
            out[key] = values[0]
    return out


def _whole(api: Admin, driver: str, size: int, timeout: float = 120.0) -> float:
    """Wait until the pool of ``driver`` is whole on the server; the monotonic time then."""
    poll(lambda: complete_pool(api.slices(NODE, driver), size), timeout, f"{size} devices")
    return time.monotonic()


def _nodedra_once(env: BenchCluster, size: int, rep: int) -> dict[str, Any]:
    driver = f"pub-{size}-{rep}.bench.nri.io"
    directory = env.workdir / "slices" / f"{size}-{rep}"
    plugin = Plugin(
        driver,
        Options(
            node_name=NODE,
            kube_client=KubeClusterAPI(env.api.client),
            owner=FakeOwner(),
            policy=FakePolicy(),
            registrar_dir=directory / "registry",  # no kubelet watches it
            plugin_data_dir=directory / "plugin",
            cdi_dir=directory / "cdi",
            resync_period=3600.0,  # only the passes this benchmark asks for
        ),
    )
    wanted = devices(size)
    try:
        started = time.monotonic()
        plugin.publish(wanted)
        plugin.start()
        report = plugin.wait_published(120)
        written = time.monotonic()
        visible = _whole(env.api, driver, size)
        if report is None:
            raise TimeoutError(f"{driver}: publishing {size} devices did not finish")
        env.api.wipe_slices(f"spec.nodeName={NODE},spec.driver={driver}")
        wiped = time.monotonic()
        plugin.resync()
        again = plugin.wait_published(120)
        rewritten = time.monotonic()
        restored = _whole(env.api, driver, size)
        if again is None:
            raise TimeoutError(f"{driver}: re-publishing {size} devices did not finish")
    finally:
        plugin.stop()
    env.api.wipe_slices(f"spec.nodeName={NODE},spec.driver={driver}")
    return {
        "publish_seconds": visible - started,
        "publish_written_seconds": written - started,
        "restore_seconds": restored - wiped,
        "restore_written_seconds": rewritten - wiped,
        "slices": report.created + report.updated,
        "publish_writes": {
            "created": report.created,
            "updated": report.updated,
            "deleted": report.deleted,
        },
        "restore_writes": {
            "created": again.created,
            "updated": again.updated,
            "deleted": again.deleted,
        },
    }


def _go_once(env: BenchCluster, size: int, rep: int, *, restore: bool) -> dict[str, Any]:
    driver = f"go-{size}-{rep}.bench.nodedra.test"
    registry = env.workdir / "slices" / f"go-{size}-{rep}" / "registry"
    socket = registry / f"{driver}-reg.sock"
    started = time.monotonic()
    go = env.go_driver(
        NODE, Path(registry), driver=driver, devices=size, name=f"go-slices-{size}-{rep}"
    )
    result: dict[str, Any] = {}
    try:
        poll(lambda: True if socket.exists() else None, 60, f"{socket}", interval=0.005)
        result["start_to_socket_seconds"] = time.monotonic() - started
        result["publish_seconds"] = _whole(env.api, driver, size) - started
        result["slices"] = len(env.api.slices(NODE, driver))
        if restore:
            env.api.wipe_slices(f"spec.nodeName={NODE},spec.driver={driver}")
            wiped = time.monotonic()
            result["restore_seconds"] = _whole(env.api, driver, size, timeout=120) - wiped
    finally:
        go.stop()
    env.api.wipe_slices(f"spec.nodeName={NODE},spec.driver={driver}")
    return result
