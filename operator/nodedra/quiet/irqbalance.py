"""irqbalance, where it runs: told which CPUs to keep interrupts off, through its own socket.

irqbalance moves device interrupts every few seconds by its own measure of their load, and
would put them back on claimed CPUs as soon as nodedra moved them off. Its control socket
(``/run/irqbalance/irqbalance<pid>.sock``, the one ``irqbalance-ui`` uses; the caller must
be root, as SCM_CREDENTIALS says) takes ``settings cpus <list>``: the CPUs it bans from
then on, in place of those of its environment (``IRQBALANCE_BANNED_CPULIST``) and the
isolated ones. ``setup`` answers with what it bans now (``... BANNED <hex mask>``), as of its
last rescan: a new list counts from irqbalance's next pass (10 seconds in 1.9), when it
places every interrupt again. That pass then sleeps a whole interval before it serves its
socket again: an irqbalance that does not answer in time is busy, not gone (what is on
record stays, and nothing is sent until it answers).

As a source, irqbalance's CPUs are those it may place interrupts on (every online CPU but
those it bans). Narrowed, it bans the claimed CPUs too, as well as those it banned before;
given back, it bans again only those. While it runs it places the interrupts:
:class:`nodedra.quiet.kernelwork.KernelWork` then only moves an interrupt off claimed CPUs
at once, and never back (irqbalance would move it elsewhere, and nodedra back, each pass).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import struct
from collections.abc import Callable, Mapping
from pathlib import Path

from nodedra.topology.cpulist import format_cpu_list

from .cpumask import parse_mask
from .work import QuietKinds, Steered, Written, restore_each, steer_each

SOURCE = "irqbalance"
RUN_DIR = Path("/run/irqbalance")
"""Where irqbalance makes its socket (systemd's RuntimeDirectory: made anew at each start)."""
TIMEOUT = 5.0
"""Seconds for one exchange: irqbalance answers from its main loop."""
PENDING_WAIT = 0.5
"""Seconds to wait again for an answer already late: the rest of the pass goes on."""
_BANNED = re.compile(r"BANNED ([0-9a-fA-F,]+)")


class IrqBalanceError(Exception):
    """irqbalance could not be reached or did not answer as expected."""


class IrqBalanceBusyError(IrqBalanceError):
    """irqbalance took the question but did not answer in time (it sleeps after a rescan)."""

    def __init__(self, message: str, pending: socket.socket | None = None) -> None:
        super().__init__(message)
        self.pending = pending
        """The connection that asked, left open. Closed unanswered, irqbalance's answer would
        meet a closed socket, and irqbalance, which does not ignore SIGPIPE, would die of it."""


def exchange(path: Path, command: str, *, reply: bool) -> str:
    """Send ``command`` to irqbalance's socket at ``path`` with our credentials; its answer.

    irqbalance takes one command per connection and closes it after answering.
    """
    credentials = struct.pack("iII", os.getpid(), os.getuid(), os.getgid())
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    asked = False
    try:
        sock.settimeout(TIMEOUT)
        sock.connect(str(path))
        sock.sendmsg([command.encode()], [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, credentials)])
        if not reply:
            return ""
        asked = True
        return collect(sock)
    except TimeoutError:
        pending = sock if asked else None
        raise IrqBalanceBusyError(f"{path}: no answer in {TIMEOUT:.0f} s (busy)", pending) from None
    except OSError as err:
        asked = False
        raise IrqBalanceError(f"{path}: {err.strerror or err}") from None
    finally:
        if not asked:
            sock.close()  # else answered (collect closed it) or left pending


def collect(sock: socket.socket) -> str:
    """irqbalance's answer on ``sock``, read until it closes, and ``sock`` closed then.

    TimeoutError (``sock`` left open) if it does not answer in time.
    """
    chunks = []
    while chunk := sock.recv(4096):
        chunks.append(chunk)
    sock.close()
    return b"".join(chunks).decode(errors="replace")


class IrqBalance:
    """The irqbalance of ``run_dir`` (None: never looked for), on a node of CPUs ``online``."""

    def __init__(
        self,
        run_dir: Path | None,
        online: frozenset[int],
        *,
        send: Callable[[Path, str, bool], str] = lambda p, c, r: exchange(p, c, reply=r),
    ) -> None:
        self._run_dir = run_dir
        self._online = online
        self._send = send
        self._socket: Path | None = None
        """The socket of the irqbalance found at the last pass; None if none answered."""
        self._why = ""
        """Why no socket there answered at the last pass, if there were sockets."""
        self._pending: tuple[Path, socket.socket] | None = None
        """A question irqbalance has not answered yet (busy), and where it was asked."""

    def running(self) -> bool:
        """Whether an irqbalance answered at the last pass (it places the interrupts)."""
        return self._socket is not None

    def owns(self, source: str) -> bool:
        return source == SOURCE

    def sources(self, kinds: QuietKinds) -> list[str]:
        """irqbalance, if interrupts are asked for and one answers on a socket of ``run_dir``."""
        self._socket = self._find() if kinds.interrupts else None
        return [SOURCE] if self._socket is not None else []

    def unavailable(self, kinds: QuietKinds) -> dict[str, str]:
        """irqbalance's sockets, if none of them answered.

        No irqbalance at all is fine: the interrupts are then nodedra's alone.
        """
        return {SOURCE: self._why} if kinds.interrupts and self._why else {}

    def original(self, source: str) -> frozenset[int] | None:
        return self.reach(source)

    def reach(self, source: str) -> frozenset[int] | None:
        """The CPUs irqbalance may place interrupts on now (None: it is gone)."""
        if self._socket is None:
            return None
        try:
            return self._online - self._setup(self._socket)
        except IrqBalanceError:
            return None

    def steer(self, originals: Mapping[str, frozenset[int]], allowed: frozenset[int]) -> Steered:
        return steer_each(originals, allowed, self._write)

    def restore(self, originals: Mapping[str, frozenset[int]]) -> dict[str, str]:
        return restore_each(originals, self._write)

    def describe(self, source: str) -> str:
        return "irqbalance (where it places interrupts)"

    def close(self) -> None:
        """Wait for the answer to a question left pending (never close it unanswered)."""
        if self._pending is not None:
            _, sock = self._pending
            self._pending = None
            with contextlib.suppress(OSError):
                collect(sock)
            sock.close()

    def _write(self, source: str, cpus: frozenset[int]) -> Written:
        """Have irqbalance place interrupts on ``cpus`` only, unless it does already.

        It bans the other online CPUs; none banned is ``NULL`` (its own setting again). What
        it bans counts from its next pass: until then ``setup`` still says the old list, and
        the list is sent again at nodedra's next pass (the same list, no harm).
        """
        path = self._socket or self._find()  # given back when not asked for, or in cleanup
        if path is None:
            return None, None  # gone: a new irqbalance bans what its configuration says
        banned = self._online - cpus
        try:
            if self._online - self._setup(path) == cpus:
                return cpus, None
            self._send(path, f"settings cpus {format_cpu_list(banned) or 'NULL'}", False)
        except IrqBalanceError as err:
            return None, str(err)
        return cpus, None

    def _find(self) -> Path | None:
        """The socket of the irqbalance running; None if none answers.

        One killed leaves its socket behind, which refuses: the newest that answers is taken.
        """
        self._why = ""
        if self._run_dir is None or not self._run_dir.is_dir():
            return None
        found = sorted(self._run_dir.glob("irqbalance*.sock"), key=_modified, reverse=True)
        refused = []
        for path in found:
            try:
                self._setup(path)
            except IrqBalanceBusyError:
                return path  # there, busy: its state is read at a later pass
            except IrqBalanceError as err:
                refused.append(str(err))
                continue
            return path
        if refused:
            self._why = (
                f"no irqbalance answers ({'; '.join(refused)}): where one runs it may move "
                "interrupts back onto claimed CPUs (it answers root only)"
            )
        return None

    def _answer(self, path: Path) -> str:
        """irqbalance's answer to ``setup``.

        To the question asked at an earlier pass, if it is pending: asking again would only
        queue another question behind it.
        """
        if self._pending is not None:
            asked, sock = self._pending
            self._pending = None
            if asked == path:
                try:
                    sock.settimeout(PENDING_WAIT)
                    return collect(sock)
                except TimeoutError:
                    self._pending = (asked, sock)
                    raise IrqBalanceBusyError(f"{path}: still no answer (busy)") from None
                except OSError as err:
                    sock.close()
                    raise IrqBalanceError(f"{path}: {err.strerror or err}") from None
            sock.close()  # asked of an irqbalance gone since
        try:
            return self._send(path, "setup", True)
        except IrqBalanceBusyError as err:
            if err.pending is not None:
                self._pending = (path, err.pending)
            raise

    def _setup(self, path: Path) -> frozenset[int]:
        """The CPUs irqbalance at ``path`` bans now."""
        answer = self._answer(path)
        found = _BANNED.search(answer)
        if found is None:
            raise IrqBalanceError(f"{path}: setup answered {answer[:200]!r}, with no BANNED")
        return parse_mask(found[1])


def _modified(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
