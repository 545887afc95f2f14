"""BatchLock.idle: the glance the NRI connection takes before handling an event inline."""

from __future__ import annotations

import threading

from nodedra.resmgr.batchlock import BatchLock
from tests.peers.cluster import poll


def test_idle_only_while_nobody_holds_or_waits_for_the_lock() -> None:
    lock = BatchLock()
    assert lock.idle()
    with lock:
        assert not lock.idle()
    assert lock.idle()
    lock.hold_for_request()
    assert not lock.idle()
    lock.request_done()
    lock.release()
    assert lock.idle()


def test_not_idle_while_a_request_is_committed() -> None:
    """An event would wait for the commit and the request after it."""
    lock = BatchLock()
    committing, commit_may_end = threading.Event(), threading.Event()

    def commit() -> None:
        committing.set()
        commit_may_end.wait(30)

    def request() -> None:
        lock.hold_for_request()
        try:
            lock.wait_for_commit(lambda: lock.commit_batch(commit))
        finally:
            lock.request_done()
            lock.release()

    thread = threading.Thread(target=request)
    thread.start()
    assert committing.wait(30)
    assert not lock.idle()
    commit_may_end.set()
    thread.join(30)
    poll(lambda: lock.idle() or None, 30, lambda: "the lock idle once the request is done")
