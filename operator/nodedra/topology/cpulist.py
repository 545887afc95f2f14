"""Linux cpu lists: the ``0-3,8,10-11`` text of sysfs files and of kernel parameters.

Parsing follows the kernel's own parser (``bitmap_parselist``) rather than a simplified
reading of sysfs output, so that one function can read both what sysfs writes and what an
administrator wrote on the kernel command line (``isolcpus=``, ``nohz_full=``). That is why
commas and whitespace both separate regions and empty regions are skipped, and why a range
may carry the ``start-end:used/group`` pattern: ``100-2000:2/25`` means CPUs 100, 101, 125,
126, 150, 151, ... The kernel has no plain ``start-end:stride`` form (it refuses ``0-7:2``),
so neither do we: a stride of 2 is ``0-7:1/2``. The kernel's ``N`` and ``all`` stand for "the
last CPU this kernel supports", which a string alone cannot tell, so they are refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MAX_CPUS = 1 << 16
"""CPU numbers must be below this.

No Linux build supports this many CPUs (``NR_CPUS`` tops out at 8192 on x86 and powerpc), and
the bound keeps a typo such as ``0-4000000000`` from building a set of four billion ints.
"""

_SEPARATORS = re.compile(r"[,\s]+")
_REGION = re.compile(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+)/([0-9]+))?)?")


def parse_cpu_list(text: str) -> frozenset[int]:
    """The CPUs that the cpu list ``text`` names, e.g. ``"0-3,8"`` -> {0, 1, 2, 3, 8}.

    An empty or all-whitespace list is the empty set: sysfs writes an empty line for
    "none" (an empty ``offline`` file, a memory-only node's ``cpulist``).

    Raises:
        ValueError: ``text`` is not a cpu list; the message quotes it and the bad region.
    """
    cpus: set[int] = set()
    for region in _SEPARATORS.split(text):
        if region:
            try:
                cpus.update(_parse_region(region))
            except ValueError as e:
                raise ValueError(f"bad cpu list {text!r}: {e}") from None
    return frozenset(cpus)


def _parse_region(region: str) -> range | list[int]:
    """The CPUs of one region between separators: ``8``, ``0-3`` or ``0-15:2/4``."""
    match = _REGION.fullmatch(region)
    if match is None:
        if re.fullmatch(r"[0-9]+-[0-9]+:[0-9]+", region):
            raise ValueError(
                f"{region!r} has a stride but the kernel's pattern is start-end:used/group, "
                "e.g. 0-7:1/2 for every other CPU"
            )
        if "N" in region or "all" in region.lower():
            raise ValueError(
                f"{region!r} uses N or all, which stand for the kernel's last CPU; "
                "only the kernel knows which that is"
            )
        raise ValueError(f"{region!r} is not a CPU number, a range a-b or a pattern a-b:used/group")
    start = _cpu_number(match[1], region)
    end = start if match[2] is None else _cpu_number(match[2], region)
    if end < start:
        raise ValueError(f"{region!r} runs backwards")
    if match[3] is None:
        return range(start, end + 1)
    used, group = int(match[3]), int(match[4])
    if group == 0:
        raise ValueError(f"{region!r} has a group size of 0")
    if used > group:
        raise ValueError(f"{region!r} uses more CPUs than its group has")
    # As the kernel does: groups start every `group` CPUs from `start`, and the first
    # `used` CPUs of each group within start-end are in the list.
    return [cpu for cpu in range(start, end + 1) if (cpu - start) % group < used]


def _cpu_number(digits: str, region: str) -> int:
    number = int(digits)
    if number >= MAX_CPUS:
        raise ValueError(f"{region!r} names CPU {number}; CPU numbers must be below {MAX_CPUS}")
    return number


def format_cpu_list(cpus: Iterable[int]) -> str:
    """``cpus`` as the kernel writes a cpu list: sorted, runs collapsed, ``"0-3,8"``.

    Two consecutive CPUs are written as a range (``"0-1"``), as the kernel does, so that
    our output compares equal to what sysfs shows. No CPUs is the empty string.

    Raises:
        ValueError: a CPU number is negative, which no list can express.
    """
    ordered = sorted(set(cpus))
    if ordered and ordered[0] < 0:
        raise ValueError(f"a cpu list cannot hold the negative CPU {ordered[0]}")
    runs: list[str] = []
    index = 0
    while index < len(ordered):
        first = last = ordered[index]
        index += 1
        while index < len(ordered) and ordered[index] == last + 1:
            last = ordered[index]
            index += 1
        runs.append(str(first) if first == last else f"{first}-{last}")
    return ",".join(runs)
