"""``python -m bench.floor_proc``: what nodedra's dependencies cost before nodedra does anything.

The floor that ``nodedra run``'s idle RSS and CPU are compared with: a Python process that
imports what the operator imports (kopf, the kubernetes client, grpcio, prometheus-client,
PyYAML) and serves two idle gRPC servers on Unix sockets, as the plugin's registration and
DRA servers do, then sleeps until SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from concurrent import futures
from pathlib import Path

import grpc
import kopf  # noqa: F401 (imported for what importing it costs)
import prometheus_client  # noqa: F401
import yaml  # noqa: F401
from kubernetes import client  # noqa: F401


def main(argv: list[str] | None = None) -> int:
    """Serve the two idle gRPC servers until SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m bench.floor_proc")
    parser.add_argument("--workdir", type=Path, required=True)
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    servers = []
    for name in ("registration", "dra"):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        server.add_insecure_port(f"unix:{args.workdir / name}.sock")
        server.start()
        servers.append(server)
    stop.wait()
    for server in servers:
        server.stop(None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
