"""TCP ports for the peers' servers (and nodedra's), chosen by the test process.

A port the kernel picks with ``bind(port 0)`` comes from its ephemeral range, the same range
it takes the source port of every outgoing connection from. Between the moment a test picks
such a port and the moment the server it starts binds it, any client in the namespace (a
kubelet talking to the API server, a watch reconnecting) may take it as its source port, and
two picks in a row may even return the same port: both made a CI run's nodedra fail with
"Address already in use". Ports here come from a span below that range instead, handed out in
turn, so a port is neither taken by a connection nor handed out again until every other port
of the span has been.
"""

from __future__ import annotations

import itertools
import random
import socket
from collections.abc import Iterator
from pathlib import Path

LOOPBACK = "127.0.0.1"

SPAN = range(20000, 30000)
"""Above the well-known ports of the peers (etcd 2379, the API server 6443, the kubelet
10250), below the NodePort range (30000-32767) and Linux's default ephemeral range
(32768-60999)."""

_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_range() -> range:
    try:
        low, high = (int(field) for field in _EPHEMERAL.read_text().split())
    except (OSError, ValueError):
        return range(32768, 61000)
    return range(low, high + 1)


def _turns() -> Iterator[int]:
    """The span's ports in turn from a random start (two test processes at once start
    apart), without those the kernel may give outgoing connections on this machine."""
    ephemeral = _ephemeral_range()
    ports = [port for port in SPAN if port not in ephemeral]
    if not ports:
        raise RuntimeError(
            f"the kernel's ephemeral port range {ephemeral.start}-{ephemeral.stop - 1} "
            f"({_EPHEMERAL}) covers every port of {SPAN.start}-{SPAN.stop - 1}, where the "
            "tests' servers listen; narrow it to start at 32768, Linux's default"
        )
    start = random.randrange(len(ports))
    return itertools.cycle(ports[start:] + ports[:start])


_next_port = _turns()


def free_port(address: str = LOOPBACK) -> int:
    """The next port of the span that nothing on ``address`` listens on now."""
    for _ in range(len(SPAN)):
        port = next(_next_port)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((address, port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free TCP port on {address} in {SPAN.start}-{SPAN.stop - 1}")
