"""Reading nodedra's own HTTP endpoints (``/status``, ``/readyz``, ...) as a client.

nodedra's image holds Python and nodedra, no curl or wget, so ``kubectl exec`` into the pod
has nothing else to fetch them with. ``nodedra status`` reads ``/status`` through here, and
:mod:`nodedra.served` names the others for ``nodedra get`` and ``nodedra gather``. Only the
standard library: the commands that read nodedra load none of what serves it.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass


class EndpointError(Exception):
    """An endpoint could not be read at all; the message says where and why."""


@dataclass(frozen=True)
class Answer:
    """What an endpoint answered."""

    url: str
    code: int
    body: bytes

    @property
    def ok(self) -> bool:
        return self.code == 200


def url(address: str, path: str) -> str:
    """The URL of ``path`` at ``host:port``; an any-interface host means this machine."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1" if host != "::" else "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}{path}"


def get(address: str, path: str, timeout: float = 10.0) -> Answer:
    """What ``path`` at ``address`` answers, whatever its status code (503 is an answer)."""
    if not address:
        raise EndpointError(f"{path} is turned off here (its address setting is empty)")
    target = url(address, path)
    try:
        with urllib.request.urlopen(target, timeout=timeout) as response:
            return Answer(target, response.status, response.read())
    except urllib.error.HTTPError as err:
        return Answer(target, err.code, err.read())
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise EndpointError(f"cannot read {target}: {getattr(err, 'reason', err)}") from None
