"""Random input at every parser nodedra exposes, seeded (derandomized) and bounded.

What is checked is the kind of failure: the parsers refuse bad input with their own error
(ClaimError, ValueError) and never with TypeError, KeyError or AttributeError; the kubelet's
gRPC calls answer exactly one entry per claim UID asked about and no gRPC error but the
documented "not serving claims yet"; and whatever a request held, the books stay straight.
"""

from __future__ import annotations

import contextlib
import copy
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nodedra.dra import ClaimError, ClaimRef, claim_configs, claim_of_cdi_device
from nodedra.dra.claims import claim_results
from nodedra.dra.names import qualified_cdi_device
from nodedra.lib.quantity import parse_quantity
from nodedra.topology import parse_cpu_list
from tests.reliability.helpers import (
    OTHER_DRIVER_RESULT,
    LocalNode,
    check_state,
    dra_client,
    grpc_claims,
    short_dir,
    ta_result,
)
from tests.unit.dra.fakes import NODE, make_claim

TA_DRIVER = "topology-aware.nri.io"

SEEDED = settings(derandomize=True, deadline=None, max_examples=300, database=None)
FEW = settings(SEEDED, max_examples=80, suppress_health_check=[HealthCheck.too_slow])

# --- JSON of any shape -------------------------------------------------------------------

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.sampled_from(["", "0", "-1", "1e3", "2Gi", "cpu", TA_DRIVER, "FromClass"])
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
HUGE = 10**5000
"""An integer with more digits than Python turns into text."""


def mostly(
    good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any], odds: int = 4
) -> st.SearchStrategy[Any]:
    """``bad`` once in ``odds`` draws, else ``good`` (st.one_of would pick each as often)."""
    return st.integers(1, odds).flatmap(lambda pick: bad if pick == 1 else good)


def maybe(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly ``valid``, sometimes any JSON at all."""
    return mostly(valid, JSON)


QUANTITIES = maybe(
    st.sampled_from(["1", "2", "14", "15", "0", "-1", "1500m", "2.5", "1e3", "1Mi", "1e99999"])
    | st.integers(-2, 20)
)
RESULT = st.fixed_dictionaries(
    {},
    optional={
        "request": maybe(st.sampled_from(["cpus", "main/sub", ""])),
        "driver": maybe(st.sampled_from([TA_DRIVER, "gpu.example.com"])),
        "pool": maybe(st.just(NODE)),
        "device": maybe(st.sampled_from([f"cpudevnuma00{i}" for i in range(5)] + ["cpu005"])),
        "shareID": maybe(st.sampled_from(["share-1"])),
        "adminAccess": maybe(st.booleans()),
        "consumedCapacity": maybe(
            st.fixed_dictionaries({}, optional={"cpu": QUANTITIES, "memory": QUANTITIES})
        ),
    },
)
CONFIG = st.fixed_dictionaries(
    {},
    optional={
        "source": maybe(st.sampled_from(["FromClass", "FromClaim"])),
        "requests": maybe(st.lists(st.sampled_from(["cpus", "main"]), max_size=2)),
        "opaque": maybe(
            st.fixed_dictionaries(
                {},
                optional={
                    "driver": maybe(st.sampled_from([TA_DRIVER, "gpu.example.com"])),
                    "parameters": maybe(st.dictionaries(st.text(max_size=5), JSON, max_size=2)),
                },
            )
        ),
    },
)


def claim_shaped(
    namespace: st.SearchStrategy[Any], name: st.SearchStrategy[Any], uid: st.SearchStrategy[Any]
) -> st.SearchStrategy[Any]:
    """Claims of every shape, near misses of real ones most of the time."""
    devices = st.fixed_dictionaries(
        {},
        optional={
            "results": maybe(st.lists(RESULT, max_size=34)),
            "config": maybe(st.lists(CONFIG, max_size=3)),
        },
    )
    status = st.fixed_dictionaries(
        {},
        optional={
            "allocation": maybe(st.fixed_dictionaries({}, optional={"devices": maybe(devices)}))
        },
    )
    metadata = st.fixed_dictionaries(
        {}, optional={"namespace": maybe(namespace), "name": maybe(name), "uid": maybe(uid)}
    )
    claim = st.fixed_dictionaries(
        {}, optional={"metadata": maybe(metadata), "status": maybe(status)}
    )
    return mostly(claim, JSON)


CLAIMS = claim_shaped(st.just("default"), st.just("c"), st.sampled_from(["u1", "u2"]))

# --- the parsers -------------------------------------------------------------------------


@SEEDED
@given(CLAIMS)
@example({"metadata": {"uid": "u"}, "status": {"allocation": {"devices": {"config": 5}}}})
@example({"metadata": {"uid": HUGE}})
@example(
    {
        "metadata": {"uid": "u"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "r",
                            "driver": TA_DRIVER,
                            "pool": "p",
                            "device": HUGE,
                            "consumedCapacity": {"cpu": HUGE},
                        }
                    ]
                }
            }
        },
    }
)
def test_claim_parsers_refuse_only_with_claim_errors(claim: Any) -> None:
    before = copy.deepcopy(claim)
    try:
        results = claim_results(claim, TA_DRIVER)
    except ClaimError:
        pass
    else:
        assert all(r.driver == TA_DRIVER for r in results)
    try:
        configs = claim_configs(claim, TA_DRIVER)
    except ClaimError:
        pass
    else:
        assert all(c["opaque"]["driver"] == TA_DRIVER for c in configs)
        assert all(isinstance(c["opaque"]["parameters"], dict) for c in configs)
    assert claim == before, "parsing changed the claim"


NAME_PARTS = st.sampled_from(
    ["", "-", "0", "00", "007", "1", "a", "claim-", "device", "=", "/", ":", ".", "_", "x.y", "Z"]
)
NAMES = st.one_of(st.text(max_size=40), st.lists(NAME_PARTS, max_size=10).map("".join))
VENDORS = st.from_regex(r"[A-Za-z]([A-Za-z0-9_.-]{0,20}[A-Za-z0-9])?", fullmatch=True)
UIDS = st.from_regex(r"[A-Za-z0-9_.:-]{1,40}", fullmatch=True)


@SEEDED
@given(NAMES)
@example("topology-aware.nri.io/device=claim-u1-007")
@example("v/device=claim-u-" + "9" * 5000)
@example("v/device=claim--1")
def test_claim_of_cdi_device_accepts_exactly_our_names(name: str) -> None:
    device = claim_of_cdi_device(name)  # never raises
    if device is not None:
        assert qualified_cdi_device(device.driver, device.uid, device.index) == name


@SEEDED
@given(VENDORS, UIDS, st.integers(min_value=0, max_value=10**12))
def test_our_cdi_names_round_trip(driver: str, uid: str, index: int) -> None:
    assert claim_of_cdi_device(qualified_cdi_device(driver, uid, index)) == (driver, uid, index)


@SEEDED
@given(st.text(max_size=20), NAMES, st.integers(min_value=0))
def test_any_cdi_name_we_make_reads_back_or_not_at_all(driver: str, uid: str, index: int) -> None:
    device = claim_of_cdi_device(qualified_cdi_device(driver, uid, index))
    assert device is None or device == (driver, uid, index)


CPU_LISTS = st.one_of(
    st.text(max_size=30),
    st.from_regex(r"[0-9,\- :/Nal\t]{0,24}", fullmatch=True),
    st.lists(
        st.sampled_from(["0", "7", "65535", "65536", "99999999999", "-", ",", ":", "/", " "]),
        max_size=8,
    ).map("".join),
)


@SEEDED
@given(CPU_LISTS)
@example("0-65535:1/1")
@example("1" * 5000)
@example("0-1:" + "9" * 5000 + "/1")
def test_parse_cpu_list_refuses_only_with_value_errors(text: str) -> None:
    try:
        cpus = parse_cpu_list(text)
    except ValueError:
        return
    assert all(0 <= cpu < 65536 for cpu in cpus)


QUANTITY_TEXT = st.one_of(
    st.text(max_size=20),
    st.from_regex(r"[+-]?[0-9.]{0,6}([eE][+-]?[0-9]{0,12}|[KMGTPE]i|[numkMGTPE])?", fullmatch=True),
)


@SEEDED
@given(st.one_of(QUANTITY_TEXT, st.integers(), st.booleans(), st.floats(), st.none()))
@example("1e999999999")
@example("1e-999999999")
@example("1e" + "9" * 5000)
@example("9" * 5000)
@example("\u0661")  # ARABIC-INDIC DIGIT ONE: a digit, but not a quantity's
def test_parse_quantity_refuses_only_with_value_errors(text: Any) -> None:
    with contextlib.suppress(ValueError):
        parse_quantity(text)


# --- the kubelet's gRPC calls --------------------------------------------------------------


@dataclass
class Served:
    """A running node, a claim it holds throughout, and clients of both DRA versions."""

    node: LocalNode
    held: dict[str, Any]
    stubs: dict[str, tuple[Any, Any]]


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    node = LocalNode(short_dir("nd-fuzz-"), "topology-aware")
    node.manager.start()
    try:
        held = node.serve(make_claim("held", [ta_result(1, "4", "1Gi")]))
        assert node.prepare(held)["held"].error is None
        with (
            dra_client(node.manager.plugin.sockets.dra, "v1") as v1,
            dra_client(node.manager.plugin.sockets.dra, "v1beta1") as v1beta1,
        ):
            yield Served(node, node.policy.snapshot(), {"v1": v1, "v1beta1": v1beta1})
    finally:
        node.manager.stop()
        shutil.rmtree(node.root, ignore_errors=True)


BAD_NAMESPACES = st.sampled_from(["", "Default", "a/b", "default"]) | st.text()
BAD_NAMES = st.sampled_from(["", "..", "c1/status", "c1"]) | st.text()
BAD_UIDS = (st.sampled_from(["", "u/1", "u\x00", "u1"]) | st.text()).filter(lambda u: u != "held")


@st.composite
def claim_refs(draw: st.DrawFn) -> ClaimRef:
    """The kubelet's reference to claim ``default/c<i>`` (UID ``u<i>``), at times spoilt."""
    i = draw(st.integers(1, 4))
    return ClaimRef(
        draw(mostly(st.just("default"), BAD_NAMESPACES, odds=8)),
        draw(mostly(st.just(f"c{i}"), BAD_NAMES, odds=8)),
        draw(mostly(st.just(f"u{i}"), BAD_UIDS, odds=8)),
    )


REFS = st.lists(claim_refs(), min_size=1, max_size=4)
VALID_RESULT = st.builds(
    lambda numa, cpus, memory, request: ta_result(numa, cpus, memory, request=request),
    st.integers(0, 3),
    mostly(st.integers(1, 3) | st.sampled_from(["2", "1"]), st.just(None)),
    st.sampled_from([None, "0", "1Mi", "64Mi"]),
    st.sampled_from(["cpus", "main/sub"]),
)


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The paths of every field and item in ``value``."""
    found = [prefix] if prefix else []
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, inner in items:
        found += paths(inner, (*prefix, key))
    return found


@st.composite
def proper_claim(draw: st.DrawFn, ref: ClaimRef) -> dict[str, Any]:
    """A claim as the scheduler would allocate it, possibly with a field or two spoilt."""
    results = draw(st.lists(VALID_RESULT | st.just(OTHER_DRIVER_RESULT), min_size=1, max_size=3))
    config = draw(mostly(st.just([]), st.lists(CONFIG, max_size=2)))
    claim = copy.deepcopy(
        make_claim(ref.uid, results, namespace=ref.namespace, name=ref.name, config=config)
    )
    for _ in range(draw(mostly(st.just(0), st.integers(1, 2)))):
        path = draw(st.sampled_from(paths(claim)))
        parent: Any = claim
        for key in path[:-1]:
            parent = parent[key]
        if draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(JSON)
    return claim


@st.composite
def requests(draw: st.DrawFn) -> tuple[list[ClaimRef], dict[tuple[str, str], Any]]:
    """Claim references, and what the API server fake serves for the names they use."""
    refs = draw(REFS)
    served: dict[tuple[str, str], Any] = {}
    for ref in refs:
        if draw(st.integers(0, 3)):
            served[(ref.namespace, ref.name)] = draw(
                mostly(
                    proper_claim(ref),
                    claim_shaped(st.just(ref.namespace), st.just(ref.name), st.just(ref.uid)),
                )
            )
    return refs, served


@FEW
@given(requests(), st.sampled_from(["v1", "v1beta1"]))
def test_grpc_answers_every_claim_once_and_keeps_the_books(
    served: Served, request: tuple[list[ClaimRef], dict[tuple[str, str], Any]], version: str
) -> None:
    refs, claims = request
    node = served.node
    node.cluster.claims = claims  # type: ignore[attr-defined]
    pb, stub = served.stubs[version]
    uids = {ref.uid for ref in refs}

    answer = stub.NodePrepareResources(
        pb.NodePrepareResourcesRequest(claims=grpc_claims(pb, refs)), timeout=30
    )
    assert set(answer.claims) == uids
    prepared = set()
    for uid, entry in answer.claims.items():
        if entry.error:
            assert not entry.devices
            named = [f"{r.namespace}/{r.name}" for r in refs if r.uid == uid]
            assert any(name in entry.error for name in named), entry.error
            continue
        prepared.add(uid)
        ids = [list(d.cdi_device_ids) for d in entry.devices]
        assert ids == [[f"{node.driver}/device=claim-{uid}-{i}"] for i in range(len(ids))]
    with node.manager:
        assert {uid for uid in prepared if answer.claims[uid].devices} <= node.policy.claim_uids()
    check_state(node.state())

    answer = stub.NodeUnprepareResources(
        pb.NodeUnprepareResourcesRequest(claims=grpc_claims(pb, refs)), timeout=30
    )
    assert set(answer.claims) == uids
    assert all(answer.claims[uid].error == "" for uid in prepared)
    assert node.policy.snapshot() == served.held
    check_state(node.state())


@pytest.fixture(scope="module")
def synchronizing() -> Iterator[LocalNode]:
    """A node whose plugin serves the kubelet but does not serve claims yet."""
    node = LocalNode(short_dir("nd-gate-"), "static")
    node.manager.plugin.start()
    try:
        yield node
    finally:
        node.manager.plugin.stop()
        shutil.rmtree(node.root, ignore_errors=True)


@settings(SEEDED, max_examples=20)
@given(REFS, st.sampled_from(["v1", "v1beta1"]), st.booleans())
def test_before_synchronizing_every_request_is_refused_whole(
    synchronizing: LocalNode, refs: list[ClaimRef], version: str, prepare: bool
) -> None:
    with dra_client(synchronizing.manager.plugin.sockets.dra, version) as (pb, stub):
        call, message = (
            (stub.NodePrepareResources, pb.NodePrepareResourcesRequest)
            if prepare
            else (stub.NodeUnprepareResources, pb.NodeUnprepareResourcesRequest)
        )
        with pytest.raises(grpc.RpcError) as refused:
            call(message(claims=grpc_claims(pb, refs)), timeout=30)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "cannot serve claims yet, still synchronizing" in (refused.value.details() or "")
    assert synchronizing.spec_files() == {}
    assert synchronizing.saved_state() is None
