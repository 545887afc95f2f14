"""Many kubelet requests at once, while the configuration keeps changing under them.

The claims are on a real API server, allocated as the scheduler leaves them.

Eight threads prepare and unprepare claims of their own (some requests fail: CPUs run out,
or a device is reserved just then) while another thread keeps reconfiguring the policy's
reserved CPUs, some of which reconfigurations are refused, and a third checks the books at
random moments. Every answer must be consistent with the books right after it, and the
books with themselves at every moment: checkpoint = policy, no CPU in two claims or lost,
the CDI specs on disk exactly those of the claims held.
"""

from __future__ import annotations

import functools
import random
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nodedra.dra import ClaimRef
from nodedra.policy import PolicyError, parse_config
from nodedra.topology.cpulist import format_cpu_list
from tests.peers.controlplane import ControlPlane
from tests.reliability.helpers import (
    OTHER_DRIVER_RESULT,
    POLICIES,
    ClaimsOnServer,
    LocalNode,
    check_state,
    dra_client,
    fixture_topology,
    grpc_claims,
    short_dir,
    static_result,
    ta_result,
)
from tests.unit.dra.fakes import make_claim

WORKERS = 8
CLAIMS_PER_WORKER = 6
REQUESTS_PER_WORKER = 24
SEED = 20240611

UNKNOWN_CPU = static_result(999)

#: Answers as both transports give them: UID -> (error or None, CDI IDs of each device).
Answers = dict[str, tuple[str | None, list[list[str]]]]


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_dir("nd-conc-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def random_claim(policy: str, uid: str, rng: random.Random) -> dict[str, Any]:
    """A claim of one to three results, of this node's driver and at times of another."""
    results: list[dict[str, Any]] = []
    for _ in range(rng.randint(1, 3)):
        if policy == "topology-aware":
            memory = rng.choice([None, "0", "4Mi", "256Mi"])
            results.append(ta_result(rng.randrange(4), str(rng.randint(1, 4)), memory))
        else:
            results.append(static_result(rng.randrange(56)))
    if rng.random() < 0.2:
        results.insert(rng.randrange(len(results) + 1), OTHER_DRIVER_RESULT)
    return make_claim(uid, results)


class Transport:
    """How a worker reaches the plugin: by calling it, or through its gRPC socket."""

    def __init__(self, node: LocalNode, kind: str, version: str) -> None:
        self.node = node
        self.kind = kind
        self.version = version

    def __enter__(self) -> Transport:
        if self.kind == "grpc":
            self._client = dra_client(self.node.manager.plugin.sockets.dra, self.version)
            self.pb, self.stub = self._client.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.kind == "grpc":
            self._client.__exit__(None, None, None)

    def prepare(self, refs: list[ClaimRef]) -> Answers:
        if self.kind == "direct":
            return {
                uid: (
                    None if a.error is None else str(a.error),
                    [list(d.cdi_device_ids) for d in a.devices],
                )
                for uid, a in self.node.prepare(*refs).items()
            }
        request = self.pb.NodePrepareResourcesRequest(claims=grpc_claims(self.pb, refs))
        answer = self.stub.NodePrepareResources(request, timeout=60)
        return {
            uid: (entry.error or None, [list(d.cdi_device_ids) for d in entry.devices])
            for uid, entry in answer.claims.items()
        }

    def unprepare(self, refs: list[ClaimRef]) -> dict[str, str | None]:
        if self.kind == "direct":
            return {
                uid: None if err is None else str(err)
                for uid, err in self.node.unprepare(*refs).items()
            }
        request = self.pb.NodeUnprepareResourcesRequest(claims=grpc_claims(self.pb, refs))
        answer = self.stub.NodeUnprepareResources(request, timeout=60)
        return {uid: entry.error or None for uid, entry in answer.claims.items()}


class Run:
    """The threads of one test, and what they saw."""

    def __init__(self, node: LocalNode, policy: str, transport: str) -> None:
        self.node = node
        self.policy = policy
        self.transport = transport
        self.failures: list[BaseException] = []
        self.done = threading.Event()
        self.claims: dict[str, dict[str, Any]] = {}
        """Claim UID -> the claim."""
        self.refs: dict[str, ClaimRef] = {}
        """The claim called ``w<worker>-c<k>`` -> the kubelet's reference to it."""
        self.held: dict[int, set[str]] = {w: set() for w in range(WORKERS)}
        self.prepared = self.failed = 0
        self.accepted: list[str] = []
        self.refused: list[str] = []
        self.checks = 0
        self._counts = threading.Lock()

    def guarded(self, body: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                body()
            except BaseException as err:
                self.failures.append(err)
                self.done.set()

        return run

    # The kubelet's part ------------------------------------------------------------------

    def worker(self, w: int) -> None:
        rng = random.Random(SEED * 100 + w)
        mine = [self.refs[f"w{w}-c{k}"] for k in range(CLAIMS_PER_WORKER)]
        with Transport(self.node, self.transport, ("v1", "v1beta1")[w % 2]) as kubelet:
            for _ in range(REQUESTS_PER_WORKER):
                if self.done.is_set():
                    return
                refs = rng.sample(mine, rng.randint(1, 3))
                if rng.random() < 0.6:
                    self.check_prepared(w, refs, kubelet.prepare(refs))
                else:
                    self.check_unprepared(w, refs, kubelet.unprepare(refs))

    def our_results(self, uid: str) -> list[dict[str, Any]]:
        results = self.claims[uid]["status"]["allocation"]["devices"]["results"]
        return [r for r in results if r["driver"] == self.node.driver]

    def check_prepared(self, w: int, refs: list[ClaimRef], answers: Answers) -> None:
        names = {ref.uid: str(ref) for ref in refs}
        uids = list(names)
        assert set(answers) == set(uids)
        with self.node.manager:  # the books right after the answer (only w touches its claims)
            held = self.node.policy.claim_uids()
            grants = {uid: self.node.policy.grants(uid) for uid in uids if uid in held}
            specs = {uid: self.node.manager.plugin.cdi.has_claim(uid) for uid in uids}
        for uid, (error, devices) in answers.items():
            ours = self.our_results(uid)
            if error is not None:
                assert names[uid] in error, error
                assert not devices
                # A failed prepare leaves nothing allocated, but a claim held stays held.
                assert (uid in held) is (uid in self.held[w]), (uid, error)
                with self._counts:
                    self.failed += 1
                continue
            assert devices == [
                [f"{self.node.driver}/device=claim-{uid}-{i}"] for i in range(len(ours))
            ]
            if not ours:
                continue
            assert uid in held
            assert specs[uid]
            assert [g.device for g in grants[uid]] == [r["device"] for r in ours]
            if self.policy == "topology-aware":
                wanted = [int(r["consumedCapacity"]["cpu"]) for r in ours]
                assert [len(g.cpus) for g in grants[uid]] == wanted
            self.held[w].add(uid)
            with self._counts:
                self.prepared += 1

    def check_unprepared(
        self, w: int, refs: list[ClaimRef], answers: dict[str, str | None]
    ) -> None:
        uids = [ref.uid for ref in refs]
        assert answers == dict.fromkeys(uids)
        with self.node.manager:
            held = self.node.policy.claim_uids()
            specs = [self.node.manager.plugin.cdi.has_claim(uid) for uid in uids]
        assert not held & set(uids)
        assert not any(specs)
        self.held[w] -= set(uids)

    # The administrator's part ---------------------------------------------------------------

    def reconfigurer(self) -> None:
        """Reserve other CPUs, again and again; some choices must be refused."""
        rng = random.Random(SEED)
        cpus = sorted(fixture_topology().cpus)
        always_refused = {
            "every CPU": {"policy": self.policy, "reservedCPUs": format_cpu_list(cpus)},
            "another policy": {
                "policy": "static" if self.policy == "topology-aware" else "topology-aware"
            },
        }
        while not self.done.is_set():
            for name, config in always_refused.items():
                with pytest.raises(PolicyError):
                    self.node.manager.reconfigure(parse_config(config))
                self.refused.append(name)
            self.node.manager.reconfigure(parse_config({"policy": self.policy}))
            self.accepted.append("nothing reserved")
            reserved = format_cpu_list(rng.sample(cpus, rng.randint(1, 6)))
            refusal = None
            try:
                self.node.manager.reconfigure(
                    parse_config({"policy": self.policy, "reservedCPUs": reserved})
                )
            except PolicyError as err:  # reserving CPUs a claim holds just then
                refusal = str(err)
            if refusal is None:
                self.accepted.append(reserved)
            else:
                assert "can't reserve CPUs" in refusal, refusal
                self.refused.append(reserved)
            self.done.wait(0.002)

    def checker(self) -> None:
        while not self.done.wait(0.003):
            check_state(self.node.state())
            self.checks += 1


@pytest.mark.parametrize("transport", ["direct", "grpc"])
@pytest.mark.parametrize("policy", POLICIES)
def test_concurrent_prepares_unprepares_and_reconfigurations(
    control_plane: ControlPlane, namespace: str, root: Path, policy: str, transport: str
) -> None:
    node = LocalNode(root, policy, cluster=ClaimsOnServer(control_plane, namespace))
    run = Run(node, policy, transport)
    rng = random.Random(SEED)
    for w in range(WORKERS):
        for k in range(CLAIMS_PER_WORKER):
            claim = random_claim(policy, f"w{w}-c{k}", rng)
            if k == 0:  # doomed: a device the node does not have (so some prepares fail)
                results = claim["status"]["allocation"]["devices"]["results"]
                results.append(ta_result(9, "1") if policy == "topology-aware" else UNKNOWN_CPU)
            ref = node.serve(claim)
            run.refs[f"w{w}-c{k}"], run.claims[ref.uid] = ref, claim
    node.manager.start()
    try:
        workers = [
            threading.Thread(
                target=run.guarded(functools.partial(run.worker, w)), name=f"kubelet-{w}"
            )
            for w in range(WORKERS)
        ]
        others = [
            threading.Thread(target=run.guarded(run.reconfigurer), name="reconfigurer"),
            threading.Thread(target=run.guarded(run.checker), name="checker"),
        ]
        for thread in workers + others:
            thread.start()
        for thread in workers:
            thread.join(timeout=120)
        run.done.set()
        for thread in others:
            thread.join(timeout=60)
        assert not any(t.is_alive() for t in workers + others), "a thread is stuck"
        if run.failures:
            raise run.failures[0]

        # Something of each kind happened: the seeds make the workers ask for the doomed
        # claims and the reconfigurer for what is always refused, whatever the timing.
        assert run.prepared > 0
        assert run.failed > 0
        assert "nothing reserved" in run.accepted
        assert {"every CPU", "another policy"} <= set(run.refused)

        state = node.state()
        check_state(state)
        assert set(state["claims"]) == set().union(*run.held.values())
        assert set(node.unprepare(*run.refs.values()).values()) == {None}
        state = node.state()
        check_state(state)
        assert state["claims"] == {}
        assert state["free"] == state["grantable"]
    finally:
        node.manager.stop()
    assert node.shutdowns == []
