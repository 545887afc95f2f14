"""Malformed requests and claims, through the plugin's real gRPC socket.

Every bad claim gets an error of its own that names it (namespace/name and UID) and says
what is wrong with it; the good claim in the same request is prepared anyway; and the bad
ones change nothing: not the policy's books, not the checkpoint file, not the CDI directory.
"""

from __future__ import annotations

import copy
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from nodedra.dra import ClaimRef
from tests.reliability.helpers import (
    OTHER_DRIVER_RESULT,
    LocalNode,
    check_state,
    dra_client,
    grpc_claims,
    short_dir,
    static_result,
    ta_result,
)
from tests.unit.dra.fakes import make_claim

TA, STATIC = "topology-aware", "static"
RESULTS = "status.allocation.devices.results"
CONFIG = "status.allocation.devices.config"


@pytest.fixture(scope="module")
def nodes() -> Iterator[dict[str, LocalNode]]:
    """A running node per policy, each holding one claim that bad input must not disturb."""
    started: dict[str, LocalNode] = {}
    try:
        for policy in (TA, STATIC):
            node = LocalNode(short_dir("nd-bad-"), policy)
            node.manager.start()
            started[policy] = node
            held_result = ta_result(3, "3", "8Mi") if policy == TA else static_result(30)
            held = node.serve(make_claim("held", [held_result], name="held"))
            assert node.prepare(held)["held"].error is None
        yield started
    finally:
        for node in started.values():
            node.manager.stop()
            shutil.rmtree(node.root, ignore_errors=True)


def good_result(policy: str, index: int) -> dict[str, Any]:
    """A result that is free on the node, whatever else the tests hold."""
    if policy == TA:
        return ta_result(3, "1", "4Mi")
    return static_result(49 + index % 6)


def ours(source: str = "FromClaim", **opaque: Any) -> dict[str, Any]:
    """An opaque config entry of the topology-aware driver."""
    return {
        "source": source,
        "requests": ["cpus"],
        "opaque": {"driver": "topology-aware.nri.io", **opaque},
    }


Edit = Callable[[dict[str, Any]], Any]


def setting(path: str, value: Any) -> Edit:
    """An edit of a claim: the field at ``path`` (dots; digits index lists) set or deleted."""

    def edit(claim: dict[str, Any]) -> dict[str, Any]:
        node: Any = claim
        keys = [int(k) if k.isdigit() else k for k in path.split(".")]
        for key in keys[:-1]:
            node = node[key]
        if value is ...:
            del node[keys[-1]]
        else:
            node[keys[-1]] = copy.deepcopy(value)
        return claim

    return edit


@dataclass(frozen=True)
class Bad:
    """A bad claim, or a bad reference to one, and what its error must say."""

    id: str
    problem: str
    """A regular expression the claim's error must match."""
    edit: Edit | None = None
    """How the claim served differs from a good one; None: nothing is served."""
    policy: str = TA
    ref: ClaimRef | None = None
    """The kubelet's reference, if not the usual ``default/bad-<id>`` with UID ``uid-<id>``."""
    also: tuple[ClaimRef, ...] = field(default=())
    """More references in the same request (with the same UID, say)."""

    def reference(self) -> ClaimRef:
        return self.ref or ClaimRef("default", f"bad-{self.id}", f"uid-{self.id}")


CASES = [
    # Not (or not properly) allocated.
    Bad("no-status", "is not allocated", setting("status", ...)),
    Bad("allocation-null", "is not allocated", setting("status.allocation", None)),
    Bad("status-string", "is not allocated", setting("status", "allocated")),
    Bad(
        "devices-list",
        r"allocation\.devices is not an object",
        setting("status.allocation.devices", []),
    ),
    # Results without device, pool or driver, or of the wrong type.
    Bad("results-string", "results is not a list", setting(RESULTS, "cpudevnuma002")),
    Bad("result-string", r"results\[0\] is not an object", setting(f"{RESULTS}.0", "x")),
    Bad("no-device", r"results\[0\]\.device must be a non-empty string, not None", None),
    Bad("no-pool", r"results\[0\]\.pool must be a non-empty string", None),
    Bad("no-driver", r"results\[0\]\.driver must be a non-empty string", None),
    Bad("device-number", r"\.device must be a non-empty string, not 2", None),
    Bad("request-list", r"\.request must be a non-empty string", None),
    Bad("share-number", r"\.shareID must be a string, not 7", None),
    Bad("admin-string", r"\.adminAccess must be a boolean", None),
    Bad("capacity-list", r"consumedCapacity is not an object", None),
    Bad("capacity-object", r"consumedCapacity\[cpu\] is not a quantity", None),
    Bad("capacity-float", r"consumedCapacity\[cpu\] is not a quantity: 2\.0", None),
    Bad(
        "too-many-results",
        "33 allocation results, more than the API allows",
        setting(RESULTS, [ta_result(3, "1")] * 33),
    ),
    # Devices the node does not have.
    Bad("unknown-device", "unknown device cpudevnuma009", None),
    Bad("static-unknown-cpu", "unknown device cpu056", None, policy=STATIC),
    Bad("static-reserved-cpu", "unknown device cpu001", None, policy=STATIC),
    Bad("static-misspelt-cpu", "unknown device cpu7", None, policy=STATIC),
    Bad(
        "static-same-cpu-twice",
        "CPU 20 is held by claim this claim",
        setting(RESULTS, [static_result(20), static_result(20, request="again")]),
        policy=STATIC,
    ),
    # Consumed capacity that is zero, negative, fractional, nonsense or too large.
    Bad("cpu-zero", "'0' is not a positive whole number", None),
    Bad("cpu-negative", "'-2' is not a positive whole number", None),
    Bad("cpu-milli", "'1500m' is not a positive whole number", None),
    Bad("cpu-decimal", "'2.5' is not a positive whole number", None),
    Bad("cpu-words", "not a quantity: 'two'", None),
    Bad("cpu-exponent", "not a quantity: '1e999999999'", None),
    Bad("cpu-too-many", "consumed 15 CPUs of cpudevnuma002, which offers 14", None),
    Bad("memory-negative", "'-1Mi' is not a whole number of bytes", None),
    Bad("memory-fraction", "'0.5' is not a whole number of bytes", None),
    Bad("memory-too-much", r"1099511627776 bytes of memory asked for, only \d+ free", None),
    Bad("memory-only", "consumed no cpu", None),
    # Opaque configs: of ours, they must be what the API allows; anybody's must say whose.
    Bad("config-string", r"config is not a list: 'fast'", setting(CONFIG, "fast")),
    Bad("config-entry-string", r"config\[0\] is not an object", setting(CONFIG, ["fast"])),
    Bad(
        "opaque-parameters-list",
        r"config\[1\]\.opaque\.parameters must be a JSON object, not \[1, 2\]",
        setting(CONFIG, [ours(parameters={}), ours(parameters=[1, 2])]),
    ),
    Bad(
        "opaque-parameters-string",
        r"config\[0\]\.opaque\.parameters must be a JSON object, not 'fast'",
        setting(CONFIG, [ours(parameters="fast")]),
    ),
    Bad(
        "opaque-parameters-missing",
        r"config\[0\]\.opaque\.parameters must be a JSON object, not None",
        setting(CONFIG, [ours()]),
    ),
    Bad(
        "opaque-without-driver",
        r"config\[0\]\.opaque\.driver must be a non-empty string, not None",
        setting(CONFIG, [{"source": "FromClaim", "opaque": {"parameters": {}}}]),
    ),
    Bad(
        "opaque-bad-source",
        r"config\[0\]\.source must be one of \['FromClass', 'FromClaim'\], not 'FromHeaven'",
        setting(CONFIG, [ours("FromHeaven", parameters={})]),
    ),
    Bad(
        "opaque-requests-string",
        r"config\[0\]\.requests must be a list of request names, not 'cpus'",
        setting(CONFIG, [{**ours(parameters={}), "requests": "cpus"}]),
    ),
    # The claim the API server has is not the one the kubelet asked for, or no claim at all.
    Bad("not-found", r"cannot get it from the API server: \(404\)"),
    Bad("replaced", "was replaced: the API server has UID 'uid-new'", None),
    Bad("metadata-string", "copy is malformed: the claim's metadata is not an object", None),
    Bad("uid-number", "copy is malformed: the claim's metadata.uid must be a string", None),
    Bad("not-an-object", "the API server's answer is not an object", lambda c: [c]),
    # Bad references from the kubelet.
    Bad("empty-uid", "the request has no claim UID", None, ref=ClaimRef("default", "bad", "")),
    Bad(
        "empty-namespace",
        "the request names no valid namespace",
        None,
        ref=ClaimRef("", "bad-empty-namespace", "uid-empty-namespace"),
    ),
    Bad(
        "empty-name",
        "the request names no valid claim name",
        None,
        ref=ClaimRef("default", "", "uid-empty-name"),
    ),
    Bad(
        "path-in-name",
        "the request names no valid claim name",
        None,
        ref=ClaimRef("default", "../../../api/v1/nodes/node-a", "uid-path-in-name"),
    ),
    Bad(
        "uid-twice",
        r"the request gives UID 'uid-uid-twice' to 2 different claims "
        r"\(default/bad-uid-twice, default/bad-uid-twice-2\); none of them is prepared",
        None,
        also=(ClaimRef("default", "bad-uid-twice-2", "uid-uid-twice"),),
    ),
]

#: Edits of the result (or of the claim) for the cases above that say None.
RESULT_EDITS: dict[str, Edit] = {
    "no-device": setting(f"{RESULTS}.0.device", ...),
    "no-pool": setting(f"{RESULTS}.0.pool", ...),
    "no-driver": setting(f"{RESULTS}.0.driver", ...),
    "device-number": setting(f"{RESULTS}.0.device", 2),
    "request-list": setting(f"{RESULTS}.0.request", ["cpus"]),
    "share-number": setting(f"{RESULTS}.0.shareID", 7),
    "admin-string": setting(f"{RESULTS}.0.adminAccess", "true"),
    "capacity-list": setting(f"{RESULTS}.0.consumedCapacity", ["cpu", "2"]),
    "capacity-object": setting(f"{RESULTS}.0.consumedCapacity.cpu", {"value": "2"}),
    "capacity-float": setting(f"{RESULTS}.0.consumedCapacity.cpu", 2.0),
    "unknown-device": setting(f"{RESULTS}.0.device", "cpudevnuma009"),
    "static-unknown-cpu": setting(f"{RESULTS}.0.device", "cpu056"),
    "static-reserved-cpu": setting(f"{RESULTS}.0.device", "cpu001"),
    "static-misspelt-cpu": setting(f"{RESULTS}.0.device", "cpu7"),
    "cpu-zero": setting(f"{RESULTS}.0.consumedCapacity.cpu", "0"),
    "cpu-negative": setting(f"{RESULTS}.0.consumedCapacity.cpu", "-2"),
    "cpu-milli": setting(f"{RESULTS}.0.consumedCapacity.cpu", "1500m"),
    "cpu-decimal": setting(f"{RESULTS}.0.consumedCapacity.cpu", "2.5"),
    "cpu-words": setting(f"{RESULTS}.0.consumedCapacity.cpu", "two"),
    "cpu-exponent": setting(f"{RESULTS}.0.consumedCapacity.cpu", "1e999999999"),
    "cpu-too-many": setting(f"{RESULTS}.0.consumedCapacity.cpu", "15"),
    "memory-negative": setting(f"{RESULTS}.0.consumedCapacity.memory", "-1Mi"),
    "memory-fraction": setting(f"{RESULTS}.0.consumedCapacity.memory", "0.5"),
    "memory-too-much": setting(f"{RESULTS}.0.consumedCapacity.memory", "1Ti"),
    "memory-only": setting(f"{RESULTS}.0.consumedCapacity", {"memory": "1Mi"}),
    "replaced": setting("metadata.uid", "uid-new"),
    "metadata-string": setting("metadata", "bad"),
    "uid-number": setting("metadata.uid", 7),
}


def bad_claim(case: Bad, ref: ClaimRef) -> Any:
    """The claim the API server fake serves for ``ref``: a good one, edited."""
    result = ta_result(2, "2", "16Mi") if case.policy == TA else static_result(20)
    claim = make_claim(ref.uid, [result, OTHER_DRIVER_RESULT], name=ref.name)
    claim["metadata"]["namespace"] = ref.namespace
    edit = case.edit or RESULT_EDITS.get(case.id)
    return edit(claim) if edit is not None else claim


def frozen(node: LocalNode) -> tuple[Any, ...]:
    """Everything a bad claim must leave as it was."""
    return (node.policy.snapshot(), node.saved_state(), node.spec_files())


def test_every_case_has_its_claim() -> None:
    ids = {case.id for case in CASES}
    assert len(ids) == len(CASES)
    assert set(RESULT_EDITS) <= ids
    for case in CASES:
        if case.edit is None and case.ref is None and not case.also and case.id != "not-found":
            assert case.id in RESULT_EDITS, case.id


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_claim_fails_alone_and_changes_nothing(
    nodes: dict[str, LocalNode], case: Bad, request: pytest.FixtureRequest
) -> None:
    node = nodes[case.policy]
    index = CASES.index(case)
    version = ("v1", "v1beta1")[index % 2]
    bad = case.reference()
    if case.id != "not-found":
        for ref in (bad, *case.also):
            served = bad_claim(case, ref)
            node.cluster.claims[(ref.namespace, ref.name)] = served  # type: ignore[attr-defined]
    good = node.serve(make_claim(f"good-{index}", [good_result(case.policy, index)]))
    before = frozen(node)

    with dra_client(node.manager.plugin.sockets.dra, version) as (pb, stub):
        request_claims = grpc_claims(pb, [bad, good, *case.also])
        answer = stub.NodePrepareResources(
            pb.NodePrepareResourcesRequest(claims=request_claims), timeout=30
        )
        assert set(answer.claims) == {bad.uid, good.uid}
        error = answer.claims[bad.uid].error
        assert re.search(case.problem, error), error
        assert f"{bad.namespace}/{bad.name}" in error
        assert f"({bad.uid})" in error or not bad.uid
        assert not answer.claims[bad.uid].devices
        assert answer.claims[good.uid].error == ""
        (device,) = answer.claims[good.uid].devices
        assert list(device.cdi_device_ids) == [f"{node.driver}/device=claim-{good.uid}-0"]

        snapshot, _, specs = frozen(node)
        assert set(snapshot) == set(before[0]) | {good.uid}
        assert set(specs) == set(before[2]) | {node.manager.plugin.cdi.spec_path(good.uid).name}
        check_state(node.state())

        unprepared = stub.NodeUnprepareResources(
            pb.NodeUnprepareResourcesRequest(claims=grpc_claims(pb, [good])), timeout=30
        )
        assert unprepared.claims[good.uid].error == ""
    assert frozen(node) == before


def test_a_claim_named_twice_is_answered_once(nodes: dict[str, LocalNode]) -> None:
    node = nodes[STATIC]
    ref = node.serve(make_claim("twice", [static_result(40), static_result(41, request="b")]))
    with dra_client(node.manager.plugin.sockets.dra) as (pb, stub):
        answer = stub.NodePrepareResources(
            pb.NodePrepareResourcesRequest(claims=grpc_claims(pb, [ref, ref])), timeout=30
        )
        assert [d.device_name for d in answer.claims["twice"].devices] == ["cpu040", "cpu041"]
        unprepared = stub.NodeUnprepareResources(
            pb.NodeUnprepareResourcesRequest(claims=grpc_claims(pb, [ref, ref])), timeout=30
        )
    assert dict(unprepared.claims) == {"twice": pb.NodeUnprepareResourceResponse()}
    check_state(node.state())


def test_opaque_configs_of_ours_are_accepted_and_those_of_others_ignored(
    nodes: dict[str, LocalNode],
) -> None:
    """Our policies take no parameters: a well-formed config of ours changes nothing.

    Other drivers' configs are theirs to check, however they look to us.
    """
    node = nodes[TA]
    configs = [
        ours("FromClass", parameters={"apiVersion": "example.com/v1", "kind": "Tuning"}),
        {"source": "FromClaim", "opaque": {"driver": "gpu.example.com", "parameters": "x"}},
        {"source": "Elsewhere", "requests": "all", "opaque": {"driver": "gpu.example.com"}},
        {"source": "FromClaim", "requests": ["cpus"]},  # not opaque: nobody's business here
        ours(parameters={}),
    ]
    with_config = node.serve(make_claim("configured", [ta_result(3, "2")], config=configs))
    plain = node.serve(make_claim("plain", [ta_result(3, "2")]))
    answers = node.prepare(with_config)
    assert answers["configured"].error is None
    grants = node.policy.grants("configured")
    assert node.unprepare(with_config) == {"configured": None}
    assert node.prepare(plain)["plain"].error is None
    assert node.policy.grants("plain") == grants
    assert node.unprepare(plain) == {"plain": None}
    check_state(node.state())


def test_unprepare_of_bad_references(nodes: dict[str, LocalNode]) -> None:
    node = nodes[TA]
    before = frozen(node)
    with dra_client(node.manager.plugin.sockets.dra, "v1beta1") as (pb, stub):
        refs = [ClaimRef("default", "nameless", ""), ClaimRef("default", "never", "never-seen")]
        answer = stub.NodeUnprepareResources(
            pb.NodeUnprepareResourcesRequest(claims=grpc_claims(pb, refs)), timeout=30
        )
    assert answer.claims[""].error == "claim default/nameless: the request has no claim UID"
    assert answer.claims["never-seen"].error == ""
    assert frozen(node) == before


def test_a_uid_no_spec_can_be_named_for_never_touches_another_claims(
    nodes: dict[str, LocalNode],
) -> None:
    """Spec files are named after the UID with '/' made '_': "a/b" must not be taken for "a_b"."""
    node = nodes[STATIC]
    held = node.serve(make_claim("a_b", [static_result(44)], name="underscored"))
    assert node.prepare(held)["a_b"].error is None
    spec = node.manager.plugin.cdi.spec_path("a_b").read_bytes()
    before = frozen(node)

    slashed = node.serve(make_claim("a/b", [static_result(45)], name="slashed"))
    error = str(node.prepare(slashed)["a/b"].error)
    assert "default/slashed (a/b)" in error
    assert "invalid CDI device name" in error
    assert node.unprepare(slashed) == {"a/b": None}
    assert frozen(node) == before
    assert node.manager.plugin.cdi.spec_path("a_b").read_bytes() == spec
    check_state(node.state())
    assert node.unprepare(held) == {"a_b": None}
