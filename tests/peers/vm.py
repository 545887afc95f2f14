"""The VM node: a guest of tests.peers.vm_image under QEMU, shaped like a two-socket server.

QEMU emulates (TCG): this machine's KVM device is PVM, which needs a guest kernel built for it
(tests/peers/README.md, "VM node"). The guest has two NUMA nodes of 1 GiB, CPUs 0-1 on node 0
and 2-3 on node 1, each pair the two threads of one core (``Skylake-Server-v1``: with ``max``
the guest sees no SMT siblings), 2 MiB huge pages on both nodes, systemd as PID 1 and cgroup v2.

What keeps it in its place:

* QEMU runs in the test run's private network namespace (tests.peers.netns), with user
  networking ``restrict=on``: whatever the guest sends reaches nothing but the forwards a test
  asks for (``guest_forwards``: an address of the guest's network, :data:`HOST_ALIAS`, whose
  ports lead to ports of the namespace's own addresses, such as the API server's), and the tests
  reach only the guest ports forwarded to the namespace (``host_forwards``).
* Every QEMU runs under ``timeout -s KILL`` (a TCG guest that hits an emulation failure hangs
  instead of exiting) in a process group of its own that ``stop()`` kills.
* The disk is the cached image opened with ``-snapshot``: the guest's writes go to a
  temporary file QEMU deletes, so guests share the image and never change it. A
  ``persistent`` guest writes to a qcow2 overlay of the image in its own directory instead,
  which outlives QEMU: :meth:`VMNode.reboot` (the guest's own ``systemctl reboot``) and
  :meth:`VMNode.power_off` then :meth:`VMNode.start` (QEMU killed: what the guest had not
  written to its disk is lost) boot it again on the same disk.

Tests talk to the guest through the agent of the image (tests.peers.vm_image.AGENT_SCRIPT) on a
virtio-serial port that QEMU connects to a Unix socket here: :meth:`VMNode.run`.
"""

from __future__ import annotations

import base64
import contextlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.peers.process import PeerProcess, tail
from tests.peers.vm_freeze import describe, qemu_options
from tests.peers.vm_image import AGENT_PORT, QBOOT, VMImage

#: The kernel command line: serial console, systemd on the unified hierarchy, and huge pages
#: (the kernel spreads them over the NUMA nodes).
KERNEL_CMDLINE = (
    "console=ttyS0 root=/dev/vda rw panic=-1 quiet systemd.unified_cgroup_hierarchy=1 "
    "hugepagesz=2M hugepages=32"
)

#: The machine: two sockets of one core of two threads, one NUMA node a socket.
MACHINE_ARGS: tuple[str, ...] = (
    "-accel", "tcg,thread=multi,tb-size=256",
    "-cpu", "Skylake-Server-v1",
    "-smp", "4,sockets=2,cores=1,threads=2",
    "-m", "2048",
    "-object", "memory-backend-ram,id=m0,size=1G",
    "-object", "memory-backend-ram,id=m1,size=1G",
    "-numa", "node,nodeid=0,cpus=0-1,memdev=m0",
    "-numa", "node,nodeid=1,cpus=2-3,memdev=m1",
)  # fmt: skip

#: The address on the guest's network (QEMU's 10.0.2.0/24) behind which ``guest_forwards``
#: put the namespace's loopback ports.
HOST_ALIAS = "10.0.2.100"
_RELAY = Path(__file__).with_name("vm_relay.py")

#: Longest a guest may live: QEMU is killed then, whatever the tests are doing.
HARD_TIMEOUT = 30 * 60
QEMU = "qemu-system-x86_64"
INSTALL_HINT = (
    "The VM node needs QEMU: as root the tests install it themselves; otherwise run "
    "apt-get install --no-install-recommends qemu-system-x86 qemu-utils"
)


class VMError(RuntimeError):
    """The guest did not boot, or a command could not be run in it; the message says why."""


class _BootStalledError(VMError):
    """The guest kernel hung while booting (see VMNode.start)."""


#: How often ``VMNode.start`` boots a guest whose kernel hangs before it is up.
BOOT_ATTEMPTS = 2
#: What QEMU writes for each CPU feature of the model it does not emulate.
TCG_CPUID_WARNING = "TCG doesn't support requested feature"
#: What the kernel writes on the console when a CPU is stuck (the soft-lockup watchdog).
SOFT_LOCKUP = b"watchdog: BUG: soft lockup"


@dataclass(frozen=True)
class GuestResult:
    """What a command run in the guest did."""

    command: str
    returncode: int
    output: str
    """Its stdout and stderr, interleaved."""

    def check(self) -> str:
        """The output, or VMError with it if the command failed."""
        if self.returncode != 0:
            raise VMError(
                f"`{self.command}` failed in the guest (exit {self.returncode}): {self.output}"
            )
        return self.output


class VMNode:
    """One guest: ``start()`` boots it to multi-user, ``run()`` runs commands, ``stop()``."""

    def __init__(
        self,
        image: VMImage,
        workdir: Path,
        *,
        hard_timeout: float = HARD_TIMEOUT,
        guest_forwards: Mapping[int, tuple[str, int]] | None = None,
        host_forwards: Mapping[tuple[str, int], int] | None = None,
        persistent: bool = False,
        kernel_args: Sequence[str] = (),
    ) -> None:
        """``guest_forwards``: guest port -> (address, port) in the namespace: the guest
        reaches it at HOST_ALIAS:<guest port>, each connection relayed by tests.peers.vm_relay
        (and nothing else). ``host_forwards``: (address, port) of the namespace -> the guest's
        port (``hostfwd``: how the tests and the API server reach the kubelet's port).
        ``persistent``: the disk is an overlay of the image that outlives QEMU.
        ``kernel_args``: appended to KERNEL_CMDLINE (``isolcpus=3``)."""
        self.image = image
        self.guest_forwards = dict(guest_forwards or {})
        self.host_forwards = dict(host_forwards or {})
        self.persistent = persistent
        self.kernel_cmdline = " ".join((KERNEL_CMDLINE, *kernel_args))
        self.overlay = workdir / "disk.qcow2"
        self.workdir = workdir
        self.console_path = workdir / "console.log"
        self.log_path = workdir / "qemu.log"
        self.agent_path = workdir / "agent.sock"
        self.monitor_path = workdir / "qmp.sock"
        self.hard_timeout = hard_timeout
        self.boot_seconds: float | None = None
        """From QEMU's start to systemd's multi-user state, once started."""
        self.state = ""
        """``systemctl is-system-running`` after boot (running, degraded...)."""
        self.boot_id = ""
        """The guest kernel's boot ID (a new one at every boot)."""
        self._process: PeerProcess | None = None
        self._agent: socket.socket | None = None
        self._buffer = b""
        self._next_id = 1
        self._console_at = 0
        """Where this boot's console output begins in the (appended) console log."""
        self.frozen = ""
        """Why the guest is taken as frozen (it left a command unanswered), or ''. Every
        later ``run`` fails at once: asking again costs minutes and tells nothing new."""

    def argv(self) -> list[str]:
        """QEMU's command line (under ``timeout``)."""
        qemu = shutil.which(QEMU)
        if qemu is None or not QBOOT.is_file():
            raise VMError(f"{QEMU} or {QBOOT} is missing. {INSTALL_HINT}")
        return [
            "timeout", "-s", "KILL", str(int(self.hard_timeout)),
            qemu, "-nodefaults", "-no-user-config", "-no-reboot",
            "-display", "none", "-monitor", "none",
            *qemu_options(self.monitor_path),
            # Appended to: a reboot's console follows the one before.
            "-chardev", f"file,id=console,path={self.console_path},append=on",
            "-serial", "chardev:console",
            *MACHINE_ARGS,
            "-bios", str(QBOOT),
            "-kernel", str(self.image.kernel),
            "-initrd", str(self.image.initramfs),
            "-append", self.kernel_cmdline,
            *self._root_disk_args(),
            "-nic", self._nic(),
            "-device", "virtio-serial-pci,id=vser0",
            "-chardev", f"socket,id=agent,path={self.agent_path},server=on,wait=off",
            "-device", f"virtserialport,bus=vser0.0,chardev=agent,name={AGENT_PORT}",
        ]  # fmt: skip

    def _root_disk_args(self) -> list[str]:
        """The root disk: a snapshot of the image, or the guest's own overlay of it."""
        if self.persistent:
            if not self.overlay.exists():
                subprocess.run(
                    ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw",
                     "-b", str(self.image.disk), str(self.overlay)],
                    check=True, capture_output=True,
                )  # fmt: skip
            drive = [f"file={self.overlay},if=none,id=root,format=qcow2,cache=writeback"]
        else:
            drive = [f"file={self.image.disk},if=none,id=root,format=raw,cache=unsafe"]
        snapshot = [] if self.persistent else ["-snapshot"]
        return ["-drive", *drive, *snapshot, "-device", "virtio-blk-pci,drive=root"]

    def _nic(self) -> str:
        options = ["user", "restrict=on", "model=virtio-net-pci"]
        for guest_port, (address, host_port) in sorted(self.guest_forwards.items()):
            relay = f"{sys.executable} {_RELAY} {address} {host_port}"
            if "," in relay:
                raise VMError(f"a comma in the relay's command line breaks -nic: {relay}")
            options.append(f"guestfwd=tcp:{HOST_ALIAS}:{guest_port}-cmd:{relay}")
        for (address, host_port), guest_port in sorted(self.host_forwards.items()):
            options.append(f"hostfwd=tcp:{address}:{host_port}-:{guest_port}")
        return ",".join(options)

    def start(self, boot_timeout: float = 240.0) -> None:
        """Boot the guest and wait until systemd has finished starting it (running or
        degraded, in :attr:`state`).

        Under TCG a virtual CPU may hang early in a boot (seen once, 2026-12-03, on a guest's
        third boot: an RCU stall on CPU 1 at 22 s, then the soft-lockup watchdog every 30 s
        until the boot timed out). Such a boot is cut when the watchdog fires and started
        again, once, with a line on stderr; a second one fails the start. A boot whose agent
        never greets is started again the same way (seen once, 2026-12-07: a first boot of a
        new image, nothing on the console after the kernel's first line for 4 minutes, where
        every other boot greets in 14 to 40 s).
        """
        for attempt in range(1, BOOT_ATTEMPTS + 1):
            try:
                self._boot(boot_timeout)
                return
            except _BootStalledError as stall:
                self.power_off()
                if attempt == BOOT_ATTEMPTS:
                    raise VMError(f"{stall}; {self._tails()}") from None
                print(f"[vm] {stall}: power off, boot again", file=sys.stderr, flush=True)

    def _boot(self, boot_timeout: float) -> None:
        if len(str(self.agent_path)) > 100:
            raise VMError(f"{self.agent_path} is too long for a Unix socket; use a shorter dir")
        started = time.monotonic()
        deadline = started + boot_timeout
        self.agent_path.unlink(missing_ok=True)
        self.frozen = ""
        self._console_at = self.console_path.stat().st_size if self.console_path.exists() else 0
        self._process = PeerProcess("qemu", self.argv(), self.log_path)
        self._agent = self._connect(deadline)
        hello = self._read_line(deadline, "the guest agent's greeting", booting=True)
        if not hello.startswith(b"hello "):
            raise VMError(f"the guest agent greeted with {hello!r}, not hello")
        self.boot_id = hello.split()[1].decode()
        wait = max(deadline - time.monotonic(), 10.0)
        result = self.run("systemctl is-system-running --wait", timeout=wait)
        self.state = result.output.strip()
        self.boot_seconds = time.monotonic() - started
        if self.state not in ("running", "degraded"):
            raise VMError(f"systemd did not finish booting the guest: {self.state!r}")

    def _check_boot_stalled(self) -> None:
        """Raise _BootStalledError if this boot's console shows a CPU stuck in the kernel."""
        with contextlib.suppress(OSError), open(self.console_path, "rb") as console:
            console.seek(self._console_at)
            if SOFT_LOCKUP in console.read():
                raise _BootStalledError("the guest kernel reported a soft lockup while booting")

    def _connect(self, deadline: float) -> socket.socket:
        while True:
            self._check_alive("its agent socket appeared")
            if self.agent_path.exists():
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.connect(str(self.agent_path))
                    return sock
                except OSError:
                    sock.close()
            if time.monotonic() > deadline:
                raise VMError(f"QEMU made no agent socket {self.agent_path}; {self._tails()}")
            time.sleep(0.05)

    def _check_alive(self, before: str) -> None:
        if self._process is None or not self._process.alive():
            code = self._process.popen.returncode if self._process else None
            raise VMError(f"QEMU exited (code {code}) before {before}; {self._tails()}")

    def _read_line(self, deadline: float, what: str, booting: bool = False) -> bytes:
        assert self._agent is not None
        while b"\n" not in self._buffer:
            self._check_alive(what)
            if booting:
                self._check_boot_stalled()
            left = deadline - time.monotonic()
            if left <= 0:
                if booting:
                    raise _BootStalledError(
                        f"no answer from the guest ({what}) in time; {self._tails()}"
                    )
                self.frozen = f"no answer from the guest ({what}) in time"
                raise VMError(f"{self.frozen}; {self._diagnosis()}; {self._tails()}")
            self._agent.settimeout(min(left, 1.0))
            try:
                chunk = self._agent.recv(65536)
            except TimeoutError:
                continue
            except OSError as err:
                raise VMError(f"the guest's agent channel broke ({what}): {err}") from err
            if not chunk:
                raise VMError(f"the guest's agent channel closed ({what}); {self._tails()}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def run(self, command: str, timeout: float = 60.0) -> GuestResult:
        """Run ``command`` with ``sh`` in the guest (as root) and return what it did; the
        guest kills it after ``timeout`` seconds."""
        if self._agent is None:
            raise VMError("the guest is not running")
        if self.frozen:
            raise VMError(f"`{command}` not sent: the guest froze before ({self.frozen})")
        ident = self._next_id
        self._next_id += 1
        encoded = base64.b64encode(command.encode()).decode()
        try:
            self._agent.sendall(f"{ident} {int(timeout)} {encoded}\n".encode())
        except OSError as err:
            raise VMError(f"`{command}` could not be sent to the guest: {err}") from err
        # The guest's own timeout ends the command; the margin is the agent's round trip.
        deadline = time.monotonic() + timeout + 30
        while True:
            fields = self._read_line(deadline, f"`{command}`").split()
            if len(fields) >= 2 and fields[0] == str(ident).encode():
                output = base64.b64decode(fields[2]) if len(fields) > 2 else b""
                return GuestResult(command, int(fields[1]), output.decode(errors="replace"))

    def reboot(self, timeout: float = 300.0) -> None:
        """Reboot the guest as an admin does: ``systemctl reboot`` stops its units, syncs and
        resets; QEMU (``-no-reboot``) exits at the reset and is started again on the same
        disk, with a fresh ``/run``."""
        if not self.persistent or self._process is None:
            raise VMError("only a running persistent guest keeps its disk across a reboot")
        process = self._process
        # From a timer: the shutdown stops the agent, maybe before it answers a plain
        # `systemctl reboot`.
        self.run("systemd-run --on-active=1 systemctl reboot").check()
        try:
            process.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise VMError(
                f"the guest did not reset {timeout:.0f}s after systemctl reboot; {self._tails()}"
            ) from None
        self.stop()
        self.start(timeout)

    def power_off(self) -> None:
        """Cut the guest's power: QEMU killed at once. What the guest had not yet written to
        its disk is lost; what QEMU had written stays (the overlay is a file of this
        machine's, which keeps running). ``start()`` boots a persistent guest again."""
        if self._process is not None:
            self._process.kill()
        self.stop()

    def stop(self) -> None:
        """Kill QEMU. Without ``persistent`` the disk is a snapshot: nothing of the guest is
        kept."""
        if self._agent is not None:
            with contextlib.suppress(OSError):
                self._agent.close()
            self._agent = None
        self._buffer = b""
        if self._process is not None:
            self._process.stop(grace=5)
            self._process = None

    def _diagnosis(self) -> str:
        """What QEMU and the virtual CPUs are doing (tests.peers.vm_freeze)."""
        if self._process is None:
            return "QEMU is not running"
        return describe(self._process.popen.pid, self.monitor_path)

    def _tails(self) -> str:
        return "; ".join(f"{name}:\n{text}" for name, text in self.log_tails().items())

    def log_tails(self, lines: int = 40) -> dict[str, str]:
        qemu = [
            line
            for line in tail(self.log_path, 400).splitlines()
            if TCG_CPUID_WARNING not in line  # 13 lines a virtual CPU at each boot
        ]
        return {
            f"vm console ({self.console_path})": tail(self.console_path, lines),
            f"qemu ({self.log_path})": "\n".join(qemu[-lines:]),
        }
