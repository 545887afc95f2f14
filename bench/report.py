"""The results as Markdown tables, for bench/results/latest.md and docs/performance.md."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def _cell(value: object) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.0f}"
    return str(value)


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def markdown(results: dict[str, Any]) -> str:
    """All tables, with the machine they were measured on."""
    m = results["machine"]
    lines = [
        f"Measured {results['finished']} in {results['wall_seconds'] / 60:.1f} min"
        + (" (`--quick`: rough figures)" if results["quick"] else "")
        + f" on {m['cpu_model']}, {m['usable_cpus']} CPUs, {m['memory_gib']} GiB, "
        f"{m['kernel']}; {m['python']}, Go {m['go']}, Kubernetes {m['kubernetes']}, "
        f"nodedra {m['nodedra']} ({m['git_commit']}); load average at start "
        f"{m['load_average_at_start']}, at end {results['load_average_at_end']}.",
        "",
    ]
    noise = results.get("other_processes") or {}
    if noise:
        lines += [
            "Other processes on the machine used, on average, "
            + ", ".join(f"{v['other_cores_busy']:.2f} cores during {k}" for k, v in noise.items())
            + f" (of {m['usable_cpus']}).",
            "",
        ]
    if "prepare" in results:
        lines += _prepare(results["prepare"])
    if "slices" in results:
        lines += _slices(results["slices"])
    if "operator" in results:
        lines += _process(results)
        lines += _watch(results["operator"]["claim_watch"])
    if "nri" in results:
        lines += _nri(results["nri"])
    if "scale" in results:
        lines += _scale(results["scale"])
    return "\n".join(lines) + "\n"


def _prepare(prepare: dict[str, Any]) -> list[str]:
    rows = [
        [
            c["case"],
            c["driver"],
            c["prepare_ms"]["n"],
            c["prepare_ms"]["p50"],
            c["prepare_ms"]["p99"],
            c["unprepare_ms"]["p50"],
            c["unprepare_ms"]["p99"],
            c["claims_per_second"],
            c["cpu_ms_per_claim_cycle"],
            c["rss_peak_mib"],
        ]
        for c in prepare["cases"]
    ]
    header = [
        "claims/request",
        "prepare p50",
        "prepare p99",
        "unprepare p50",
        "unprepare p99",
        "throughput",
    ]

    def ratio_rows(key: str) -> list[list[object]]:
        return [
            [r["case"], *(_x(r[k.replace(" ", "_")]) for k in header[1:])]
            for r in prepare["ratios"].get(key) or []
        ]

    aim = prepare["ratios"]["aim_one_claim_p99"]
    verdict = "met" if aim.get("met") else "NOT met"
    one = next(r for r in prepare["ratios"]["nodedra_over_go"] if r["case"] == "1")
    return [
        "### Prepare and unprepare through the kubelet's DRA client (latencies in ms)",
        "",
        *_table(
            [
                "claims/request",
                "driver",
                "calls",
                "prepare p50",
                "prepare p99",
                "unprepare p50",
                "unprepare p99",
                "claims/s",
                "CPU ms/claim",
                "peak RSS MiB",
            ],
            rows,
        ),
        "",
        "claims/s: claims prepared and unprepared per second of wall time; CPU ms/claim: "
        "the driver process's CPU time per claim prepared and unprepared. nodedra is "
        "`nodedra run` as deployed (kopf, the claim watch, metrics, the claim status writes, "
        "whose CPU is counted until it is quiet after each round); manager is its resource "
        "manager alone in a process (plugin, policy, checkpoint); go-durable is the Go driver "
        "keeping a durable record of each claim; go-metadata is the Go driver writing device "
        "metadata for each claim's requests through the helper, as nodedra does.",
        "",
        "Claim status writes `nodedra run` made per claim prepared and unprepared (they wait "
        "until the kubelet has been quiet for 0.25 s, or 2 s at most, and a claim queued "
        "again meanwhile is written once, in its newest state): "
        + ", ".join(
            f"{c['case']} claims: {c['status_writes_per_claim_cycle']:.3f}"
            for c in prepare["cases"]
            if c["driver"] == "nodedra"
        )
        + ".",
        "",
        "nodedra run / Go (latency: lower is better; throughput: higher is better):",
        "",
        *_table(header, ratio_rows("nodedra_over_go")),
        "",
        "nodedra run / the Go driver with a durable record per claim (`go-durable`: file "
        "written, fsynced, renamed, directory fsynced, before the CDI spec; so is the removal):",
        "",
        *_table(header, ratio_rows("nodedra_over_durable_go")),
        "",
        "nodedra run / the Go driver writing device metadata as nodedra does (`go-metadata`: "
        "the helper's metadata file per request and a CDI spec of its own for its mount, "
        "removed on unprepare):",
        "",
        *_table(header, ratio_rows("nodedra_over_metadata_go")),
        "",
        "nodedra's manager process / Go:",
        "",
        *_table(header, ratio_rows("manager_over_go")),
        "",
        f"Aim, one-claim prepare p99 within {aim['target_prepare_p99_ratio']}x of Go: "
        f"{_x(aim.get('prepare_p99_ratio'))}, **{verdict}** (met in {aim.get('rounds_met')} "
        "of the interleaved rounds taken one by one: "
        + ", ".join(_x(r) for r in one["prepare_p99_by_round"])
        + ").",
        "",
    ]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _slices(slices: dict[str, Any]) -> list[str]:
    rows = [
        [
            r["devices"],
            r["driver"],
            r["slices"],
            _ms(r["publish_seconds"]),
            _ms(r.get("start_to_socket_seconds")),
            _writes(r.get("publish_writes")),
            _ms(r.get("restore_seconds")),
            _writes(r.get("restore_writes")),
        ]
        for r in slices["rows"]
    ]
    return [
        f"### ResourceSlice publication (ms, median of {slices['repeats']})",
        "",
        *_table(
            [
                "devices",
                "driver",
                "slices",
                "publish to whole pool",
                "Go: start to its socket",
                "API writes",
                "wipe to restored",
                "restore writes",
            ],
            rows,
        ),
        "",
        "nodedra: `Plugin.publish()` + `start()` in-process, restore driven by `resync()` (what "
        "its slice watch calls). Go: from process start (its own start-up is the time to its "
        "registration socket); its resourceslice controller polls its informer "
        "once a second before the first sync and repairs a wipe only after its fixed 30 s "
        "sync delay (measured once, largest size).",
        "",
    ]


def _writes(writes: dict[str, int] | None) -> str:
    if not writes:
        return "n/a"
    return str(writes["created"] + writes["updated"] + writes["deleted"])


def _process(results: dict[str, Any]) -> list[str]:
    ours = results["operator"]["process"]["nodedra"]
    go = results["operator"]["process"]["go"]
    floor = results["operator"]["process"].get("dependency_floor", {}).get("idle", {})
    prepare = results.get("prepare", {})
    by = {(c["driver"], c["case"]): c for c in prepare.get("cases", [])}
    manager_start = prepare.get("start_seconds", {}).get("nodedra_manager", {})
    manager_idle = prepare.get("idle", {}).get("manager", {})
    rows: list[list[object]] = [
        [
            "start to registration socket (s)",
            ours["start_seconds"]["socket"],
            manager_start.get("socket"),
            go["start_seconds"]["socket"],
            None,
        ],
        [
            "start to registered by the kubelet (s)",
            ours["start_seconds"]["registered"],
            manager_start.get("registered"),
            go["start_seconds"]["registered"],
            None,
        ],
        [
            "idle RSS (MiB)",
            ours["idle"]["rss_end_mib"],
            manager_idle.get("rss_end_mib"),
            go["idle"]["rss_end_mib"],
            floor.get("rss_end_mib"),
        ],
        [
            "idle CPU (% of a core)",
            ours["idle"]["cpu_percent"],
            manager_idle.get("cpu_percent"),
            go["idle"]["cpu_percent"],
            floor.get("cpu_percent"),
        ],
    ]
    for load in ours["load"]:
        size = str(load["claims"])
        manager, go_case = by.get(("manager", size)), by.get(("go", size))
        rows += [
            [
                f"peak RSS, {size}-claim requests (MiB)",
                load["window"]["rss_peak_mib"],
                manager["rss_peak_mib"] if manager else None,
                go_case["rss_peak_mib"] if go_case else None,
                None,
            ],
            [
                f"CPU ms per claim, {size}-claim requests",
                load["cpu_ms_per_claim_cycle_with_status_writes"],
                manager["cpu_ms_per_claim_cycle"] if manager else None,
                go_case["cpu_ms_per_claim_cycle"] if go_case else None,
                None,
            ],
            [
                f"prepare p50 / p99 ms, {size}-claim requests",
                _pair(load),
                _pair(manager),
                _pair(go_case),
                None,
            ],
        ]
    if "during_claim_burst" in ours:
        burst = ours["during_claim_burst"]
        rows.append(
            [
                f"prepare p50 / p99 ms, 1-claim requests, while {burst['claims']} claims "
                "of other nodes are created",
                _pair(burst),
                None,
                _pair(go.get("during_claim_burst")),
                None,
            ]
        )
    if "during_status_readers" in ours:
        readers = ours["during_status_readers"]
        rows.append(
            [
                "prepare p50 / p99 ms, 1-claim requests, alone / while "
                f"{readers['readers']} clients read /status in a loop",
                f"{_pair(readers['alone'])} / {_pair(readers['with_readers'])}",
                None,
                None,
                None,
            ]
        )
    rows.append(
        [
            "all slices of the node wiped: restored after (s)",
            ours["restore_after_wipe_seconds"],
            None,
            go["restore_after_wipe_seconds"],
            None,
        ]
    )
    idle_ok = ours["idle"]["rss_end_mib"] < 100
    starts = ours.get("start_seconds_all", [])
    spread = ""
    if starts:
        registered = sorted(s["registered"] for s in starts)
        sockets = sorted(s["socket"] for s in starts)
        spread = (
            f" Over its {len(starts)} starts in this run, `nodedra run` took "
            f"{sockets[0]:.2f}-{sockets[-1]:.2f} s to its socket and "
            f"{registered[0]:.2f}-{registered[-1]:.2f} s to registration."
        )
    return [
        "### Processes: `nodedra run` (watch on), nodedra's manager alone, the Go driver",
        "",
        *_table(["", "nodedra run", "manager process", "Go driver", "dependencies"], rows),
        "",
        f"Aim, idle RSS of `nodedra run` under 100 MiB: {ours['idle']['rss_end_mib']:.0f} MiB, "
        f"**{'met' if idle_ok else 'NOT met'}**. Under load, `nodedra run`'s CPU includes the "
        "claim status writes its requests queue (counted until it is quiet again); the "
        "manager and Go columns are from the prepare benchmark. dependencies: a Python "
        "process that imports kopf, the kubernetes client, grpcio, prometheus-client and PyYAML "
        "and serves two idle gRPC servers, nodedra's floor. The kubelet's plugin "
        "manager reconciles once a second, hence registration about 1 s after the socket." + spread,
        "",
    ]


def _nri(nri: dict[str, Any]) -> list[str]:
    ratios = {r["case"]: r for r in nri["ratios"]}
    rows = [
        [
            r["case"],
            r["driver"],
            r["ms"]["n"],
            r["ms"]["p50"],
            r["ms"]["p99"],
            *(
                (_x(ratios[r["case"]]["p50"]), _x(ratios[r["case"]]["p99"]))
                if r["driver"] == "nodedra"
                else ("", "")
            ),
        ]
        for r in nri["rows"]
    ]
    return [
        f"### The pinning path: NRI events (NRI {nri['nri_version']}, ms)",
        "",
        *_table(["event", "plugin", "calls", "p50", "p99", "p50 / Go", "p99 / Go"], rows),
        "",
        "Timed by the NRI runtime harness around the adaptation's call (what containerd "
        "waits for: transport and the plugin's handling). nodedra: `nodedra run` with "
        f"pinning required and {nri['claim_pods']} claims of one CPU prepared through the "
        "kubelet harness; go: the Go plugin on NRI's stub library given the same claim UIDs. "
        "Each container with a claim names it by its CDI device; the update is the "
        "kubelet's UpdateContainerResources of it (both plugins put its cpuset back); "
        "Synchronize follows a restart of the runtime, which both plugins reconnect to.",
        "",
    ]


def _pair(case: dict[str, Any] | None) -> str:
    if case is None:
        return "n/a"
    return f"{case['prepare_ms']['p50']:.1f} / {case['prepare_ms']['p99']:.1f}"


def _watch(watch: dict[str, Any]) -> list[str]:
    per = watch["per_1000_claims"]
    labels = {
        "create_cpu_seconds": "CPU s while 1000 claims are created",
        "create_rss_delta_mib": "RSS change after (MiB)",
        "create_rss_peak_delta_mib": "RSS peak over start (MiB)",
        "start_cpu_delta_seconds": "extra CPU s of a start with them",
        "start_rss_delta_mib": "extra RSS after a start with them (MiB)",
    }
    rows = [
        [label, per["watch_on"][key], per["watch_off"][key], per["watch_cost"][key]]
        for key, label in labels.items()
    ]
    return [
        "### What the ResourceClaim watch costs, per 1000 claims not on this node",
        "",
        *_table(["", "watch on", "NODEDRA_WATCH_CLAIMS=false", "cost of the watch"], rows),
        "",
    ]


def _scale(scale: dict[str, Any]) -> list[str]:
    node, api, prepare = scale["instance"], scale["apiserver"], scale["prepare_ms"]

    def spread(values: dict[str, float]) -> str:
        return f"{_cell(values['median'])} ({_cell(values['min'])} to {_cell(values['max'])})"

    def p50_p99(case: dict[str, float]) -> str:
        return f"{_cell(case['p50'])} / {_cell(case['p99'])}"

    restart = node["restart"]
    rows = [
        ["idle RSS (MiB)", spread(node["idle_rss_mib"])],
        ["CPU s per 1000 watch events", spread(node["cpu_seconds_per_1000_events"])],
        [
            "RSS kept per 10,000 claims in the cluster (MiB)",
            spread(node["rss_mib_per_10000_claims"]),
        ],
        [
            f"CPU during the churn ({scale['churn']['rate_per_second']} claims/s), % of a core",
            spread(node["churn_cpu_percent"]),
        ],
        [
            f"a restart with {scale['claims']} claims: CPU s since start, RSS MiB",
            f"{restart['cpu_seconds_since_start']}, {restart['rss_mib']} (first start: "
            f"{restart['first_start_cpu_seconds']}, {restart['first_start_rss_mib']})",
        ],
    ]
    rows += [
        [
            f"first node's prepare p50 / p99, {when} (ms; Go driver beside it)",
            f"{p50_p99(prepare['nodedra'][key])} (Go {p50_p99(prepare['go'][key])})",
        ]
        for key, when in (("quiet", "no churn"), ("churn", "during the churn"))
    ]
    rss = (
        f"{api['rss_mib_before_watchers']}, {api['rss_mib_idle_with_watchers']}, "
        f"{api['rss_mib_after_claims']}"
    )
    api_rows = [
        [
            "CPU s per watcher per 1000 claims created",
            api["cpu_seconds_per_watcher_per_1000_claims"],
        ],
        [
            f"CPU s creating {api['baseline_claims']} claims, no watchers",
            api["baseline_cpu_seconds"],
        ],
        [
            f"CPU s creating {scale['claims']} claims, {scale['nodes']} watchers",
            api["create_cpu_seconds"],
        ],
        ["RSS before the watchers, with them, after the claims (MiB)", rss],
        ["CPU during the churn, % of a core", api["churn_cpu_percent"]],
    ]
    return [
        f"### Scale: {scale['nodes']} nodes' nodedra, {scale['claims']} claims "
        f"({scale['watch_events']} watch events, created in {scale['create_seconds']} s)",
        "",
        *_table(["per nodedra instance", "median (min to max)"], rows),
        "",
        *_table(["API server", ""], api_rows),
        "",
    ]
