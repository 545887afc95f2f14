"""``python -m bench.manager_proc``: nodedra's ResourceManager alone, in a process of its own.

Benchmark 1 times prepare and unprepare through the kubelet's DRA client against this
process, so its CPU time and memory are nodedra's alone (the benchmark driver, the peers
and the Go driver are other processes). It is what ``nodedra run`` builds around the
plugin, minus kopf, the claim watch and metrics: topology, policy, checkpoint, plugin. It
runs until SIGTERM, then stops as the operator does (unregister, save).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from kubernetes import config as k8s_config

from nodedra.dra import KubeClusterAPI
from nodedra.policy import make_policy, parse_config
from nodedra.resmgr import ManagerOptions, ResourceManager
from nodedra.topology import read_topology


def main(argv: list[str] | None = None) -> int:
    """Start the manager, serve until SIGTERM, stop."""
    parser = argparse.ArgumentParser(prog="python -m bench.manager_proc")
    parser.add_argument("--node-name", required=True)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--registry-dir", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--sysfs", type=Path, required=True)
    parser.add_argument("--policy", default="topology-aware")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    shutdown: list[str] = []

    def on_shutdown(reason: str) -> None:
        shutdown.append(reason)
        stop.set()

    api_client = k8s_config.new_client_from_config(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
    manager = ResourceManager(
        make_policy(read_topology(args.sysfs), parse_config({"policy": args.policy})),
        KubeClusterAPI(api_client),
        ManagerOptions(
            node_name=args.node_name,
            registrar_dir=args.registry_dir,
            plugin_data_dir=args.workdir / "plugin",
            cdi_dir=args.workdir / "cdi",
            state_dir=args.workdir / "state",
            # The operator's default; the benchmark wipes no slices of this process.
            resync_period=30.0,
        ),
        on_shutdown,
    )
    manager.start()
    stop.wait()
    manager.stop()
    if shutdown:
        print(f"manager_proc: shut down: {shutdown[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
