"""``nodedra preflight``: the checks ``nodedra run`` makes, printed, with their fixes.

Made for nodedra's pod (``kubectl exec -n nodedra <pod> -- nodedra preflight``): it reads
the same settings as ``nodedra run`` (flags over ``NODEDRA_*`` variables), so it sees the
kubelet's files where the pod mounts them and asks the API server with the pod's service
account. Exit status 0 when nothing failed, 1 when a check failed, 2 on bad settings.
"""

from __future__ import annotations

import argparse
import json
import sys

from nodedra.dra import KubeAPIError, KubeClusterAPI, driver_name
from nodedra.dra.probes import PUBLISHED_FIELD_GATES, GateProbe
from nodedra.policy import ConfigError
from nodedra.runtime import check_api_server, initial_config, kube_client
from nodedra.settings import SettingsError, load_settings
from nodedra.topology import TopologyError, read_topology

from .checks import Check
from .gather import ControlPlane, Inputs, cluster_checks, failed, kubelet_checks, render_text


def preflight(args: argparse.Namespace) -> int:
    """Run every check once and print them; the exit status says whether one failed."""
    try:
        settings = load_settings(args)
        topology = read_topology(settings.sysfs)
        config = initial_config(settings, topology)
    except (SettingsError, TopologyError, ConfigError) as err:
        print(f"nodedra preflight: {err}", file=sys.stderr)
        return 2
    results = kubelet_checks(
        Inputs(settings.kubelet_cpu_manager_state, settings.kubelet_config, config.reserved_cpus)
    )
    try:
        client = kube_client(settings)
        version = check_api_server(client)
    except SettingsError as err:
        results.append(Check("api-server", "unknown", str(err)))
    else:
        api = KubeClusterAPI(client)
        probe = GateProbe(api, settings.node_name, driver_name(config.policy))

        def gates() -> dict[str, bool | None]:
            known: dict[str, bool | None] = {}
            for gate in PUBLISHED_FIELD_GATES:
                try:
                    known[gate.name] = probe.on(gate)
                except KubeAPIError:
                    known[gate.name] = None
            return known

        control = ControlPlane(
            gates,
            {gate.name: gate.missing for gate in PUBLISHED_FIELD_GATES},
            version,
            lambda: config.numa_attribute.form,
        )
        results += cluster_checks(api, settings.node_name, control)
    if args.json:
        print(json.dumps({"failed": failed(results), "checks": [c.as_dict() for c in results]}))
    else:
        sys.stdout.write(render_text(results))
    return 1 if failed(results) else 0
