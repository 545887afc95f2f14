"""What an allocation result consumed of its device, as the scheduler recorded it.

``consumedCapacity`` maps capacity names, plain (``cpu``) or qualified by a driver
(``topology-aware.nri.io/cpu``), to quantities. The scheduler writes every capacity of the
device it allocated from, at its request policy's default (0 here) where the claim asked for
none, and writes it once: the result keeps what the device offered then. So a name may stand
for a capacity the device no longer offers (huge pages of a pool a reboot emptied), or one
that nodedra never offered (another allocator's). A policy must understand every name it
grants more than nothing of: what it does not understand it cannot grant in full, and a
claim prepared without it would fail later in its container, with nobody told why.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from fractions import Fraction

from nodedra.lib.quantity import parse_quantity

from .ledger import PolicyError


def plain_name(name: str, driver: str) -> str | None:
    """``name`` without ``driver``'s qualification; None if another driver qualifies it."""
    prefix, slash, rest = name.rpartition("/")
    if not slash:
        return name
    return rest if prefix == driver else None


def value(consumed: Mapping[str, str], driver: str, name: str) -> str | None:
    """A consumed capacity, keyed by its plain or its driver-qualified name."""
    found = consumed.get(name)
    if found is None:
        found = consumed.get(f"{driver}/{name}")
    return None if found is None else str(found)


def not_understood(
    consumed: Mapping[str, str], driver: str, understood: Collection[str]
) -> list[tuple[str, str]]:
    """(name, quantity) of what was consumed of more than nothing, not in ``understood``.

    Nothing consumed of a capacity is granted in full whatever it is: a result keeps a 0 for
    each capacity its device offered when it was allocated, and a rollback meets the names
    of a newer release's capacities. A quantity that does not parse is not nothing.
    """
    unknown = []
    for name, raw in sorted(consumed.items()):
        if plain_name(name, driver) in understood:
            continue
        try:
            zero = parse_quantity(str(raw)) == 0
        except ValueError:
            zero = False
        if not zero:
            unknown.append((name, str(raw)))
    return unknown


def whole_bytes(raw: str, name: str) -> int:
    """A consumed quantity of bytes; PolicyError if it is not a whole, non-negative one."""
    try:
        parsed = parse_quantity(raw)
    except ValueError as err:
        raise PolicyError(f"consumed {name}: {err}") from None
    if parsed < 0 or parsed != Fraction(int(parsed)):
        raise PolicyError(f"consumed {name} {raw!r} is not a whole number of bytes")
    return int(parsed)
