"""The VM node's forwards (tests.peers.vm, tests.peers.vm_relay), without QEMU."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

from tests.peers.vm import HOST_ALIAS, VMNode
from tests.peers.vm_image import VMImage

RELAY = Path(__file__).resolve().parents[1] / "peers" / "vm_relay.py"


def _node(
    tmp_path: Path,
    guest_forwards: dict[int, tuple[str, int]] | None = None,
    host_forwards: dict[tuple[str, int], int] | None = None,
) -> VMNode:
    image = VMImage(tmp_path, tmp_path / "k", tmp_path / "i", tmp_path / "d", "v", "p")
    return VMNode(image, tmp_path, guest_forwards=guest_forwards, host_forwards=host_forwards)


def test_the_guest_network_is_restricted_to_the_forwards_asked_for(tmp_path: Path) -> None:
    assert _node(tmp_path)._nic() == "user,restrict=on,model=virtio-net-pci"
    forwards = {("127.0.0.1", 42000): 10250, ("10.0.2.15", 10250): 10250}
    nic = _node(tmp_path, guest_forwards={6443: (HOST_ALIAS, 41000)}, host_forwards=forwards)._nic()
    options = nic.split(",")
    assert options[:2] == ["user", "restrict=on"]
    (guestfwd,) = [o for o in options if o.startswith("guestfwd=")]
    assert guestfwd == (
        f"guestfwd=tcp:{HOST_ALIAS}:6443-cmd:{sys.executable} {RELAY} {HOST_ALIAS} 41000"
    )
    assert "hostfwd=tcp:127.0.0.1:42000-:10250" in options
    assert "hostfwd=tcp:10.0.2.15:10250-:10250" in options


def test_the_relay_carries_one_connection_both_ways(tmp_path: Path) -> None:
    del tmp_path
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        def answer() -> None:
            conn, _ = server.accept()
            with conn:
                data = b""
                while chunk := conn.recv(4096):
                    data += chunk
                conn.sendall(data.upper())

        upstream = threading.Thread(target=answer)
        upstream.start()
        guest, relay_end = socket.socketpair()
        with guest, relay_end:
            relay = subprocess.Popen(
                [sys.executable, str(RELAY), "127.0.0.1", str(port)],
                stdin=relay_end.fileno(),
                stdout=relay_end.fileno(),
            )
            relay_end.close()
            guest.sendall(b"hello api server")
            guest.shutdown(socket.SHUT_WR)
            got = b""
            guest.settimeout(30)
            while chunk := guest.recv(4096):
                got += chunk
            assert relay.wait(timeout=30) == 0
        upstream.join(timeout=30)
    assert got == b"HELLO API SERVER"
