"""Kubelet requests for one claim in one batch: while a request waits for its batch's
commit, the lock is free, and another request may meet the claim between its allocation and
its CDI spec. What one of them does must never undo what the other reports."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodedra.dra import PrepareResult
from nodedra.dra.cdi import ClaimSpec
from nodedra.lib import faults
from nodedra.resmgr import batchlock
from tests.unit.resmgr.test_manager import GatedSaves, Node, results_on, wait_for


@pytest.fixture(params=["topology-aware", "static"])
def node(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path, request.param)
    yield n
    n.manager.stop()


@pytest.fixture(autouse=True)
def patient_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches wait for everyone who waits for the lock, however slow the machine."""
    monkeypatch.setattr(batchlock, "BATCH_WAIT", 60.0)


def two_requests_behind_a_write(
    node: Node, monkeypatch: pytest.MonkeyPatch, *requests: Any
) -> tuple[list[Any], list[threading.Thread]]:
    """Run each of ``requests`` (a function of the manager's plugin) in a kubelet request of
    its own, both queued for the lock behind a write held at its gate, so that they are
    committed in one batch: the first to take the lock lets it go while the second makes
    its changes. Returns their answers (in ``requests``' order) once both are done."""
    node.manager.start()
    saves = GatedSaves(node, monkeypatch)
    blocker = node.add_claim("u0", results_on(node, 0))
    first = threading.Thread(target=node.manager.plugin.node_prepare, args=([blocker],))
    first.start()
    wait_for(lambda: saves.waiting == 0, "the first request's write at its gate")
    answers: list[Any] = [None] * len(requests)

    def run(i: int) -> None:
        answers[i] = requests[i](node.manager.plugin)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    lock = node.manager._lock
    wait_for(lambda: lock.requests_waiting == len(requests), "both requests at the lock")
    saves.gates[0].set()
    for thread in [first, *threads]:
        thread.join(30)
    assert not any(t.is_alive() for t in [first, *threads]), "a request is stuck"
    return answers, threads


def held(node: Node, uid: str) -> tuple[bool, bool, bool]:
    """Whether the policy, the checkpoint and the CDI specs hold claim ``uid``."""
    return (
        uid in node.manager.policy.claim_uids(),
        uid in node.saved_claims(),
        node.manager.plugin.cdi.has_claim(uid),
    )


@pytest.mark.parametrize("failing", [0, 1], ids=["first-spec-fails", "second-spec-fails"])
def test_a_failing_request_never_releases_a_claim_another_prepares(
    node: Node, monkeypatch: pytest.MonkeyPatch, failing: int
) -> None:
    """Two pods sharing a claim: both requests allocate it in one batch, and one of them
    fails to write the spec. The other reports it prepared: it must stay held."""
    shared = node.add_claim("shared", results_on(node, 1))
    cdi = node.manager.plugin.cdi
    real = cdi.write_spec
    writes = 0

    def write_spec(spec: ClaimSpec, points: faults.WritePoints | None = None) -> list[str]:
        nonlocal writes
        if spec.uid == "shared":
            writes += 1
            if writes == failing + 1:
                raise OSError(28, "No space left on device")
        return real(spec, points)

    monkeypatch.setattr(cdi, "write_spec", write_spec)

    def prepare(plugin: Any) -> PrepareResult:
        return plugin.node_prepare([shared])["shared"]  # type: ignore[no-any-return]

    answers, _ = two_requests_behind_a_write(node, monkeypatch, prepare, prepare)
    assert writes == 2
    errors = [a.error for a in answers]
    assert sum(e is None for e in errors) == 1, errors
    assert any("No space left on device" in str(e) for e in errors), errors
    assert held(node, "shared") == (True, True, True), "a prepared claim was released"
    assert node.manager.committed_claims() == {"u0", "shared"}


def test_a_claim_is_never_unprepared_while_another_request_prepares_it(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unprepare and a prepare of one claim in one batch: one of them is refused (the
    kubelet retries it), and the books agree with the answer of the other."""
    ref = node.add_claim("shared", results_on(node, 1))

    def prepare(plugin: Any) -> Exception | None:
        return plugin.node_prepare([ref])["shared"].error  # type: ignore[no-any-return]

    def unprepare(plugin: Any) -> Exception | None:
        return plugin.node_unprepare([ref])["shared"]  # type: ignore[no-any-return]

    (prepared, unprepared), _ = two_requests_behind_a_write(node, monkeypatch, prepare, unprepare)
    assert (prepared is None) != (unprepared is None), (prepared, unprepared)
    refused = str(prepared or unprepared)
    assert "another kubelet request" in refused, refused
    assert "the kubelet retries" in refused, refused
    assert "default/claim-shared (shared)" in refused
    if prepared is None:
        assert held(node, "shared") == (True, True, True)
    else:
        assert held(node, "shared") == (False, False, False)
