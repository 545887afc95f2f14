"""The kernel's hexadecimal CPU masks, as ``/proc/irq/default_smp_affinity`` has them.

32-bit words in hex, most significant first, separated by commas (the workqueues' ``cpumask``
too); the kernel refuses a word longer than 8 digits, so a mask is written word by word.
"""

from __future__ import annotations

from collections.abc import Iterable

WORD_DIGITS = 8


def parse_mask(text: str) -> frozenset[int]:
    """The CPUs of a mask such as ``ff`` or ``00000000,0000000f``; ValueError if malformed."""
    digits = text.strip().replace(",", "")
    if not digits:
        raise ValueError(f"{text!r} is not a CPU mask")
    value = int(digits, 16)
    return frozenset(cpu for cpu in range(value.bit_length()) if value >> cpu & 1)


def format_mask(cpus: Iterable[int]) -> str:
    """``cpus`` as the kernel takes a mask: ``0000000f``, ``00000001,00000000``."""
    value = sum(1 << cpu for cpu in set(cpus))
    words = max(1, -(-value.bit_length() // (4 * WORD_DIGITS)))
    hexed = f"{value:0{words * WORD_DIGITS}x}"
    return ",".join(hexed[i : i + WORD_DIGITS] for i in range(0, len(hexed), WORD_DIGITS))
