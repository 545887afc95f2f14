"""Kubernetes resource quantities ("2", "1500m", "4Gi", "1e3") as exact numbers.

Capacities reach nodedra as quantity strings, and the API server rewrites the ones it stores in
canonical form ("1024Mi" comes back as "1Gi"). They are parsed exactly (as
fractions, never floats), so that "is this a whole number of CPUs" has a right answer.
"""

from __future__ import annotations

import re
from fractions import Fraction

_SUFFIXES = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}
# ASCII digits only ([0-9], not \d, which takes any Unicode digit), as the API's grammar says.
# Each digit has one place in the number: the integer part, or the fraction after the point.
# ("[0-9]+\.?[0-9]*" could split a run of digits between its two parts in every way, and
# tried each of them before refusing what follows the run: quadratic in the run's length,
# seconds for a few thousand digits, under the lock claims are prepared under.)
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE](?P<exp>[+-]?[0-9]+))?"
)
MAX_LENGTH = 64
"""The longest quantity string taken, in characters, blanks around it included.

What the API server stores is a quantity's canonical form, digits and a suffix: any int64
with a sign and a two-letter suffix takes at most 22 characters, and one written by hand in
the configuration file ("1.5Gi", "0.25") is rarely longer. 64 takes all of them with room
to spare, and bounds what the grammar, ``Fraction`` and ``int`` are handed: a claim's
capacities come from whoever wrote the claim."""
MAX_EXPONENT = 64
"""The largest decimal exponent taken: far beyond any count of CPUs or bytes, and small
enough that computing ``10**exponent`` exactly cannot take the process down ("1e999999999")."""


def parse_quantity(text: str | int) -> Fraction:
    """The exact value of a quantity; ValueError for anything that is not one."""
    if isinstance(text, int) and not isinstance(text, bool):
        return Fraction(text)
    if not isinstance(text, str):
        raise ValueError(f"not a quantity: {text!r}")
    if len(text) > MAX_LENGTH:
        raise ValueError(
            f"not a quantity: {text[:MAX_LENGTH]!r}... ({len(text)} characters; a quantity "
            f"has at most {MAX_LENGTH})"
        )
    match = _QUANTITY.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"not a quantity: {text!r}")
    value = Fraction(match["number"])
    if match["exp"] is not None:
        exponent = int(match["exp"]) if len(match["exp"]) <= 8 else MAX_EXPONENT + 1
        if abs(exponent) > MAX_EXPONENT:
            raise ValueError(f"not a quantity: {text!r} (exponent beyond ±{MAX_EXPONENT})")
        return value * Fraction(10) ** exponent
    return value * _SUFFIXES[match["suffix"] or ""]


def whole_positive(text: str | int, what: str) -> int:
    """A quantity that must be a positive whole number (CPUs, bytes); ValueError otherwise."""
    value = parse_quantity(text)
    if value <= 0 or value.denominator != 1:
        raise ValueError(f"{what} {text!r} is not a positive whole number")
    return int(value)


def binary_quantity(value: int) -> str:
    """``value`` in the largest binary suffix that keeps it whole: 2097152 is "2Mi".

    How Kubernetes names a huge page size in a resource (``hugepages-2Mi``): a quantity's
    canonical binary form.
    """
    if value < 0:
        raise ValueError(f"not a size: {value}")
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = int(_SUFFIXES[suffix])
        if value and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)
