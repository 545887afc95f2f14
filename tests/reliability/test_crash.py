"""Crash safety: nodedra killed (SIGKILL) at any crash point loses nothing, gives nothing twice.

Each test prepares some claims, runs nodedra in a process of its own (crashy_node) with
NODEDRA_CRASH_AT set so that it kills itself in the middle of a prepare or unprepare, and then
restarts it without the variable, as the DaemonSet would. After the restart the books must
be straight (helpers.check_state), the claims held before the crash untouched, and the
kubelet's retries must get what a run without the crash would have given.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nodedra.dra import KubeClusterAPI
from nodedra.dra.endpoint import SERIALIZE_LOCK
from nodedra.lib import faults
from nodedra.resmgr import Checkpoint
from nodedra.resmgr.checkpoint import FILE_NAME
from tests.peers.controlplane import ControlPlane
from tests.reliability.crashy_node import KUBECONFIG_FILE, write_claims
from tests.reliability.helpers import (
    AFTER_CRASH,
    POLICIES,
    ROOT,
    ClaimsOnServer,
    LocalNode,
    admin_client,
    check_state,
    encode_answer,
    ref_of,
    sample_claim,
    short_dir,
)

PREPARE_POINTS = [p for p in faults.POINTS if p.startswith("prepare-")]


def test_every_crash_point_is_covered() -> None:
    assert set(AFTER_CRASH) == set(faults.POINTS)


@dataclass
class Run:
    """What a crashy_node process did: its exit status and the JSON lines it printed."""

    returncode: int
    lines: list[dict[str, Any]]
    stderr: str

    def result(self, op: str) -> Any:
        (found,) = [
            line["result"] for line in self.lines if line.get("op") == op and "result" in line
        ]
        return found

    def answered(self, op: str) -> dict[str, Any]:
        """The answers the requests of ``op`` had (and printed) before the process ended."""
        return {
            line["answered"]: line["answer"]
            for line in self.lines
            if line.get("op") == op and "answered" in line
        }

    def results(self) -> list[Any]:
        return [line["result"] for line in self.lines if "result" in line]


def run_node(root: Path, policy: str, *ops: str, crash_at: str | None = None) -> Run:
    """Run nodedra in a process of its own on ``root``; crash at ``crash_at`` if given."""
    env = {k: v for k, v in os.environ.items() if k != faults.CRASH_AT}
    if crash_at is not None:
        env[faults.CRASH_AT] = crash_at
    done = subprocess.run(
        [sys.executable, "-m", "tests.reliability.crashy_node", str(root), policy, *ops],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    return Run(done.returncode, lines, done.stderr)


class Scene:
    """One node's directories, its claims on the API server, and an in-process nodedra.

    The claims "a", "b" and "c" (helpers.sample_claim) are created in a namespace of their
    own; the crashy node reads them from the real API server as the plugin would.
    """

    def __init__(self, root: Path, policy: str, cp: ControlPlane, namespace: str) -> None:
        self.root = root
        self.policy = policy
        self.cp = cp
        served = ClaimsOnServer(cp, namespace)
        self.refs = {x: ref_of(served.create(sample_claim(policy, x))) for x in "abc"}
        write_claims(root, self.refs)
        shutil.copy(cp.admin_kubeconfig, root / KUBECONFIG_FILE)

    def uid(self, letter: str) -> str:
        return self.refs[letter].uid

    def node(self, root: Path | None = None) -> LocalNode:
        return LocalNode(
            root or self.root, self.policy, cluster=KubeClusterAPI(admin_client(self.cp))
        )

    def prepare(self, *letters: str) -> dict[str, dict[str, Any]]:
        """Prepare the claims in one in-process run of nodedra, started and stopped."""
        node = self.node()
        node.manager.start()
        try:
            answers = node.prepare(*(self.refs[x] for x in letters))
        finally:
            node.manager.stop()
        return {uid: encode_answer(a) for uid, a in answers.items()}

    def reference(self) -> Reference:
        """What a run without any crash gives, on a node of its own: b, then a, then c."""
        root = short_dir("nd-ref-")
        try:
            node = self.node(root)
            node.manager.start()
            answers, claims = {}, {}
            prefix = ""
            for letter in "bac":
                (answer,) = node.prepare(self.refs[letter]).values()
                assert answer.error is None, answer.error
                answers[letter] = encode_answer(answer)
                prefix += letter
                claims[prefix] = node.policy.snapshot()
            node.manager.stop()
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return Reference(answers, claims)

    def spec(self, letter: str) -> bytes | None:
        path = self.root / "cdi" / f"{sample_driver(self.policy)}-device_{self.uid(letter)}.yaml"
        return path.read_bytes() if path.exists() else None

    def saved_claims(self) -> dict[str, Any]:
        state = Checkpoint(self.root / "state" / FILE_NAME).load()  # not corrupt
        assert state is not None
        return dict(state.claims)


def sample_driver(policy: str) -> str:
    return f"{policy}.nri.io"


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_dir("nd-crash-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def scene_of(control_plane: ControlPlane, namespace: str, root: Path) -> Callable[[str], Scene]:
    return lambda policy: Scene(root, policy, control_plane, namespace)


@dataclass(frozen=True)
class Reference:
    """What a run without any crash gives: b, then a, then c prepared, in that order."""

    answers: dict[str, dict[str, Any]]
    """Letter -> the answer to its prepare."""
    claims: dict[str, dict[str, Any]]
    """The policy's snapshot after preparing b; b and a; b, a and c."""


def assert_died_in(run: Run, op: str) -> None:
    """The process killed itself with SIGKILL in the middle of ``op``, before answering."""
    assert run.returncode == -signal.SIGKILL, (run.returncode, run.stderr[-2000:])
    assert run.lines[-1] == {"event": "begin", "op": op}, run.lines


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("point", faults.POINTS)
def test_crash_at_point(scene_of: Callable[[str], Scene], policy: str, point: str) -> None:
    """Crash in claim a's prepare (or unprepare) while claim b is held; restart; retry."""
    scene = scene_of(policy)
    a, b = scene.uid("a"), scene.uid("b")
    unprepare = point.startswith("unprepare-")
    setup = scene.prepare(*("b", "a") if unprepare else ("b",))
    assert all(answer["error"] is None for answer in setup.values()), setup
    held_b = scene.saved_claims()[b]
    spec_b = scene.spec("b")
    assert spec_b is not None

    op = "unprepare:a" if unprepare else "prepare:a"
    assert_died_in(run_node(scene.root, policy, op, crash_at=point), op)

    in_checkpoint, has_spec = AFTER_CRASH[point]
    saved = scene.saved_claims()
    assert (a in saved) is in_checkpoint
    assert (scene.spec("a") is not None) is has_spec
    assert saved[b] == held_b

    after = run_node(scene.root, policy, "state", "prepare:a", "state", "unprepare:a", "state")
    assert after.returncode == 0, after.stderr[-2000:]
    started, prepared, with_a, unprepared, without_a = after.results()
    # Restored as committed; a spec whose claim was not committed was swept at the start.
    # A claim committed without its spec is one only the kubelet's retry completes.
    check_state(started, every_claim_has_a_spec=(in_checkpoint, has_spec) != (True, False))
    assert (a in started["claims"]) is in_checkpoint
    for state in (with_a, without_a):
        check_state(state)
    for state in (started, with_a, without_a):
        assert state["claims"][b] == held_b

    ref = scene.reference()
    assert prepared == {a: ref.answers["a"]}, "the retried prepare differs from a clean one"
    assert with_a["claims"] == ref.claims["ba"], "the retried prepare allocated differently"
    if in_checkpoint:
        assert with_a["claims"] == started["claims"], "the retried prepare allocated more"
    assert unprepared == {a: None}
    assert without_a["claims"] == ref.claims["b"]
    assert scene.spec("b") == spec_b, "claim b's CDI spec changed"


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("point", PREPARE_POINTS)
def test_crash_while_kubelet_reprepares(
    scene_of: Callable[[str], Scene], policy: str, point: str
) -> None:
    """A restarted kubelet re-prepares claim a (held) with a new claim c; the crash hits a.

    Claims a and b must come out of it exactly as they were: same grants, same specs. A
    failed or interrupted re-prepare never takes anything from running containers.
    """
    scene = scene_of(policy)
    a, c = scene.uid("a"), scene.uid("c")
    first = scene.prepare("b", "a")
    held = scene.saved_claims()
    specs = {x: scene.spec(x) for x in "ab"}

    op = "prepare:a,c"
    assert_died_in(run_node(scene.root, policy, op, crash_at=point), op)
    # The request's allocations are committed together, in one write: past it, c is held
    # too (its spec comes later; the kubelet's retry writes it).
    ref = scene.reference()
    committed = AFTER_CRASH[point][0]
    assert scene.saved_claims() == (ref.claims["bac"] if committed else held)
    assert {x: scene.spec(x) for x in "ab"} == specs
    assert scene.spec("c") is None

    after = run_node(scene.root, policy, "state", op, "state")
    assert after.returncode == 0, after.stderr[-2000:]
    started, prepared, with_c = after.results()
    check_state(started, every_claim_has_a_spec=not committed)
    check_state(with_c)
    assert started["claims"] == (ref.claims["bac"] if committed else held)
    assert prepared == {a: first[a], c: ref.answers["c"]}
    assert with_c["claims"] == ref.claims["bac"]
    assert {x: scene.spec(x) for x in "ab"} == specs


#: Crash points inside one batch of three requests (``together``), each for one of the claims
#: a, b and c, with the picture on disk right after the crash: (the checkpoint holds the three
#: claims, how many of them have a CDI spec). The batch's one commit comes after all three
#: allocated; then the requests write their specs one after the other.
BATCH_POINTS = {
    f"{faults.PREPARE_ALLOCATED}@2": (False, 0),  # the second request allocated, no commit yet
    faults.PREPARE_CHECKPOINT.written: (True, 0),  # one write holds all three
    faults.PREPARE_CHECKPOINT.synced: (True, 0),
    faults.PREPARE_COMMITTED: (True, 0),  # between the batch's save and the specs
    f"{faults.PREPARE_SPEC.renamed}@2": (True, 2),  # the second spec in place, not answered
    f"{faults.PREPARE_SPEC.written}@3": (True, 2),  # the third spec half written
    f"{faults.PREPARE_WRITTEN}@3": (True, 3),  # every spec written, the last not answered
}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("point", BATCH_POINTS)
def test_crash_in_a_batch_of_requests(
    scene_of: Callable[[str], Scene], policy: str, point: str
) -> None:
    """Three kubelet requests committed together; the crash hits the batch at ``point``.

    After the restart every claim is whole or not there: held with its spec, held without
    one (committed, for the retry to finish), or not held and without a spec. Every claim
    the kubelet was told is prepared is held, with its spec; the kubelet's retries of the
    three requests (one batch again) succeed, give the answers given before, and change
    nothing that was committed.
    """
    scene = scene_of(policy)
    uids = {scene.uid(x) for x in "abc"}
    op = "together:a,b,c"
    crashed = run_node(scene.root, policy, op, crash_at=point)
    assert crashed.returncode == -signal.SIGKILL, (crashed.returncode, crashed.stderr[-2000:])
    assert {"event": "begin", "op": op} in crashed.lines
    assert (scene.root / "plugin" / SERIALIZE_LOCK).exists(), "ran without the instance lock"
    told = crashed.answered(op)
    assert all(answer["error"] is None for answer in told.values()), told

    committed, specs = BATCH_POINTS[point]
    assert set(scene.saved_claims()) == (uids if committed else set())
    assert sum(scene.spec(x) is not None for x in "abc") == specs

    after = run_node(scene.root, policy, "state", op, "state")
    assert after.returncode == 0, after.stderr[-2000:]
    started, retried, with_all = after.results()
    check_state(started, every_claim_has_a_spec=False)  # no half-prepared claim, no leftover
    assert set(started["claims"]) == (uids if committed else set())
    assert len(started["specs"]) == specs
    assert set(told) <= set(started["specs"]), "a claim the kubelet was told of is not whole"
    assert retried == {**retried, **told}, "a retry's answer differs from the one given before"
    assert all(answer["error"] is None for answer in retried.values()), retried
    assert set(retried) == uids
    check_state(with_all)
    assert set(with_all["claims"]) == uids
    for uid in started["claims"]:
        assert with_all["claims"][uid] == started["claims"][uid], "the retry allocated anew"


def test_a_crash_point_ends_nodedra_as_the_first_process_of_its_pid_namespace() -> None:
    """In its container nodedra is PID 1, whose own SIGKILL the kernel ignores: the crash
    point must end it all the same, at once (no code after the point runs)."""
    point = faults.PREPARE_CHECKPOINT.synced
    script = (
        "import os; from nodedra.lib import faults; print(os.getpid(), flush=True); "
        f"faults.crash_point({point!r}); print('survived', flush=True)"
    )
    run = subprocess.run(
        ["unshare", "--pid", "--fork", sys.executable, "-c", script],
        env={**os.environ, faults.CRASH_AT: point},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.stdout == "1\n", (run.stdout, run.stderr)
    assert run.returncode == 128 + signal.SIGKILL, (run.returncode, run.stderr)
