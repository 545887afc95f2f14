"""The plugin's contract with its owner and policy: lifecycle, the gate, prepare and unprepare."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from nodedra.dra import (
    ClaimError,
    ClaimRef,
    HealthNotSupportedError,
    KubeAPIError,
    NotServingClaimsError,
    Options,
    Plugin,
    PreparedDevice,
    RecoverableError,
)
from nodedra.dra.cdi import ClaimSpec
from nodedra.dra.endpoint import KUBELET_PLUGINS_DIR
from nodedra.grpc_gen import pluginregistration_v1_pb2, pluginregistration_v1_pb2_grpc
from nodedra.lib.faults import WritePoints
from tests.peers.cluster import poll
from tests.unit.dra.fakes import (
    DRIVER,
    NODE,
    FakeCluster,
    FakeOwner,
    FakePolicy,
    devices,
    make_claim,
    result,
)


class Rig:
    """A plugin with fakes of our own protocols around it, in a scratch directory."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.policy = FakePolicy()
        self.owner = FakeOwner(self.policy)
        self.cluster = FakeCluster()
        self.cdi_dir = tmp / "cdi"
        self.options = Options(
            node_name=NODE,
            kube_client=self.cluster,
            owner=self.owner,
            policy=self.policy,
            registrar_dir=tmp / "registry",
            plugin_data_dir=tmp / "plugins" / DRIVER,
            cdi_dir=self.cdi_dir,
        )
        self.plugin = Plugin(DRIVER, self.options)

    def add(self, claim: dict[str, Any]) -> ClaimRef:
        meta = claim["metadata"]
        self.cluster.claims[(meta["namespace"], meta["name"])] = claim
        return ClaimRef(meta["namespace"], meta["name"], meta["uid"])

    def published(self, given: list[dict[str, Any]]) -> None:
        """Start the plugin with ``given`` devices, wait until they are published, stop it."""
        self.plugin.publish(given)
        self.plugin.start()
        try:
            assert self.plugin.wait_published(10) is not None
        finally:
            self.plugin.stop()

    def specs(self) -> list[str]:
        return sorted(p.name for p in self.cdi_dir.glob("*.yaml")) if self.cdi_dir.exists() else []


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path)


@pytest.fixture
def allowed(rig: Rig) -> Rig:
    rig.plugin.allow_claims()
    return rig


# --- construction and lifecycle -------------------------------------------------------


@pytest.mark.parametrize(
    ("driver", "change", "message"),
    [
        ("", {}, "driver name"),
        (DRIVER, {"node_name": ""}, "name of its node"),
        (DRIVER, {"kube_client": None}, "kube_client"),
        (DRIVER, {"owner": None}, "owner"),
        (DRIVER, {"policy": None}, "policy"),
        ("1.nri.io", {}, "invalid CDI vendor"),
    ],
)
def test_new_refuses_missing_parts(
    rig: Rig, driver: str, change: dict[str, Any], message: str
) -> None:
    for key, value in change.items():
        setattr(rig.options, key, value)
    with pytest.raises(ValueError, match=message):
        Plugin(driver, rig.options)


def test_default_directories(rig: Rig) -> None:
    rig.options.plugin_data_dir = None
    rig.options.registrar_dir = None
    rig.options.cdi_dir = None
    plugin = Plugin(DRIVER, rig.options)
    assert plugin.plugin_data_dir == KUBELET_PLUGINS_DIR / DRIVER
    assert plugin.sockets.dra == KUBELET_PLUGINS_DIR / DRIVER / "dra.sock"
    assert (
        plugin.sockets.registration
        == Path("/var/lib/kubelet/plugins_registry") / f"{DRIVER}-reg.sock"
    )
    assert plugin.cdi.directory == Path("/var/run/cdi")


def test_rolling_update_sockets(rig: Rig) -> None:
    rig.options.rolling_update_uid = "pod-1"
    plugin = Plugin(DRIVER, rig.options)
    assert plugin.sockets.dra.name == "dra-pod-1.sock"
    assert plugin.sockets.registration.name == f"{DRIVER}-pod-1-reg.sock"
    assert plugin.sockets.lock == rig.tmp / "plugins" / DRIVER / "serialize.lock"


def test_start_publishes_devices_given_before(rig: Rig) -> None:
    rig.plugin.publish(devices(3))
    rig.plugin.start()
    try:
        assert rig.plugin.wait_published(10) is not None
        assert rig.cluster.pool_devices() == devices(3)
        assert rig.plugin.sockets.dra.is_socket()
        assert rig.plugin.sockets.registration.is_socket()
        rig.plugin.publish(devices(5))
        assert rig.plugin.wait_published(10) is not None
        assert rig.cluster.pool_devices() == devices(5)
    finally:
        rig.plugin.stop()


def test_no_devices_publish_one_empty_slice(rig: Rig) -> None:
    rig.plugin.start()
    try:
        assert rig.plugin.wait_published(10) is not None
    finally:
        rig.plugin.stop()
    (only,) = rig.cluster.slices.values()
    assert only["spec"]["driver"] == DRIVER
    assert only["spec"]["devices"] == []


def test_publish_copies_its_input(rig: Rig) -> None:
    given = devices(2)
    rig.plugin.publish(given)
    given[0]["name"] = "mutated"
    rig.plugin.start()
    try:
        assert rig.plugin.wait_published(10) is not None
    finally:
        rig.plugin.stop()
    assert rig.cluster.pool_devices() == devices(2)


def test_start_twice_stop_idempotent_restart(rig: Rig) -> None:
    rig.plugin.stop()  # before start: nothing to do
    rig.plugin.start()
    with pytest.raises(RuntimeError, match="already started"):
        rig.plugin.start()
    rig.plugin.stop()
    rig.plugin.stop()
    assert not rig.plugin.sockets.dra.exists()
    assert not rig.plugin.sockets.registration.exists()
    rig.plugin.start()
    try:
        assert rig.plugin.sockets.dra.is_socket()
    finally:
        rig.plugin.stop()
    assert rig.cluster.slices, "stopping keeps the slices"


def test_health_says_what_is_missing(rig: Rig) -> None:
    """Ready takes all three: served, registered by the kubelet, slices published."""
    assert rig.plugin.health().problems == ("not started",)
    rig.cluster.fail_next = [KubeAPIError(503, "etcd is down")] * 50
    rig.plugin.start()
    try:
        failing = poll(
            lambda: h if "etcd is down" in " ".join((h := rig.plugin.health()).problems) else None,
            30,
            lambda: f"a failed publication in {rig.plugin.health()}",
        )
        assert not failing.ready
        assert failing.problems == (
            "claims are not allowed yet (the owner is synchronizing)",
            f"not registered with the kubelet yet (socket {rig.plugin.sockets.registration})",
            "publishing ResourceSlices failed: (503) etcd is down",
        )
        rig.cluster.fail_next = []
        rig.plugin.resync()
        assert rig.plugin.wait_published(30) is not None
        rig.plugin.allow_claims()
        # What the kubelet's plugin watcher does with a registration socket.
        with grpc.insecure_channel(f"unix:{rig.plugin.sockets.registration}") as channel:
            registration = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
            registration.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=10)
            refused = pluginregistration_v1_pb2.RegistrationStatus(
                plugin_registered=False, error="no handler"
            )
            registration.NotifyRegistrationStatus(refused, timeout=10)
            assert rig.plugin.health().problems == ("the kubelet refused the driver: no handler",)
            accepted = pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=True)
            registration.NotifyRegistrationStatus(accepted, timeout=10)
        health = rig.plugin.health()
        assert health.ready
        assert health.problems == ()
    finally:
        rig.plugin.stop()
    assert rig.plugin.health().problems == ("not started",)


def test_watch_health_status_declines(rig: Rig) -> None:
    with pytest.raises(HealthNotSupportedError):
        rig.plugin.watch_health_status()


def test_handle_error(rig: Rig) -> None:
    rig.plugin.handle_error(RecoverableError(KubeAPIError(503, "busy")), "publishing")
    assert rig.owner.shutdowns == []
    rig.plugin.handle_error(RuntimeError("socket gone"), "gRPC server")
    assert len(rig.owner.shutdowns) == 1
    assert "socket gone" in rig.owner.shutdowns[0]
    assert "gRPC server" in rig.owner.shutdowns[0]


def test_list_attributes(rig: Rig) -> None:
    assert rig.plugin.list_attributes_supported() is False
    rig.cluster.keeps_list_attributes = True
    assert Plugin(DRIVER, rig.options).list_attributes_supported() is True


def test_list_attributes_false_without_dra(rig: Rig) -> None:
    rig.cluster.fail_next = [KubeAPIError(404, "the server could not find the requested resource")]
    assert rig.plugin.list_attributes_supported() is False


def test_list_attributes_probe_is_retried_after_an_outage(rig: Rig) -> None:
    rig.cluster.keeps_list_attributes = True
    rig.cluster.fail_next = [KubeAPIError(0, "connection refused")]
    assert rig.plugin.list_attributes_supported() is False
    assert rig.plugin.list_attributes_supported() is True


MAPPED = {"cpu": {"mapping": {"deviceMultiplier": "1"}}}


def mapped(count: int) -> list[dict[str, Any]]:
    return [{**d, "nodeAllocatableResources": MAPPED} for d in devices(count)]


MAPPED_1_36 = {"cpu": {"allocationMultiplier": "1"}}


@pytest.mark.parametrize(
    ("server", "node", "field", "warning"),
    [
        (True, True, "nodeAllocatableResources", None),
        (True, True, "nodeAllocatableResourceMappings", None),
        (
            False,
            True,
            "nodeAllocatableResources",
            "the API server has feature gate DRANodeAllocatableResources off",
        ),
        (
            True,
            False,
            "nodeAllocatableResources",
            "does not declare feature DRANodeAllocatableResources",
        ),
    ],
    ids=["on", "as-1.36-spells-it", "server-gate-off", "kubelet-without-it"],
)
def test_node_allocatable_mappings_are_published_where_they_are_kept(
    rig: Rig,
    *,
    server: bool,
    node: bool,
    field: str,
    warning: str | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Where the server would drop the field, or refuses it because the node's kubelet does
    not declare the feature, devices are published without it, that is said once, and the
    slices are not rewritten on every resync. A server that spells the field as 1.36 does
    gets the mappings in its spelling."""
    rig.cluster.keeps_node_allocatable = server
    rig.cluster.node_allocatable_field = field
    rig.cluster.declared_features = ["DRANodeAllocatableResources"] if node else []
    rig.plugin.publish(mapped(2))
    rig.plugin.start()
    try:
        assert rig.plugin.wait_published(10) is not None
        writes = len(rig.cluster.writes)
        for _ in range(3):
            rig.plugin.resync()
            assert rig.plugin.wait_published(10) is not None
    finally:
        rig.plugin.stop()
    on = warning is None
    if field == "nodeAllocatableResourceMappings":
        assert rig.cluster.pool_devices() == [{**d, field: MAPPED_1_36} for d in devices(2)]
    else:
        assert rig.cluster.pool_devices() == (mapped(2) if on else devices(2))
    assert len(rig.cluster.writes) == writes
    assert rig.plugin.feature_gates() == {"DRANodeAllocatableResources": on}
    warnings = [
        r.getMessage() for r in caplog.records if "nodeAllocatableResources" in r.getMessage()
    ]
    assert len(warnings) == (0 if on else 1)
    if warning is not None:
        assert warning in warnings[0]


def test_a_forbidden_probe_on_a_node_that_declares_the_feature_is_an_error(rig: Rig) -> None:
    """403 for another reason (RBAC) is no answer: the pass fails and is retried."""
    rig.cluster.fail_next = [KubeAPIError(403, "forbidden: User cannot create resourceslices")]
    rig.published(mapped(1))
    assert rig.cluster.pool_devices() == mapped(1)


def test_without_consumable_capacity_devices_allowed_whole_are_published_whole(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """No multiple allocations or request policies, and a mapping of consumed capacity
    becomes what the whole device is: a claim then gets all of it. (Not allowed, such a
    device is withheld: test_withheld.py.)"""
    rig.cluster.keeps_consumable_capacity = False
    rig.options.whole_devices_allowed = True
    rig.plugin = Plugin(DRIVER, rig.options)
    shared = {
        "name": "numa0",
        "capacity": {
            "cpu": {"value": "14", "requestPolicy": {"default": "1"}},
            "memory": {"value": "1Gi", "requestPolicy": {"default": "0"}},
        },
        "allowMultipleAllocations": True,
        "nodeAllocatableResources": {
            "cpu": {"mapping": {"capacityKey": "cpu", "capacityMultiplier": "1"}},
            "memory": {"mapping": {"capacityKey": "memory", "capacityMultiplier": "1"}},
        },
    }
    rig.published([shared])
    assert rig.cluster.pool_devices() == [
        {
            "name": "numa0",
            "capacity": {"cpu": {"value": "14"}, "memory": {"value": "1Gi"}},
            "nodeAllocatableResources": {
                "cpu": {"mapping": {"deviceMultiplier": "14"}},
                "memory": {"mapping": {"deviceMultiplier": str(1 << 30)}},
            },
        }
    ]
    assert rig.plugin.feature_gates() == {
        "DRAConsumableCapacity": False,
        "DRANodeAllocatableResources": True,
    }
    assert "a claim would get the whole of a device offered in parts" in caplog.text
    assert rig.plugin.withheld() is None


def test_devices_without_mappings_ask_nothing(rig: Rig) -> None:
    rig.published(devices(2))
    assert rig.plugin.feature_gates() == {}


def test_a_probe_that_fails_fails_the_pass_and_is_retried(rig: Rig) -> None:
    """Not a guess that would publish without the mappings until the next change."""
    rig.cluster.fail_next = [KubeAPIError(503, "etcd leader changed")]
    rig.published(mapped(1))
    assert rig.cluster.pool_devices() == mapped(1)


# --- the gate ---------------------------------------------------------------------------


def test_claims_refused_before_allowed(rig: Rig) -> None:
    ref = rig.add(make_claim("u1", [result("req", "cpu-0")]))
    for call in (
        lambda: rig.plugin.node_prepare([ref]),
        lambda: rig.plugin.node_unprepare([ref]),
        lambda: rig.plugin.prepare_resource_claims([rig.cluster.claims[("default", "claim-u1")]]),
        lambda: rig.plugin.unprepare_resource_claims([ref]),
    ):
        with pytest.raises(NotServingClaimsError, match="still synchronizing"):
            call()
    assert (rig.owner.locks, rig.policy.claims, rig.policy.releases, rig.specs()) == (0, [], [], [])


# --- prepare ----------------------------------------------------------------------------


def test_prepare_mixed_driver_claim(allowed: Rig) -> None:
    rig = allowed
    claim = make_claim(
        "u1",
        [
            result("request-0", "cpu-0"),
            result("gpu", "gpu-0", driver="gpu.example.com"),
            result("request-1/sub", "cpu-1", shareID="share-1", consumedCapacity={"cpu": "2"}),
        ],
    )
    ref = rig.add(claim)
    answers = rig.plugin.node_prepare([ref])
    assert list(answers) == ["u1"]
    assert answers["u1"].error is None
    assert answers["u1"].devices == (
        PreparedDevice(("request-0",), "test-pool", "cpu-0", (f"{DRIVER}/device=claim-u1-0",)),
        PreparedDevice(
            ("request-1",), "test-pool", "cpu-1", (f"{DRIVER}/device=claim-u1-1",), "share-1"
        ),
    )
    assert rig.policy.claims == [claim]
    assert [r.device for r in rig.policy.results[0]] == ["cpu-0", "cpu-1"]
    assert rig.policy.results[0][1].consumed_capacity == {"cpu": "2"}
    assert (rig.owner.locks, rig.owner.unlocks, rig.owner.commits) == (1, 1, 1)
    spec = rig.plugin.cdi.spec_path("u1")
    assert rig.specs() == [spec.name]
    assert "NRI_DEVICE=cpu-1" in spec.read_text()


def test_unallocated_or_foreign_claims_prepare_nothing(allowed: Rig) -> None:
    rig = allowed
    foreign = make_claim("u2", [result("gpu", "gpu-0", driver="gpu.example.com")])
    empty = make_claim("u3", [])
    answers = rig.plugin.prepare_resource_claims([foreign, empty])
    assert {uid: (a.devices, a.error) for uid, a in answers.items()} == {
        "u2": ((), None),
        "u3": ((), None),
    }
    assert (rig.policy.claims, rig.owner.commits, rig.specs()) == ([], 0, [])


# Fetching claims from the API server (missing, not allocated, replaced, unreachable) is
# tested against the real server and a real refused connection, in
# tests/integration/test_claim_api_real.py.


def test_failing_claim_is_isolated(allowed: Rig) -> None:
    rig = allowed
    good = rig.add(make_claim("good", [result("req", "cpu-0")]))
    bad = rig.add(make_claim("bad", [result("req", "cpu-1")]))
    rig.policy.allocate_error = RuntimeError("no CPUs left")
    rig.policy.fail_uid = "bad"
    answers = rig.plugin.node_prepare([good, bad])
    assert answers["good"].error is None
    assert len(answers["good"].devices) == 1
    assert isinstance(answers["bad"].error, ClaimError)
    assert "default/claim-bad (bad): the policy failed to allocate it: no CPUs left" in str(
        answers["bad"].error
    )
    assert rig.specs() == [rig.plugin.cdi.spec_path("good").name]
    assert rig.policy.releases == []
    assert rig.owner.locks == 1


def test_malformed_claim_is_isolated(allowed: Rig) -> None:
    rig = allowed
    good = make_claim("good", [result("req", "cpu-0")])
    bad = make_claim("bad", [result("req", "cpu-1")])
    bad["status"]["allocation"]["devices"]["results"][0]["device"] = 42
    answers = rig.plugin.prepare_resource_claims([bad, good])
    assert "results[0].device must be a non-empty string" in str(answers["bad"].error)
    assert answers["good"].error is None
    assert [c["metadata"]["uid"] for c in rig.policy.claims] == ["good"]


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("count", "the policy gave 2 CDI edits for 1 allocation results"),
        ("commit", "committing the allocation failed: disk full"),
        ("invalid", "'NO_VALUE' must be \"NAME=VALUE\""),
    ],
)
def test_failed_prepare_rolls_back(allowed: Rig, fault: str, message: str) -> None:
    rig = allowed
    ref = rig.add(make_claim("u1", [result("req", "cpu-0")]))
    if fault == "count":
        rig.policy.edits = [{"env": ["A=1"]}, {"env": ["B=2"]}]
    elif fault == "commit":
        rig.owner.commit_error = OSError("disk full")
    else:
        rig.policy.edits = [{"env": ["NO_VALUE"]}]
    answers = rig.plugin.node_prepare([ref])
    assert message in str(answers["u1"].error)
    assert answers["u1"].devices == ()
    # A failed commit puts the policy back to what is durable: the owner's part, no release.
    assert rig.policy.releases == ([] if fault == "commit" else ["u1"])
    assert rig.policy.allocated == {}
    assert rig.specs() == []


def test_bad_spec_is_refused_before_the_commit(allowed: Rig) -> None:
    rig = allowed
    ref = rig.add(make_claim("u1", [result("req", "cpu-0")]))
    rig.policy.edits = [{"env": ["=nameless"]}]
    answers = rig.plugin.node_prepare([ref])
    assert "NAME=VALUE" in str(answers["u1"].error)
    assert rig.owner.commits == 0  # nothing was committed, so there is nothing to undo on disk


def test_prepare_again_answers_the_same(allowed: Rig) -> None:
    rig = allowed
    ref = rig.add(make_claim("u1", [result("req", "cpu-0"), result("req", "cpu-1")]))
    first = rig.plugin.node_prepare([ref])
    second = rig.plugin.node_prepare([ref])
    assert first == second
    assert len(rig.policy.claims) == 2
    assert len(rig.specs()) == 1


def test_prepare_again_rewrites_a_lost_spec(allowed: Rig) -> None:
    rig = allowed
    ref = rig.add(make_claim("u1", [result("req", "cpu-0")]))
    rig.plugin.node_prepare([ref])
    rig.plugin.cdi.spec_path("u1").unlink()  # /var/run/cdi is a tmpfs: a reboot loses it
    answers = rig.plugin.node_prepare([ref])
    assert answers["u1"].error is None
    assert rig.plugin.cdi.has_claim("u1")


def test_failed_reprepare_keeps_the_allocation(allowed: Rig) -> None:
    rig = allowed
    ref = rig.add(make_claim("u1", [result("req", "cpu-0")]))
    rig.plugin.node_prepare([ref])
    spec = rig.plugin.cdi.spec_path("u1").read_bytes()
    rig.owner.commit_error = OSError("disk full")
    answers = rig.plugin.node_prepare([ref])
    assert "disk full" in str(answers["u1"].error)
    assert rig.policy.releases == []
    assert rig.policy.allocated == {"u1": ["cpu-0"]}
    assert rig.plugin.cdi.spec_path("u1").read_bytes() == spec


def test_a_failed_reprepare_keeps_a_claim_held_without_its_spec(
    allowed: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prepared before means held by the policy, not that a spec is on disk: a reboot
    loses the specs (tmpfs), not the claims, whose containers start again."""
    rig = allowed
    ref = rig.add(make_claim("u1", [result("req", "cpu-0")]))
    rig.plugin.node_prepare([ref])
    rig.plugin.cdi.spec_path("u1").unlink()
    failing_spec_writes(rig, monkeypatch, 0)
    answers = rig.plugin.node_prepare([ref])
    assert "No space left on device" in str(answers["u1"].error)
    assert rig.policy.releases == []
    assert rig.policy.allocated == {"u1": ["cpu-0"]}


def test_same_claim_twice_in_one_request(allowed: Rig) -> None:
    rig = allowed
    ref = rig.add(make_claim("u1", [result("req", "cpu-0")]))
    answers = rig.plugin.node_prepare([ref, ref])
    assert list(answers) == ["u1"]
    assert answers["u1"].error is None
    assert rig.policy.allocated == {"u1": ["cpu-0"]}


# --- requests that meet while one of them commits ---------------------------------------
# The owner's commit may let the lock go while it waits for other requests (see
# `Owner.commit`): the fake owner runs the other request right there, on a thread of its own.


def while_committing(rig: Rig, request: Callable[[], Any]) -> list[Any]:
    """Run ``request`` to its end during the owner's next commit; its answer, once run."""
    answer: list[Any] = []

    def run() -> None:
        worker = threading.Thread(target=lambda: answer.append(request()))
        worker.start()
        worker.join(30)
        assert not worker.is_alive(), "the request during the commit is stuck"

    rig.owner.while_committing = run
    return answer


def failing_spec_writes(rig: Rig, monkeypatch: pytest.MonkeyPatch, *failing: int) -> None:
    """Make the spec writes numbered in ``failing`` (0: the first) fail."""
    real = rig.plugin.cdi.write_spec
    writes = itertools.count()

    def write_spec(spec: ClaimSpec, points: WritePoints | None = None) -> list[str]:
        if next(writes) in failing:
            raise OSError(28, "No space left on device")
        return real(spec, points)

    monkeypatch.setattr(rig.plugin.cdi, "write_spec", write_spec)


@pytest.mark.parametrize("failing", ["first", "second"])
def test_a_failed_prepare_keeps_a_claim_another_request_prepared(
    allowed: Rig, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """Two pods sharing a claim: the second request prepares it while the first waits for
    its commit, and one of them fails to write the spec. The claim stays held."""
    rig = allowed
    ref = rig.add(make_claim("u1", [result("req", "cpu-0")]))
    second = while_committing(rig, lambda: rig.plugin.node_prepare([ref])["u1"])
    # The second request writes its spec first: it does not wait for the first one's commit.
    failing_spec_writes(rig, monkeypatch, 0 if failing == "second" else 1)
    first = rig.plugin.node_prepare([ref])["u1"]
    answers = {"first": first, "second": second[0]}
    assert "No space left on device" in str(answers[failing].error)
    assert sum(a.error is None for a in answers.values()) == 1
    assert rig.policy.releases == []
    assert rig.policy.allocated == {"u1": ["cpu-0"]}
    assert rig.plugin.cdi.has_claim("u1")


def test_an_unprepare_is_refused_while_another_request_prepares_the_claim(
    allowed: Rig,
) -> None:
    rig = allowed
    ref = rig.add(make_claim("u1", [result("req", "cpu-0")]))
    unprepared = while_committing(rig, lambda: rig.plugin.node_unprepare([ref])["u1"])
    prepared = rig.plugin.node_prepare([ref])["u1"]
    assert prepared.error is None
    assert "another kubelet request prepares it just now" in str(unprepared[0])
    assert rig.policy.releases == []
    assert rig.policy.allocated == {"u1": ["cpu-0"]}
    assert rig.plugin.cdi.has_claim("u1")


def test_a_prepare_is_refused_while_another_request_unprepares_the_claim(
    allowed: Rig,
) -> None:
    rig = allowed
    ref = rig.add(make_claim("u1", [result("req", "cpu-0")]))
    assert rig.plugin.node_prepare([ref])["u1"].error is None
    prepared = while_committing(rig, lambda: rig.plugin.node_prepare([ref])["u1"])
    assert rig.plugin.node_unprepare([ref]) == {"u1": None}
    assert "another kubelet request unprepares it just now" in str(prepared[0].error)
    assert rig.policy.allocated == {}
    assert not rig.plugin.cdi.has_claim("u1")


def test_a_rolled_back_claim_is_not_prepared_until_its_release_is_committed(
    allowed: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prepare whose spec fails releases the claim and commits again: a request that
    comes during that commit must not prepare the claim whose spec is about to go."""
    rig = allowed
    ref = rig.add(make_claim("u1", [result("req", "cpu-0")]))
    failing_spec_writes(rig, monkeypatch, 0)
    meeting: list[list[Any]] = []

    def then_meet() -> None:  # the first commit passes; the rollback's lets a request in
        meeting.append(while_committing(rig, lambda: rig.plugin.node_prepare([ref])["u1"]))

    rig.owner.while_committing = then_meet
    answer = rig.plugin.node_prepare([ref])["u1"]
    assert "No space left on device" in str(answer.error)
    ((prepared,),) = meeting
    assert "another kubelet request unprepares it just now" in str(prepared.error)
    assert rig.policy.allocated == {}
    assert not rig.plugin.cdi.has_claim("u1")


# --- unprepare --------------------------------------------------------------------------


def test_unprepare_known_twice_and_unknown(allowed: Rig) -> None:
    rig = allowed
    ref = rig.add(make_claim("u1", [result("req", "cpu-0")]))
    rig.plugin.node_prepare([ref])
    unknown = ClaimRef("default", "gone", "unknown-uid")
    answers = rig.plugin.node_unprepare([ref, ref, unknown])
    assert answers == {"u1": None, "unknown-uid": None}
    assert rig.policy.allocated == {}
    assert rig.specs() == []
    assert (rig.owner.locks, rig.owner.unlocks) == (2, 2)
    assert rig.owner.commits == 2  # one per request


@pytest.mark.parametrize("fault", ["commit", "policy"])
def test_failed_unprepare_keeps_the_spec(allowed: Rig, fault: str) -> None:
    rig = allowed
    ref = rig.add(make_claim("u1", [result("req", "cpu-0")]))
    rig.plugin.node_prepare([ref])
    if fault == "commit":
        rig.owner.commit_error = OSError("disk full")
        expected = "committing the release failed: disk full"
    else:
        rig.policy.release_error = RuntimeError("busy")
        expected = "the policy failed to release it: busy"
    answers = rig.plugin.node_unprepare([ref])
    assert expected in str(answers["u1"])
    assert "default/claim-u1 (u1)" in str(answers["u1"])
    assert rig.plugin.cdi.has_claim("u1")


# --- serialization ----------------------------------------------------------------------


def test_requests_wait_for_the_owner_lock(allowed: Rig) -> None:
    rig = allowed
    ref = rig.add(make_claim("u1", [result("req", "cpu-0")]))
    done = threading.Event()
    with rig.owner:

        def prepare() -> None:
            rig.plugin.node_prepare([ref])
            done.set()

        worker = threading.Thread(target=prepare)
        worker.start()
        assert not done.wait(0.2)
        assert rig.policy.claims == []
    worker.join(10)
    assert done.is_set()
    assert rig.policy.allocated == {"u1": ["cpu-0"]}
