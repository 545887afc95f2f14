"""The ``nodedra`` command."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from nodedra import __version__, cgroupcheck, cpumap, endpoints, gather, served
from nodedra.cleanup import NodePaths, command
from nodedra.inventory import inventory, render_json, render_text
from nodedra.observability import configure_logging
from nodedra.policy import ConfigError, PolicyConfig, PolicyError, load_config
from nodedra.settings import (
    DEFAULT_STATUS_ADDRESS,
    SettingsError,
    add_arguments,
    load_settings,
    to_environ,
)
from nodedra.spreadclaim import spread_template
from nodedra.topology import TopologyError, read_topology


def run(args: argparse.Namespace) -> int:
    """``nodedra run``: kopf, standalone and cluster-wide, with nodedra's handlers."""
    try:
        settings = load_settings(args)
    except SettingsError as err:
        print(f"nodedra run: {err}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    os.environ.update(to_environ(settings))  # what kopf's login and the handlers read
    import kopf  # noqa: PLC0415 (kopf's import is heavy; only `run` needs it)

    import nodedra.handlers  # noqa: F401, PLC0415 (registers the handlers with kopf)
    from nodedra.handlers import Shutdown  # noqa: PLC0415

    # No stop flag: kopf would wait for it in an executor thread that stays blocked when the
    # operator stops on SIGTERM, and asyncio.run then waits for that thread forever, so the
    # process never exited (the kubelet had to kill it). Without a flag, a shutdown that
    # nodedra asks for itself is a SIGTERM to itself, which kopf handles like the kubelet's.
    shutdown = Shutdown(None)
    liveness = f"http://{settings.health_address}/healthz" if settings.health_address else None
    try:
        kopf.run(
            standalone=True,
            clusterwide=True,
            liveness_endpoint=liveness,
            memo=kopf.Memo(settings=settings, shutdown=shutdown),
        )
    except Exception as err:  # kopf ends with the error that stopped it
        print(f"nodedra run: {shutdown.reason or err}", file=sys.stderr)
        return 1
    if shutdown.reason is not None:
        print(f"nodedra run: stopped: {shutdown.reason}", file=sys.stderr)
        return 1
    return 0


def status(args: argparse.Namespace) -> int:
    """``nodedra status``: who holds each CPU, from a running instance, checked on the node."""
    if not args.address:
        print(
            "nodedra status: no address: NODEDRA_STATUS_ADDRESS is empty, which turns "
            "/status off; pass --address HOST:PORT of an instance that serves it",
            file=sys.stderr,
        )
        return 2
    try:
        cpu_map = cpumap.check(
            cpumap.fetch(args.address, args.timeout), args.cgroup_root, args.proc
        )
    except cpumap.StatusError as err:
        print(f"nodedra status: {err}", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.write(cpumap.render_json(cpu_map))
        return 0
    colour = cpumap.use_colour(sys.stdout, os.environ)
    width = shutil.get_terminal_size((100, 24)).columns if sys.stdout.isatty() else 100
    sys.stdout.write(cpumap.render_text(cpu_map, colour=colour, width=width))
    return 0


def version(args: argparse.Namespace) -> int:
    """``nodedra version``."""
    print(f"nodedra {__version__}")
    return 0


def topology(args: argparse.Namespace) -> int:
    """``nodedra topology``: the node's CPUs and memory, and the devices of each policy."""
    try:
        topo = read_topology(args.sysfs)
        config = load_config(args.config) if args.config else PolicyConfig()
        data = inventory(topo, config)
    except (TopologyError, ConfigError, PolicyError) as err:
        print(f"nodedra topology: {err}", file=sys.stderr)
        return 1
    sys.stdout.write(render_json(data) + "\n" if args.json else render_text(topo, data))
    return 0


def claim_template(args: argparse.Namespace) -> int:
    """``nodedra claim-template``: a claim spread evenly over NUMA nodes of one socket."""
    try:
        template = spread_template(args.name, args.cpus, args.numa_nodes, args.memory)
    except ValueError as err:
        print(f"nodedra claim-template: {err}", file=sys.stderr)
        return 1
    sys.stdout.write(yaml.safe_dump(template, sort_keys=False))
    return 0


def get(args: argparse.Namespace) -> int:
    """``nodedra get readyz|metrics|healthz|status``: an endpoint's answer, from inside the pod."""
    try:
        answer = served.get_named(args.endpoint, args.timeout)
    except endpoints.EndpointError as err:
        print(f"nodedra get {args.endpoint}: {err}", file=sys.stderr)
        return 1
    sys.stdout.buffer.write(answer.body)
    if not answer.body.endswith(b"\n"):
        sys.stdout.buffer.write(b"\n")
    sys.stdout.flush()
    if not answer.ok:
        print(f"nodedra get {args.endpoint}: {answer.url} answered {answer.code}", file=sys.stderr)
        return 1
    return 0


def gather_command(args: argparse.Namespace) -> int:
    """``nodedra gather``: the bug report's archive, to stdout or ``--output``."""
    if args.output is None and sys.stdout.isatty():
        print(
            "nodedra gather: the archive is binary; redirect it (nodedra gather > "
            "nodedra-gather.tar.gz) or pass --output PATH",
            file=sys.stderr,
        )
        return 2
    data = gather.archive(gather.Sources(timeout=args.timeout))
    if args.output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    else:
        try:
            args.output.write_bytes(data)
        except OSError as err:
            print(f"nodedra gather: cannot write {args.output}: {err}", file=sys.stderr)
            return 1
    return 0


def preflight(args: argparse.Namespace) -> int:
    """``nodedra preflight``: the checks of the node that pinning must not fight."""
    from nodedra.preflight.command import preflight as check  # noqa: PLC0415 (heavy: the API client)

    return check(args)


def cleanup(args: argparse.Namespace) -> int:
    """``nodedra cleanup``: remove nodedra's files from this node, once nodedra is gone."""
    paths = NodePaths(
        registry_dir=args.registry_dir,
        plugins_dir=args.plugins_dir,
        cdi_dir=args.cdi_dir,
        state_dir=args.state_dir,
        irq_dir=args.irq_dir,
        workqueue_dir=args.workqueue_dir,
        system_bus=args.system_bus,
        irqbalance_dir=args.irqbalance_dir,
    )
    return command(paths, sys.stdout, sys.stderr)


def _add_timeout(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("--timeout", type=float, default=10.0, help=help_text)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``nodedra`` command line; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="nodedra", description="A DRA driver for CPUs and memory."
    )
    parser.add_argument(
        "--version", action="version", version=f"nodedra {__version__}", help="print the version"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("version", help="print the version")
    topology_parser = commands.add_parser(
        "topology", help="show the node's CPUs and memory and the devices each policy publishes"
    )
    topology_parser.add_argument(
        "--sysfs", default="/sys", help="the sysfs root to read (default /sys)"
    )
    topology_parser.add_argument(
        "--config", help="a policy configuration file (reserved CPUs, options)"
    )
    topology_parser.add_argument("--json", action="store_true", help="print one JSON object")
    status_parser = commands.add_parser(
        "status",
        help="show who holds each CPU of this node, and where containers really run",
        description="Draw the CPUs of the node by NUMA node and core, each marked with the "
        "claim holding it (R: reserved, .: shared pool), as a running nodedra serves them at "
        "/status, and check each container it knows against the cpuset of its cgroup (else "
        "its process in /proc) on this machine.",
    )
    status_parser.add_argument(
        "--address",
        default=os.environ.get("NODEDRA_STATUS_ADDRESS", DEFAULT_STATUS_ADDRESS),
        help="host:port where the instance serves /status (default: "
        f"$NODEDRA_STATUS_ADDRESS, else {DEFAULT_STATUS_ADDRESS}: run it in nodedra's pod, "
        "with kubectl exec; an any-interface host means this machine)",
    )
    status_parser.add_argument("--json", action="store_true", help="print one JSON object")
    status_parser.add_argument(
        "--cgroup-root",
        type=Path,
        default=cgroupcheck.default_root(),
        help="the host's cgroup filesystem, to check containers' cpusets in (default: "
        f"${cgroupcheck.ROOT_VARIABLE}, else {cgroupcheck.DEFAULT_ROOT})",
    )
    status_parser.add_argument(
        "--proc",
        type=Path,
        default=Path("/proc"),
        help="the /proc to check containers in whose cgroup cannot be read",
    )
    _add_timeout(status_parser, "seconds to wait for the answer")
    get_parser = commands.add_parser(
        "get",
        help="print what one of nodedra's endpoints answers (in its pod: no curl there)",
        description="Fetch /readyz, /metrics, /healthz or /status from the nodedra running "
        "here, at the address its settings give (NODEDRA_METRICS_ADDRESS, "
        "NODEDRA_HEALTH_ADDRESS, NODEDRA_STATUS_ADDRESS), and print the answer. Exits 1 "
        "when it is not 200 OK (e.g. /readyz while not ready), after printing it.",
    )
    get_parser.add_argument("endpoint", choices=sorted(served.ENDPOINTS))
    _add_timeout(get_parser, "seconds to wait for the answer")
    gather_parser = commands.add_parser(
        "gather",
        help="write one tar.gz with what a bug report needs (run it in nodedra's pod)",
        description="Collect the version, settings, config file, CPU map with verdicts, "
        "/readyz, /metrics, topology, checkpoint summary, CDI specs and what the pod sees "
        "of the kubelet and the runtime into one gzipped tar, written to stdout. A part "
        "that fails is recorded in the archive's errors.json; the others are gathered.",
    )
    gather_parser.add_argument(
        "--output", type=Path, help="write the archive to this file instead of stdout"
    )
    _add_timeout(gather_parser, "seconds to wait for each endpoint")
    cleanup_parser = commands.add_parser(
        "cleanup",
        help="remove nodedra's files from this node once nodedra no longer runs on it",
        description="Remove what nodedra wrote on this node: its checkpoint (state "
        "directory), its claims' CDI specs and device metadata, its lock files and sockets, "
        "after giving back the CPUs quietCPUs took from the host's interrupts, workqueues and "
        "systemd's slices; "
        "print each path removed. Refuses while nodedra still runs here. Other vendors' "
        "files are never touched; running containers keep running.",
    )
    defaults = NodePaths()
    for flag, env, default, what in (
        ("--registry-dir", "NODEDRA_REGISTRY_DIR", defaults.registry_dir, "plugin registry"),
        ("--plugins-dir", None, defaults.plugins_dir, "kubelet's plugins directory"),
        ("--cdi-dir", "NODEDRA_CDI_DIR", defaults.cdi_dir, "CDI spec directory"),
        ("--state-dir", "NODEDRA_STATE_DIR", defaults.state_dir, "checkpoint's directory"),
        ("--irq-dir", "NODEDRA_IRQ_DIR", defaults.irq_dir, "host's /proc/irq (quietCPUs)"),
        (
            "--workqueue-dir",
            "NODEDRA_WORKQUEUE_DIR",
            defaults.workqueue_dir,
            "host's workqueue directory (quietCPUs)",
        ),
        ("--system-bus", "NODEDRA_SYSTEM_BUS", defaults.system_bus, "system bus (quietCPUs)"),
        (
            "--irqbalance-dir",
            "NODEDRA_IRQBALANCE_DIR",
            defaults.irqbalance_dir,
            "irqbalance's socket directory (quietCPUs)",
        ),
    ):
        cleanup_parser.add_argument(
            flag,
            type=Path,
            default=Path(os.environ.get(env) or default) if env else default,
            help=f"the {what} (default: {f'${env}, else ' if env else ''}{default})",
        )
    template_parser = commands.add_parser(
        "claim-template",
        help="print a ResourceClaimTemplate of more CPUs than a NUMA node holds",
        description="Write a topology-aware ResourceClaimTemplate of CPUS exclusive CPUs and "
        "MEMORY spread evenly over NUMA_NODES NUMA nodes of one socket: one request per node, "
        "the scheduler keeping them on distinct nodes (distinctAttribute, which needs "
        "DRAConsumableCapacity) of one package (matchAttribute). Apply it with kubectl.",
    )
    template_parser.add_argument("name", help="the template's name")
    template_parser.add_argument("--cpus", type=int, required=True, help="CPUs in all")
    template_parser.add_argument(
        "--numa-nodes", type=int, required=True, help="NUMA nodes to spread them over"
    )
    template_parser.add_argument(
        "--memory", default="0", help="memory in all, e.g. 6Gi (default 0), spread alike"
    )
    run_parser = commands.add_parser("run", help="run the node agent (a kopf operator)")
    add_arguments(run_parser)
    preflight_parser = commands.add_parser(
        "preflight",
        help="check the node before nodedra pins it: the kubelet's managers, the runtime, "
        "other CPU drivers, feature gates",
        description="Run the checks `nodedra run` makes at start and keeps making, print each "
        "(ok, unknown, warn, fail) with its fix, and exit 1 if one failed. Takes the same "
        "settings as `nodedra run`: in nodedra's pod, run it with kubectl exec.",
    )
    add_arguments(preflight_parser)
    preflight_parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    commands_run = {
        "version": version,
        "run": run,
        "status": status,
        "get": get,
        "gather": gather_command,
        "topology": topology,
        "cleanup": cleanup,
        "preflight": preflight,
        "claim-template": claim_template,
    }
    return commands_run[args.command](args)
