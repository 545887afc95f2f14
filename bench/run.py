"""The benchmark command: build or find the peers, run the benchmarks, write the results.

``python -m bench [--quick] [--only prepare,slices,operator,nri] [--out DIR] [--keep]``.
Results go to ``<out>/latest.json`` (everything measured, with the machine) and
``<out>/latest.md`` (the tables). Progress is printed on stderr as the benchmarks go.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import nri, operator_run, prepare, scale, slices
from bench.env import BenchCluster, write_sysfs
from bench.machine import describe, load_average
from bench.plan import Plan
from bench.procstat import Noise
from bench.report import markdown
from tests.peers.build import ensure_binaries
from tests.peers.cache import PeerBuildError
from tests.peers.peer_groups import NODE_PEERS, peer_names

RESULTS = Path(__file__).resolve().parent / "results"

Benchmark = Callable[[BenchCluster, Path, Plan, Callable[[str], None]], dict[str, Any]]

BENCHMARKS: dict[str, tuple[str, Benchmark]] = {
    "prepare": ("bench 1: prepare/unprepare through the kubelet's DRA client", prepare.run),
    "slices": (
        "bench 2: ResourceSlice publication",
        lambda env, _sysfs, plan, say: slices.run(env, plan, say),
    ),
    "operator": (
        "bench 3+4: nodedra run, idle and loaded; the ResourceClaim watch",
        operator_run.run,
    ),
    "nri": ("bench 6: the pinning path, nodedra's NRI plugin and a Go one", nri.run),
}
SCALE = ("bench 5: many nodes' nodedra on one control plane", scale.run)
"""Run alone with ``--scale`` (it takes 10 to 15 minutes); its results go to scale.*."""


def say(message: str) -> None:
    """Progress on stderr, flushed (a run takes minutes)."""
    print(message, file=sys.stderr, flush=True)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer iterations (rough figures)")
    parser.add_argument(
        "--only",
        default=",".join(BENCHMARKS),
        help=f"comma-separated subset of {', '.join(BENCHMARKS)} (default: all)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"results dir ({RESULTS})")
    parser.add_argument(
        "--keep", action="store_true", help="keep the work directory (logs) after success"
    )
    parser.add_argument(
        "--scale",
        action="store_true",
        help="run only the scale benchmark (results in scale.json and scale.md)",
    )
    args = parser.parse_args(argv)
    args.only = [] if args.scale else [b for b in args.only.split(",") if b]
    unknown = sorted(set(args.only) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmarks {unknown}; choose from {', '.join(BENCHMARKS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks and write the results; 0 when they all ran."""
    args = _arguments(argv)
    plan = Plan.make(args.quick)
    try:
        # The benchmarks run on the kubelet harness: a real node's peers are not needed.
        names = [n for n in peer_names() if n not in NODE_PEERS]
        binaries = ensure_binaries(log=sys.stderr, names=names)
    except PeerBuildError as err:
        say(f"bench: the Kubernetes peers are unavailable: {err}")
        return 2
    started = time.monotonic()
    results: dict[str, Any] = {
        "schema": 1,
        "started": _now(),
        "quick": plan.quick,
        "command": " ".join(["python -m bench", *(sys.argv[1:] if argv is None else argv)]),
        "machine": describe(binaries),
        "plan": dataclasses.asdict(plan),
    }
    workdir = Path(tempfile.mkdtemp(prefix="nodedra-bench-"))
    say(f"bench: work directory (logs) {workdir}")
    ok = False
    try:
        sysfs = write_sysfs(workdir / "sysfs")
        noise: dict[str, Any] = {}
        with BenchCluster(binaries, workdir) as env:
            say(f"bench: control plane up at {env.cp.url}")
            for name in ["scale"] if args.scale else args.only:
                title, benchmark = SCALE if args.scale else BENCHMARKS[name]
                say(title)
                before = Noise()
                results[name] = benchmark(env, sysfs, plan, say)
                noise[name] = before.result()
        results["other_processes"] = noise
        ok = True
    finally:
        if ok and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            say(f"bench: logs kept in {workdir}")
    results["finished"] = _now()
    results["wall_seconds"] = round(time.monotonic() - started, 1)
    results["load_average_at_end"] = load_average()
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "scale" if args.scale else "latest"
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    (args.out / f"{stem}.md").write_text(markdown(results))
    say(f"bench: done in {results['wall_seconds'] / 60:.1f} min; results in {args.out}")
    sys.stdout.write(markdown(results))
    return 0
