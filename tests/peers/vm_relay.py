"""One connection of the VM guest to a host port, relayed: QEMU's ``guestfwd=...-cmd:``.

QEMU runs this for each connection the guest opens to a ``guestfwd`` address, with the
guest's side of the connection on stdin and stdout (a socket). A ``guestfwd`` to a ``tcp:``
character device would connect once, when QEMU starts, and serve one guest connection in
all; the kubelet opens several. This connects to ``HOST PORT`` (inside the test run's network
namespace, where QEMU runs) and copies both ways until either side closes.

Usage: ``python vm_relay.py HOST PORT`` (a plain script: QEMU starts it without a shell).
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading


def _copy(source: socket.socket, dest: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            dest.sendall(data)
    with contextlib.suppress(OSError):
        dest.shutdown(socket.SHUT_WR)


def main() -> int:
    host, port = sys.argv[1], int(sys.argv[2])
    guest = socket.socket(fileno=0)
    try:
        upstream = socket.create_connection((host, port), timeout=10)
    except OSError as err:
        print(f"vm_relay: cannot connect to {host}:{port}: {err}", file=sys.stderr)
        return 1
    upstream.settimeout(None)
    up = threading.Thread(target=_copy, args=(guest, upstream), daemon=True)
    up.start()
    _copy(upstream, guest)
    up.join(timeout=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
