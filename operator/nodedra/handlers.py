"""nodedra's kopf handlers: start-up, clean-up, and the watches of slices and claims.

Run with ``nodedra run`` or ``kopf run --standalone --all-namespaces -m nodedra.handlers``;
either way the settings come from ``nodedra.settings`` (flags or environment variables).

Only event handlers watch objects: kopf then never writes to them, so no finalizer and no
kopf annotation ends up on a ResourceSlice. The ResourceSlice watch is narrowed on the
server to our node and driver. ResourceClaims are watched by ``nodedra.claims.watch``,
started with the runtime: that watch sees every claim of the cluster, and kopf would keep
state for each of them before a handler could drop it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import threading
from collections.abc import Mapping
from typing import Any

import kopf

from nodedra.dra.kube import RESOURCE_GROUP, RESOURCE_VERSION
from nodedra.runtime import Runtime
from nodedra.settings import Settings, load_settings

log = logging.getLogger(__name__)


class Shutdown:
    """How anything, on any thread, stops the operator gracefully, and why it did."""

    def __init__(self, stop_flag: threading.Event | None) -> None:
        self._stop_flag = stop_flag
        self.reason: str | None = None

    def failed(self, reason: str) -> None:
        """Record why the operator stops when kopf stops it by itself (a failed start-up).

        kopf's own last word then is "One or more handlers failed.", which says nothing.
        """
        if self.reason is None:
            self.reason = reason

    def request(self, reason: str) -> None:
        """Stop kopf: through its stop flag when we own one, else as SIGTERM would."""
        if self.reason is None:
            self.reason = reason
        if self._stop_flag is not None:
            self._stop_flag.set()
        else:
            os.kill(os.getpid(), signal.SIGTERM)


def in_cluster_server(environ: Mapping[str, str] = os.environ) -> str | None:
    """The API server a pod reaches, found as the official client's in-cluster config does.

    That is the ``kubernetes`` Service's address and port, which the kubelet puts into every
    container's environment; None outside a pod.
    """
    host = environ.get("KUBERNETES_SERVICE_HOST")
    port = environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The same API server and credentials nodedra's own client uses.

    That is --kubeconfig, or the pod's service account at the address of
    ``in_cluster_server``. kopf's own in-cluster login names the server
    ``https://kubernetes.default.svc``, a name only cluster DNS resolves: on a node whose pods
    have no DNS (yet), nodedra's client would serve claims while kopf could not reach the API
    server at all.
    """
    if os.environ.get("KUBECONFIG"):
        return kopf.login_with_kubeconfig(**kwargs)
    info = kopf.login_with_service_account(**kwargs)
    server = in_cluster_server()
    if info is None or server is None:
        return info
    return dataclasses.replace(info, server=server)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Build and start nodedra; a setting that cannot work stops the operator at once."""
    settings.posting.enabled = False  # no Events on objects that are not ours
    settings.peering.standalone = True
    # Our resources are built in: nothing to learn from CRDs, which nodedra's ServiceAccount
    # may not list (kopf would otherwise retry that listing with errors for a minute).
    settings.scanning.disabled = True
    shutdown: Shutdown = memo.get("shutdown") or Shutdown(None)
    try:
        ours: Settings = memo.get("settings") or load_settings()
        runtime = await asyncio.to_thread(Runtime, ours, shutdown.request)
        await asyncio.to_thread(runtime.start)
    except Exception as err:
        log.error("nodedra cannot start: %s", err)
        shutdown.failed(f"cannot start: {err}")
        raise kopf.PermanentError(f"nodedra cannot start: {err}") from err
    settings.watching.field_selectors[RESOURCE_GROUP, "resourceslices"] = (
        f"spec.nodeName={ours.node_name},spec.driver={runtime.driver}"
    )
    memo["runtime"] = runtime
    memo["periodic"] = asyncio.create_task(_periodic(runtime))


async def _periodic(runtime: Runtime) -> None:
    while True:
        await asyncio.sleep(runtime.settings.config_poll)
        try:
            await asyncio.to_thread(runtime.periodic)
        except Exception:
            log.exception("periodic checks failed")


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Stop serving the kubelet, remove our sockets, save the state; slices stay."""
    task = memo.get("periodic")
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    runtime: Runtime | None = memo.get("runtime")
    if runtime is not None:
        await asyncio.to_thread(runtime.stop)


@kopf.on.probe(id="nodedra")
def probe(memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    """Shown on the liveness endpoint for people: readiness's checks, and the claims held.

    The probe only reports: the liveness endpoint answers while the operator runs, since a
    restart would not help a driver that waits for the kubelet. Readiness is ``/readyz``.
    """
    runtime: Runtime | None = memo.get("runtime")
    if runtime is None:
        return {"started": False}
    ready, checks = runtime.readiness()
    return {
        "started": True,
        "ready": ready,
        **checks,
        "claims": len(runtime.manager.committed_claims()),
    }


@kopf.on.event(RESOURCE_GROUP, RESOURCE_VERSION, "resourceslices")
def slice_event(memo: kopf.Memo, **_: Any) -> None:
    """Any change to our slices (a deletion by the kubelet, an edit): check them now."""
    runtime: Runtime | None = memo.get("runtime")
    if runtime is not None:
        runtime.on_slice_event()
