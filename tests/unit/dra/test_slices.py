"""How the desired devices are split into ResourceSlices: pure functions.

The SliceApplier and the SlicePublisher talk to the API server, so their tests run against
the real one (tests/integration/test_slices_real.py): a fake could not tell what the server
accepts, refuses or rewrites.
"""

from __future__ import annotations

import pytest

from nodedra.dra.slices import slice_capacity, split_devices
from tests.unit.dra.fakes import devices


@pytest.mark.parametrize(
    ("count", "sizes"),
    [
        (0, [0]),
        (1, [1]),
        (128, [128]),
        (129, [128, 1]),
        (263, [128, 128, 7]),
        (1000, [128] * 7 + [104]),
    ],
)
def test_split_devices(count: int, sizes: list[int]) -> None:
    published = devices(count)
    chunks = split_devices(published)
    assert [len(c) for c in chunks] == sizes
    assert [d for c in chunks for d in c] == published


@pytest.mark.parametrize("field", ["taints", "consumesCounters"])
def test_taints_or_counters_halve_the_slice(field: str) -> None:
    published = devices(100)
    published[50][field] = [{"key": "x"}]
    assert slice_capacity(published) == 64
    assert [len(c) for c in split_devices(published)] == [64, 36]
