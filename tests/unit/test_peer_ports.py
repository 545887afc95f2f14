"""The ports the tests' servers listen on (tests/peers/ports.py)."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.peers.ports import LOOPBACK, SPAN, free_port

EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


def test_ports_are_outside_the_kernels_ephemeral_range_and_never_twice_in_a_row() -> None:
    low, high = (int(f) for f in EPHEMERAL.read_text().split())
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)
    assert all(port in SPAN and not low <= port <= high for port in ports)


def test_a_port_something_listens_on_is_passed_over() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        taken = free_port()
        listener.bind((LOOPBACK, taken))
        listener.listen()
        # A whole round of the span: `taken` comes round once in it.
        seen = {free_port() for _ in range(len(SPAN))}
    assert taken not in seen
