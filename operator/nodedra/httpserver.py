"""nodedra's own HTTP endpoints: ``/metrics`` for Prometheus and ``/readyz`` for the kubelet.

kopf's ``/healthz`` (the health address) answers as long as the operator's event loop runs,
which is what liveness needs: a restart helps only when the process is stuck. Readiness is a
different question, whether this node's driver can be used now (registered with the
kubelet, serving, its ResourceSlices published, connected to the runtime), and a pod that is
not ready must not be restarted for it: the kubelet may simply not have registered us yet.
So ``/readyz`` answers 200 or 503 with the checks as JSON, beside ``/metrics``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

Readiness = Callable[[], tuple[bool, dict[str, Any]]]
"""Whether nodedra is ready, and the checks that say so (JSON-able)."""

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes every few seconds are not worth a log line each."""


def _app(registry: CollectorRegistry, readiness: Readiness) -> Callable[..., Iterable[bytes]]:
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/readyz":
            return metrics(environ, start_response)  # type: ignore[no-any-return]
        ready, checks = readiness()
        body = json.dumps({"ready": ready, **checks}, sort_keys=True).encode()
        status = "200 OK" if ready else "503 Service Unavailable"
        start_response(status, [("Content-Type", "application/json")])
        return [body]

    return app


def serve(
    host: str, port: int, registry: CollectorRegistry, readiness: Readiness
) -> tuple[int, Callable[[], None]]:
    """Serve ``/metrics`` and ``/readyz`` on ``host:port`` in a thread: the port, and a stop."""
    server = make_server(
        host, port, _app(registry, readiness), server_class=_Server, handler_class=_QuietHandler
    )
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join()

    return server.server_address[1], stop
