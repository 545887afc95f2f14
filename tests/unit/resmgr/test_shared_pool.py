"""The shared pool: what no claim holds, less the CPUs the kernel isolated."""

from __future__ import annotations

from nodedra.resmgr.pinning import Books


def books(allocated: set[int], isolated: set[int]) -> Books:
    return Books({}, {}, frozenset(range(8)), frozenset(allocated), frozenset(isolated))


def test_isolated_cpus_are_kept_out_of_the_shared_pool() -> None:
    assert books({1}, {6, 7}).shared == {0, 2, 3, 4, 5}
    assert books({6}, {6, 7}).shared == {0, 1, 2, 3, 4, 5}


def test_the_isolated_cpus_are_shared_when_nothing_else_is_left() -> None:
    """A pool of no CPU would leave the node's other containers nowhere to run."""
    assert books({0, 1, 2, 3, 4, 5}, {6, 7}).shared == {6, 7}
    assert books(set(range(8)), {6, 7}).shared == frozenset()
