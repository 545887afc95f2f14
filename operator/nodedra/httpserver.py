"""nodedra's own HTTP endpoints: ``/metrics``, ``/readyz`` for the kubelet, ``/status``.

kopf's ``/healthz`` (the health address) answers as long as the operator's event loop runs,
which is what liveness needs: a restart helps only when the process is stuck. Readiness is a
different question, whether this node's driver can be used now (registered with the
kubelet, serving, its ResourceSlices published, connected to the runtime), and a pod that is
not ready must not be restarted for it: the kubelet may simply not have registered us yet.
So ``/readyz`` answers 200 or 503 with the checks as JSON, beside ``/metrics``.

``/status`` is for people (``nodedra status``): who holds each CPU (:mod:`nodedra.status`). It
names the node's pods, containers and claims, so it has a listener of its own, on localhost
by default: read through ``kubectl exec`` (or a port-forward), the Kubernetes API's access
control decides who sees it, not whoever shares the pod network. It serves the last copy
(:mod:`nodedra.statuscopy`) and takes no lock. Each listener answers with at most
``MAX_THREADS`` threads at a time; a burst waits in the listen queue.
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

StatusBody = Callable[[], bytes | None]
"""The node's CPU map as JSON; None before the first copy was taken."""

StartResponse = Callable[[str, list[tuple[str, str]]], Any]
App = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

MAX_THREADS = 4
"""Requests a listener answers at once: probes, a scrape and a person or two."""
CLIENT_TIMEOUT = 10.0
"""Seconds a connection may stay silent before it is closed, freeing its thread."""


class _Server(ThreadingMixIn, WSGIServer):
    """A thread per request, at most ``MAX_THREADS`` at a time."""

    daemon_threads = True

    def server_activate(self) -> None:
        self._slots = threading.BoundedSemaphore(MAX_THREADS)
        super().server_activate()

    def process_request(self, request: Any, client_address: Any) -> None:
        self._slots.acquire()  # the others wait in the listen queue meanwhile
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _QuietHandler(WSGIRequestHandler):
    timeout = CLIENT_TIMEOUT

    def log_message(self, format: str, *args: Any) -> None:
        """Probes every few seconds are not worth a log line each."""


def metrics_app(registry: CollectorRegistry, readiness: Readiness) -> App:
    """``/readyz``, and the metrics on every other path."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/readyz":
            return metrics(environ, start_response)  # type: ignore[no-any-return]
        ready, checks = readiness()
        return _json(start_response, ready, json.dumps({"ready": ready, **checks}).encode())

    return app


def status_app(status: StatusBody) -> App:
    """``/status``: the last copy of the CPU map; 404 on other paths."""

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/status":
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"only /status is served here\n"]
        body = status()
        if body is None:
            return _json(start_response, False, b'{"error": "starting: try again"}')
        return _json(start_response, True, body)

    return app


def _json(start_response: StartResponse, ok: bool, body: bytes) -> list[bytes]:
    """Answer ``body`` (JSON): 200 if ``ok``, else 503."""
    start_response(
        "200 OK" if ok else "503 Service Unavailable", [("Content-Type", "application/json")]
    )
    return [body]


def serve(host: str, port: int, app: App) -> tuple[int, Callable[[], None]]:
    """Serve ``app`` on ``host:port`` in a thread; the port and a stop."""
    server = make_server(host, port, app, server_class=_Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join()

    return server.server_address[1], stop
