"""Parsing and filtering of ResourceClaims: results by driver, configs, malformed claims."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from nodedra.dra import AllocationResult, ClaimError, claim_configs
from nodedra.dra.claims import claim_ref, claim_results
from tests.unit.dra.fakes import DRIVER, make_claim, result


def test_results_of_our_driver_only_in_order() -> None:
    claim = make_claim(
        "u1",
        [
            result("req-0", "cpu-0"),
            result("gpu", "gpu-0", driver="gpu.example.com"),
            result(
                "req-1/sub",
                "cpu-1",
                shareID="share-1",
                consumedCapacity={"cpu": "2", "memory": 1024},
                adminAccess=False,
            ),
        ],
    )
    assert claim_results(claim, DRIVER) == [
        AllocationResult("req-0", DRIVER, "test-pool", "cpu-0"),
        AllocationResult(
            "req-1/sub",
            DRIVER,
            "test-pool",
            "cpu-1",
            share_id="share-1",
            consumed_capacity={"cpu": "2", "memory": "1024"},
            admin_access=False,
        ),
    ]
    assert claim_results(claim, DRIVER)[1].base_request == "req-1"


def test_claim_without_results_has_none() -> None:
    assert claim_results(make_claim("u1", []), DRIVER) == []


def bad(path: str, value: Any) -> dict[str, Any]:
    """A good claim with one field at ``path`` (dot-separated, ints index lists) replaced."""
    claim = make_claim("u1", [result("req", "cpu-0")])
    node: Any = claim
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]
    for key in keys[:-1]:
        node = node[key]
    if value is ...:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return claim


@pytest.mark.parametrize(
    ("claim", "message"),
    [
        (bad("metadata", None), "metadata is not an object"),
        (bad("metadata.uid", ""), "has no metadata.uid"),
        (bad("status", "x"), "status is not an object"),
        (bad("status.allocation", None), "is not allocated"),
        (bad("status.allocation", []), "status.allocation is not an object"),
        (bad("status.allocation.devices.results", {}), "results is not a list"),
        (bad("status.allocation.devices.results.0", "x"), r"results\[0\] is not an object"),
        (bad("status.allocation.devices.results.0.device", ...), r"\.device must be a non-empty"),
        (bad("status.allocation.devices.results.0.pool", 7), r"\.pool must be a non-empty"),
        (bad("status.allocation.devices.results.0.request", ""), r"\.request must be"),
        (bad("status.allocation.devices.results.0.shareID", 5), r"\.shareID must be a string"),
        (bad("status.allocation.devices.results.0.adminAccess", "y"), r"adminAccess must be"),
        (bad("status.allocation.devices.results.0.consumedCapacity", []), "not an object"),
        (
            bad("status.allocation.devices.results.0.consumedCapacity", {"cpu": None}),
            r"consumedCapacity\[cpu\] is not a quantity",
        ),
        (
            bad("status.allocation.devices.results", [result("r", f"d{i}") for i in range(33)]),
            "33 allocation results, more than the API allows",
        ),
    ],
)
def test_malformed_claims_are_refused_by_name(claim: dict[str, Any], message: str) -> None:
    with pytest.raises(ClaimError, match=message) as caught:
        claim_results(claim, DRIVER)
    if "metadata" in claim and isinstance(claim["metadata"], dict) and claim["metadata"]["uid"]:
        assert "default/claim-u1 (u1)" in str(caught.value)


def test_claim_ref() -> None:
    ref = claim_ref(make_claim("u1", [], namespace="ns", name="c"))
    assert (ref.namespace, ref.name, ref.uid) == ("ns", "c", "u1")
    assert str(ref) == "ns/c (u1)"


def opaque(source: str, driver: str, tag: str) -> dict[str, Any]:
    return {
        "source": source,
        "requests": ["req"],
        "opaque": {"driver": driver, "parameters": {"tag": tag}},
    }


def test_claim_configs_class_first_then_claim_in_order_unchanged() -> None:
    config = [
        opaque("FromClaim", DRIVER, "claim-1"),
        opaque("FromClass", DRIVER, "class-1"),
        opaque("FromClass", "gpu.example.com", "other"),
        {"source": "FromClass", "requests": []},  # no opaque part
        opaque("FromClaim", DRIVER, "claim-2"),
        opaque("FromClass", DRIVER, "class-2"),
    ]
    claim = make_claim("u1", [], config=config)
    before = copy.deepcopy(claim)
    got = claim_configs(claim, DRIVER)
    assert [c["opaque"]["parameters"]["tag"] for c in got] == [
        "class-1",
        "class-2",
        "claim-1",
        "claim-2",
    ]
    assert got[0] is config[1]  # entries come back as they are
    assert claim == before


def test_claim_configs_of_unallocated_claim() -> None:
    assert claim_configs({"metadata": {"uid": "u"}}, DRIVER) == []
