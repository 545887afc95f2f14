"""The ``nodedra`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from nodedra import __version__
from nodedra.inventory import inventory, render_json, render_text
from nodedra.policy import ConfigError, PolicyConfig, PolicyError, load_config
from nodedra.topology import TopologyError, read_topology


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``nodedra`` command line; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="nodedra", description="A DRA driver for CPUs and memory."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("version", help="print the version")
    topology = commands.add_parser(
        "topology", help="show the node's CPUs and memory and the devices each policy publishes"
    )
    topology.add_argument("--sysfs", default="/sys", help="the sysfs root to read (default /sys)")
    topology.add_argument("--config", help="a policy configuration file (reserved CPUs, options)")
    topology.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.command == "version":
        print(f"nodedra {__version__}")
        return 0
    try:
        topo = read_topology(args.sysfs)
        config = load_config(args.config) if args.config else PolicyConfig()
        data = inventory(topo, config)
    except (TopologyError, ConfigError, PolicyError) as err:
        print(f"nodedra topology: {err}", file=sys.stderr)
        return 1
    sys.stdout.write(render_json(data) + "\n" if args.json else render_text(topo, data))
    return 0
