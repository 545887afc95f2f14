"""The ``nodedra`` command."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from nodedra import __version__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``nodedra`` command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="nodedra", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("version", help="print the version")
    args = parser.parse_args(argv)
    if args.command == "version":
        print(f"nodedra {__version__}")
    return 0
