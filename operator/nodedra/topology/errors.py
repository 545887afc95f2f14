"""The one error of nodedra.topology: sysfs did not describe a machine we can use."""

from __future__ import annotations

import os


class TopologyError(ValueError):
    """A sysfs file that must be there is missing, unreadable or says something impossible.

    The message names the file, because the fix is on the node (a kernel without some
    feature, a container without /sys mounted, a wrong ``--sysfs`` root) and the file is
    what an operator can go and look at. It is a ValueError because the input, the sysfs
    tree, is bad rather than the program.
    """

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        super().__init__(f"cannot read {os.fspath(path)}: {problem}")
        self.path = os.fspath(path)
        """The file (or directory) the problem was found in."""
        self.problem = problem
        """What is wrong with it, without the path."""
