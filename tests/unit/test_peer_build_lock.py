"""The lock that keeps two processes from building one group of peers at once.

tox's py311 starts a background build of the other releases' peers; compat, next, must
wait for a build still under way rather than start its own, and say that it waits.
"""

from __future__ import annotations

import fcntl
import io
import threading
from pathlib import Path

from tests.peers.cache import locked
from tests.peers.cluster import poll


def test_a_build_that_finds_the_group_locked_says_so_and_goes_on_once_it_is_free(
    tmp_path: Path,
) -> None:
    lock = tmp_path / ".kubernetes-v1.35.4.lock"
    log = io.StringIO()
    entered = threading.Event()

    def build() -> None:
        with locked(lock, log, "kubernetes-v1.35.4"):
            entered.set()

    with open(lock, "w") as held:  # another process's build, as flock sees it
        fcntl.flock(held, fcntl.LOCK_EX)
        waiter = threading.Thread(target=build)
        waiter.start()
        poll(
            lambda: "waiting" in log.getvalue() or None,
            timeout=10,
            describe=lambda: f"no word of waiting; the log: {log.getvalue()!r}",
        )
        assert not entered.is_set(), "went ahead while another build held the lock"
        fcntl.flock(held, fcntl.LOCK_UN)
    waiter.join(timeout=10)
    assert entered.is_set()
    assert log.getvalue() == "[peers] waiting for another process building kubernetes-v1.35.4\n"


def test_a_build_that_finds_the_group_free_says_nothing(tmp_path: Path) -> None:
    log = io.StringIO()
    with locked(tmp_path / ".helm.lock", log, "helm"):
        pass
    assert log.getvalue() == ""
