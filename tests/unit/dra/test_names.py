"""The names API of nodedra.dra: driver names, CDI device names, container claims."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from nodedra import dra
from nodedra.dra.names import qualified_cdi_device

UID = "8b9c5a6e-1f2d-4c3b-9a8e-7d6c5b4a3f21"


def test_driver_name() -> None:
    assert dra.DRA_DOMAIN == "nri.io"
    assert dra.driver_name("balloons") == "balloons.nri.io"
    assert dra.driver_name("topology-aware") == "topology-aware.nri.io"


@pytest.mark.parametrize("index", [0, 1, 12])
def test_cdi_device_round_trip(index: int) -> None:
    name = qualified_cdi_device("balloons.nri.io", UID, index)
    assert name == f"balloons.nri.io/device=claim-{UID}-{index}"
    device = dra.claim_of_cdi_device(name)
    assert device == dra.CDIClaimDevice("balloons.nri.io", UID, index)
    assert device is not None
    assert (device.driver, device.uid, device.index) == ("balloons.nri.io", UID, index)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "/dev/null",
        f"claim-{UID}-0",  # unqualified
        f"balloons.nri.io/gpu=claim-{UID}-0",  # another class
        "balloons.nri.io/device=gpu0",  # no claim- prefix
        f"balloons.nri.io/device=claim-{UID}",  # no index: the last segment has letters
        f"balloons.nri.io/device=claim-{UID}-",  # empty index
        f"balloons.nri.io/device=claim-{UID}-x1",  # non-numeric index
        "balloons.nri.io/device=claim--0",  # empty uid
        "balloons.nri.io/device=claim-0",  # uid without index
        f"1vendor.io/device=claim-{UID}-0",  # vendor must start with a letter
        f"balloons.nri.io/device=claim-{UID}-\u0661",  # a digit, but not an ASCII one
    ],
)
def test_claim_of_cdi_device_rejects(name: str) -> None:
    assert dra.claim_of_cdi_device(name) is None


@dataclass
class Container:
    cdi_devices: list[str]


def test_container_claims_groups_sorts_and_deduplicates() -> None:
    drv = "balloons.nri.io"
    container = Container(
        [
            qualified_cdi_device(drv, "uid-b", 2),
            qualified_cdi_device(drv, "uid-a", 1),
            qualified_cdi_device(drv, "uid-b", 0),
            qualified_cdi_device(drv, "uid-b", 2),
            qualified_cdi_device("other.nri.io", "uid-c", 0),  # another driver
            "nvidia.com/gpu=gpu0",  # not a claim device
            "not a name",
        ]
    )
    assert dra.container_claims(container, drv) == {"uid-b": [0, 2], "uid-a": [1]}
    assert dra.container_claims(container, "other.nri.io") == {"uid-c": [0]}
    assert dra.container_claims(Container([]), drv) == {}
