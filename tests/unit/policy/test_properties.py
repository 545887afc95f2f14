"""Random sequences of allocate, release, reconfigure and restart keep the books straight.

Whatever happens, no CPU is held by two claims, none goes missing (each grantable CPU is
either free or held by exactly the claim the test believes holds it), and a restart from
the checkpoint gives back exactly the state before it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from nodedra.dra import AllocationResult
from nodedra.policy import PolicyConfig, PolicyError, make_policy
from nodedra.policy.base import ExclusiveCPUPolicy
from nodedra.policy.static import device_name as cpu_device
from nodedra.policy.topology_aware import device_name as node_device
from nodedra.resmgr.checkpoint import FILE_NAME, Checkpoint, State
from tests.unit.policy.conftest import Host, claim, topology

SHAPE = "two-socket-smt2-numa4"
TOPOLOGY = topology(SHAPE)
UIDS = st.sampled_from([f"claim-{i}" for i in range(8)])


class Books(RuleBasedStateMachine):
    policy_name = "topology-aware"

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp())
        self.checkpoint = Checkpoint(self.dir / FILE_NAME)
        self.policy = self._new_policy(PolicyConfig(policy=self.policy_name), {})
        self.held: dict[str, frozenset[int]] = {}

    def _new_policy(self, config: PolicyConfig, claims: dict[str, object]) -> ExclusiveCPUPolicy:
        policy = make_policy(TOPOLOGY, config)
        policy.start(Host(), claims)
        return policy

    def _results(self, data: st.DataObject) -> list[AllocationResult]:
        driver = f"{self.policy_name}.nri.io"
        if self.policy_name == "static":
            cpus = data.draw(st.lists(st.sampled_from(TOPOLOGY.cpu_ids), min_size=1, max_size=3))
            return [AllocationResult("r", driver, "p", cpu_device(c)) for c in cpus]
        results = []
        for _ in range(data.draw(st.integers(1, 3))):
            node = data.draw(st.sampled_from(sorted(TOPOLOGY.nodes)))
            count = data.draw(st.integers(1, 6))
            consumed = {"cpu": str(count), "memory": str(data.draw(st.integers(0, 3)) << 20)}
            results.append(AllocationResult("r", driver, "p", node_device(node), None, consumed))
        return results

    @rule(uid=UIDS, data=st.data())
    def allocate(self, uid: str, data: st.DataObject) -> None:
        results = self._results(data)
        before = self.policy.snapshot()
        try:
            edits = self.policy.allocate_claim(claim(uid), results)
        except PolicyError:
            assert self.policy.snapshot() == before, "a failed allocation left something"
            return
        assert len(edits) == len(results)
        assert all(e["env"] for e in edits)
        self.held[uid] = frozenset(c for g in self.policy.grants(uid) for c in g.cpus)

    @rule(uid=UIDS)
    def release(self, uid: str) -> None:
        self.policy.release_claim(uid)
        self.held.pop(uid, None)

    @rule(reserved=st.frozensets(st.sampled_from(TOPOLOGY.cpu_ids), max_size=4))
    def reconfigure(self, reserved: frozenset[int]) -> None:
        config = PolicyConfig(policy=self.policy_name, reserved_cpus=reserved)
        before = self.policy.config
        try:
            self.policy.reconfigure(config)
        except PolicyError:
            assert self.policy.config is before
            assert any(reserved & cpus for cpus in self.held.values())

    @rule()
    def restart(self) -> None:
        snapshot = self.policy.snapshot()
        self.checkpoint.save(State(self.policy_name, f"{self.policy_name}.nri.io", snapshot))
        state = self.checkpoint.load()
        assert state is not None
        self.policy = self._new_policy(self.policy.config, dict(state.claims))
        assert self.policy.snapshot() == snapshot

    @invariant()
    def no_cpu_twice_none_lost(self) -> None:
        assert self.policy.claim_uids() == set(self.held)
        seen: set[int] = set()
        for uid, cpus in self.held.items():
            assert frozenset(c for g in self.policy.grants(uid) for c in g.cpus) == cpus
            assert not seen & cpus
            seen |= cpus
        assert not seen & self.policy.config.reserved_cpus
        assert self.policy.free_cpus() == self.policy.grantable - seen


class StaticBooks(Books):
    policy_name = "static"


TestTopologyAwareBooks = Books.TestCase
TestStaticBooks = StaticBooks.TestCase
TestTopologyAwareBooks.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestStaticBooks.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
