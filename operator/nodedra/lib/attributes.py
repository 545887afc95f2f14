"""List-valued device attributes (KEP-5491) and the scalars that stand in for them.

An API server without the ``DRAListTypeAttributes`` gate drops a list value and refuses the
device it leaves without one; a device metadata file is read by programs that want one
value. Both get each list's first element, which KEP-6072 makes the one that counts (the
device's own NUMA node, before the nodes near it).
"""

from __future__ import annotations

from collections.abc import Mapping

LIST_TYPES = {"ints": "int", "bools": "bool", "strings": "string", "versions": "version"}
"""A list value's field -> the field of one value of the same type."""


def first_values(
    attributes: Mapping[str, Mapping[str, object]],
) -> dict[str, dict[str, object]]:
    """``attributes`` with every list value replaced by its first element."""
    scalars: dict[str, dict[str, object]] = {}
    for name, value in attributes.items():
        ((kind, held),) = value.items()
        if kind in LIST_TYPES and isinstance(held, list | tuple) and held:
            scalars[name] = {LIST_TYPES[kind]: held[0]}
        else:
            scalars[name] = dict(value)
    return scalars


def has_lists(attributes: Mapping[str, Mapping[str, object]]) -> bool:
    """Whether any of ``attributes`` is list-valued."""
    return any(kind in LIST_TYPES for value in attributes.values() for kind in value)
