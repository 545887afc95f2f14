"""irqbalance told to keep interrupts off claimed CPUs, and interrupts steered beside it.

irqbalance itself runs on the VM node (tests/integration/vm_cluster/test_quiet_cpus.py);
here a fake of nodedra's own exchange function holds what it bans, so that the choices made
over it can be checked one by one. The wire (credentials, one command per connection) is
checked against a socket of the test's own.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
from pathlib import Path

import pytest

from nodedra.quiet import RECORD, AllWork, KernelWork, QuietKeeper, QuietKinds, irqbalance
from nodedra.quiet.cpumask import format_mask
from nodedra.quiet.irqbalance import IrqBalance, IrqBalanceError, exchange
from nodedra.topology import parse_cpu_list
from tests.unit.quiet.test_quiet import affinity, make_host

ONLINE = frozenset(range(8))
BOOT = "boot-1"
ON = QuietKinds(interrupts=True)


class FakeIrqBalance:
    """What irqbalance bans, as its socket answers; ``dead`` sockets refuse."""

    def __init__(self, run_dir: Path, banned: frozenset[int] = frozenset()) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.socket = run_dir / "irqbalance42.sock"
        self.socket.touch()
        self.banned = banned
        self.dead: set[Path] = set()
        self.sent: list[str] = []

    def __call__(self, path: Path, command: str, reply: bool) -> str:
        if path in self.dead or not path.exists():
            raise IrqBalanceError(f"{path}: Connection refused")
        if command == "setup":
            return f"SLEEP 10 BANNED {format_mask(self.banned)}"
        self.sent.append(command)
        listed = command.removeprefix("settings cpus ")
        self.banned = frozenset() if listed == "NULL" else parse_cpu_list(listed)
        return ""


class Claims:
    def __init__(self) -> None:
        self.cpus: frozenset[int] = frozenset()
        self.kinds = ON


def keeper(root: Path, fake: FakeIrqBalance, claims: Claims) -> QuietKeeper:
    irq, workqueue = make_host(root)
    balancer = IrqBalance(fake.socket.parent, ONLINE, send=fake)
    return QuietKeeper(
        AllWork([balancer, KernelWork(irq, workqueue, balanced=balancer.running)]),
        root / RECORD,
        BOOT,
        online=ONLINE,
        claimed=lambda: claims.cpus,
        kinds=lambda: claims.kinds,
    )


def test_irqbalance_bans_the_claimed_cpus_and_what_it_banned_before(tmp_path: Path) -> None:
    fake, claims = FakeIrqBalance(tmp_path / "run", banned=frozenset({7})), Claims()
    quiet = keeper(tmp_path, fake, claims)
    quiet.update()
    assert fake.sent == [], "no claim: nothing to ban"
    claims.cpus = frozenset({2, 3})
    quiet.update()
    assert fake.sent == ["settings cpus 2-3,7"]
    quiet.update()
    assert fake.sent == ["settings cpus 2-3,7"], "told once: setup says it bans them"
    claims.cpus = frozenset()
    quiet.update()
    assert fake.banned == frozenset({7})
    claims.kinds = QuietKinds()
    quiet.update()
    assert not (tmp_path / RECORD).exists()


def test_none_banned_is_irqbalance_s_own_setting_again(tmp_path: Path) -> None:
    fake, claims = FakeIrqBalance(tmp_path / "run"), Claims()
    quiet = keeper(tmp_path, fake, claims)
    claims.cpus = frozenset({4})
    quiet.update()
    claims.cpus = frozenset()
    quiet.update()
    assert fake.sent == ["settings cpus 4", "settings cpus NULL"]


def test_beside_irqbalance_interrupts_only_leave_the_claimed_cpus(tmp_path: Path) -> None:
    """irqbalance places them: nodedra moves one off the claimed CPUs at once (to where it
    was less those), and does not move back one irqbalance placed elsewhere since."""
    fake, claims = FakeIrqBalance(tmp_path / "run"), Claims()
    quiet = keeper(tmp_path, fake, claims)
    irq = tmp_path / "irq"
    quiet.update()
    claims.cpus = frozenset({2})
    quiet.update()
    assert affinity(irq, "25") == "0-1,3-7"
    assert affinity(irq, "24") == "3", "the admin's 2-3, less the claimed CPU"
    (irq / "25" / "smp_affinity_list").write_text("5\n")  # irqbalance moves it
    quiet.update()
    assert affinity(irq, "25") == "5"
    # Released: given back as they were recorded (irqbalance places them again after).
    claims.cpus = frozenset()
    claims.kinds = QuietKinds()
    quiet.update()
    assert (affinity(irq, "24"), affinity(irq, "25")) == ("2-3", "0-7")


def test_without_irqbalance_the_interrupts_are_nodedra_s(tmp_path: Path) -> None:
    fake, claims = FakeIrqBalance(tmp_path / "run"), Claims()
    fake.dead.add(fake.socket)  # killed, its socket left behind
    quiet = keeper(tmp_path, fake, claims)
    claims.cpus = frozenset({2})
    quiet.update()
    assert "Connection refused" in quiet.status()["unavailable"]["irqbalance"]
    (tmp_path / "irq" / "25" / "smp_affinity_list").write_text("2,5\n")
    quiet.update()
    assert affinity(tmp_path / "irq", "25") == "0-1,3-7", "narrowed from its original again"
    assert fake.sent == []


def test_the_newest_socket_that_answers_is_irqbalance_s(tmp_path: Path) -> None:
    fake = FakeIrqBalance(tmp_path / "run")
    old = fake.socket.with_name("irqbalance7.sock")
    old.touch()
    os.utime(old, (1, 1))
    fake.dead.add(fake.socket)
    balancer = IrqBalance(fake.socket.parent, ONLINE, send=fake)
    assert balancer.sources(ON) == ["irqbalance"]
    fake.dead.add(old)
    assert balancer.sources(ON) == []
    assert not balancer.running()
    fake.socket.unlink()
    old.unlink()
    assert balancer.sources(ON) == []
    assert balancer.unavailable(ON) == {}, "no irqbalance at all is fine"


def test_the_exchange_carries_root_s_credentials_and_one_command(tmp_path: Path) -> None:
    """What irqbalance checks before it reads a command: SCM_CREDENTIALS, uid 0 for root."""
    path = tmp_path / "irqbalance1.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    server.listen(1)
    seen: dict[str, object] = {}

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            size = socket.CMSG_SPACE(struct.calcsize("iII"))
            data, ancillary, _, _ = conn.recvmsg(500, size)
            for level, kind, payload in ancillary:
                if (level, kind) == (socket.SOL_SOCKET, socket.SCM_CREDENTIALS):
                    seen["credentials"] = struct.unpack("iII", payload)
            seen["command"] = data.decode()
            conn.sendall(b"SLEEP 10 BANNED 00000004")

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        answer = exchange(path, "setup", reply=True)
    finally:
        thread.join(timeout=10)
        server.close()
    assert answer == "SLEEP 10 BANNED 00000004"
    assert seen == {
        "command": "setup",
        "credentials": (os.getpid(), os.getuid(), os.getgid()),
    }


def test_a_busy_irqbalance_is_asked_once_and_its_late_answer_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a rescan irqbalance sleeps a whole interval before it answers: busy is not gone,
    and the question stays open (closed unanswered, irqbalance's answer would kill it with
    SIGPIPE) until its answer is read at a later pass."""
    monkeypatch.setattr(irqbalance, "TIMEOUT", 0.2)
    path = tmp_path / "irqbalance9.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)
    answer = threading.Event()

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(500)
            answer.wait(10)
            conn.sendall(b"SLEEP 10 BANNED 00000004")

    thread = threading.Thread(target=serve)
    thread.start()
    balancer = IrqBalance(tmp_path, ONLINE)
    try:
        assert balancer.sources(ON) == ["irqbalance"], "busy is there"
        assert balancer.reach("irqbalance") is None, "not known yet"
        answer.set()
        thread.join(timeout=10)
        assert balancer.reach("irqbalance") == ONLINE - {2}
        server.settimeout(0.1)
        with pytest.raises(TimeoutError):
            server.accept()  # asked once: no second question queued behind the first
    finally:
        answer.set()
        thread.join(timeout=10)
        server.close()
