"""Reading single sysfs files as text, integers and cpu lists, with errors that name the file.

Every failure becomes a :class:`TopologyError` carrying the path, so that the reader above
can stay a plain description of which files make up a topology. Integers are matched
strictly (ASCII digits, optional minus) because Python's ``int()`` would also take ``1_0``
or ``+5``, which the kernel never writes and which would hide a garbled file.
"""

from __future__ import annotations

import re
from pathlib import Path

from nodedra.topology.cpulist import parse_cpu_list
from nodedra.topology.errors import TopologyError

_INTEGER = re.compile(r"-?[0-9]+")


def read_text(path: Path) -> str:
    """The content of ``path``, which must exist."""
    try:
        return path.read_text(encoding="ascii")
    except OSError as e:
        raise TopologyError(path, e.strerror or str(e)) from None
    except UnicodeDecodeError:
        raise TopologyError(path, "it is not ASCII text") from None


def read_optional_text(path: Path) -> str | None:
    """The content of ``path``, or None if there is no such file."""
    try:
        return path.read_text(encoding="ascii")
    except FileNotFoundError:
        return None
    except OSError as e:
        raise TopologyError(path, e.strerror or str(e)) from None
    except UnicodeDecodeError:
        raise TopologyError(path, "it is not ASCII text") from None


def parse_int(path: Path, text: str) -> int:
    """``text``, read from ``path``, as the one integer the kernel wrote there."""
    stripped = text.strip()
    if _INTEGER.fullmatch(stripped) is None:
        raise TopologyError(path, f"{stripped!r} is not an integer")
    return int(stripped)


def read_int(path: Path) -> int:
    """The integer in ``path``, which must exist."""
    return parse_int(path, read_text(path))


def read_optional_int(path: Path) -> int | None:
    """The integer in ``path``, or None if there is no such file."""
    text = read_optional_text(path)
    return None if text is None else parse_int(path, text)


def parse_cpus(path: Path, text: str) -> frozenset[int]:
    """``text``, read from ``path``, as a cpu list."""
    try:
        return parse_cpu_list(text)
    except ValueError as e:
        raise TopologyError(path, str(e)) from None


def read_cpus(path: Path) -> frozenset[int]:
    """The cpu list in ``path``, which must exist."""
    return parse_cpus(path, read_text(path))


def read_optional_cpus(path: Path) -> frozenset[int] | None:
    """The cpu list in ``path``, or None if there is no such file."""
    text = read_optional_text(path)
    return None if text is None else parse_cpus(path, text)
