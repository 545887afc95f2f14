"""nodedra's own HTTP endpoints: ``/metrics``, ``/readyz`` for the kubelet, ``/status``.

kopf's ``/healthz`` (the health address) answers as long as the operator's event loop runs,
which is what liveness needs: a restart helps only when the process is stuck. Readiness is a
different question, whether this node's driver can be used now (registered with the
kubelet, serving, its ResourceSlices published, connected to the runtime), and a pod that is
not ready must not be restarted for it: the kubelet may simply not have registered us yet.
So ``/readyz`` answers 200 or 503 with the checks as JSON, beside ``/metrics``.

``/status`` is for people (``nodedra status``): who holds each CPU (:mod:`nodedra.status`),
or 503 while the resource manager's lock stays busy.
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

Status = Callable[[], dict[str, Any] | None]
"""The node's CPU map (JSON-able); None while it cannot be read now (the lock is busy)."""

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes every few seconds are not worth a log line each."""


def _app(
    registry: CollectorRegistry, readiness: Readiness, status: Status | None
) -> Callable[..., Iterable[bytes]]:
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO")
        if path == "/status" and status is not None:
            cpu_map = status()
            if cpu_map is None:
                return _json(start_response, False, {"error": "busy: try again"})
            return _json(start_response, True, cpu_map)
        if path != "/readyz":
            return metrics(environ, start_response)  # type: ignore[no-any-return]
        ready, checks = readiness()
        return _json(start_response, ready, {"ready": ready, **checks})

    return app


def _json(start_response: StartResponse, ok: bool, data: dict[str, Any]) -> list[bytes]:
    """Answer ``data`` as JSON: 200 if ``ok``, else 503."""
    body = json.dumps(data, sort_keys=True).encode()
    start_response(
        "200 OK" if ok else "503 Service Unavailable", [("Content-Type", "application/json")]
    )
    return [body]


def serve(
    host: str,
    port: int,
    registry: CollectorRegistry,
    readiness: Readiness,
    status: Status | None = None,
) -> tuple[int, Callable[[], None]]:
    """Serve ``/metrics``, ``/readyz`` and ``/status`` on ``host:port`` in a thread.

    Returns the port and a stop. Without ``status``, ``/status`` is one more path of
    the metrics, as any unknown path is.
    """
    server = make_server(
        host,
        port,
        _app(registry, readiness, status),
        server_class=_Server,
        handler_class=_QuietHandler,
    )
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join()

    return server.server_address[1], stop
