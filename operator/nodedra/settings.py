"""How ``nodedra run`` is configured: flags, each with an environment variable behind it.

The same settings reach the operator whether it is started as ``nodedra run --flag ...`` or
as ``kopf run -m nodedra.handlers`` (which passes no flags of ours): every flag has an
environment variable, and a flag given wins over its variable. In a DaemonSet the node name
and the pod UID come from the downward API as ``NODE_NAME`` and ``POD_UID``.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from nodedra.nri import DEFAULT_SOCKET, PINNING_MODES
from nodedra.quiet import IRQBALANCE_DIR, SYSTEM_BUS

DEFAULT_CONFIG = "/etc/nodedra/config.yaml"
KUBELET_STATE_FILE = "/var/lib/kubelet/cpu_manager_state"
"""The kubelet's CPU manager state file with the default --root-dir."""
DEFAULT_METRICS_ADDRESS = "0.0.0.0:9464"
DEFAULT_HEALTH_ADDRESS = "0.0.0.0:8080"
DEFAULT_STATUS_ADDRESS = "127.0.0.1:9465"
"""Localhost: the CPU map names pods and claims, for people the API lets ``exec`` in."""
ADDRESSES = ("metrics_address", "health_address", "status_address")
"""The settings that are host:port; an empty one turns its listener off."""


class SettingsError(ValueError):
    """Settings nodedra cannot run with; the message names the flag and its variable."""


@dataclass(frozen=True)
class Settings:
    """Everything ``nodedra run`` needs to know."""

    node_name: str
    kubeconfig: str | None = None
    registry_dir: Path | None = None
    plugin_dir: Path | None = None
    cdi_dir: Path | None = None
    state_dir: Path | None = None
    config: Path = Path(DEFAULT_CONFIG)
    config_required: bool = False
    sysfs: Path = Path("/sys")
    pod_uid: str | None = None
    log_level: str = "info"
    log_format: str = "text"
    metrics_address: str = DEFAULT_METRICS_ADDRESS
    health_address: str = DEFAULT_HEALTH_ADDRESS
    status_address: str = DEFAULT_STATUS_ADDRESS
    watch_claims: bool = True
    release_orphans: bool = False
    orphan_grace: float = 300.0
    config_poll: float = 10.0
    resync_period: float = 30.0
    pinning: str = "required"
    nri_socket: Path = DEFAULT_SOCKET
    nri_index: str = "50"
    allow_whole_numa_node_devices: bool = False
    kubelet_cpu_manager_state: Path | None = Path(KUBELET_STATE_FILE)
    kubelet_config: Path | None = None
    irq_dir: Path = Path("/proc/irq")
    workqueue_dir: Path = Path("/sys/devices/virtual/workqueue")
    system_bus: Path = SYSTEM_BUS
    irqbalance_dir: Path = IRQBALANCE_DIR


@dataclass(frozen=True)
class _Flag:
    name: str
    env: str
    help: str


FLAGS = (
    _Flag("node_name", "NODE_NAME", "the node this instance serves (required)"),
    _Flag("kubeconfig", "KUBECONFIG", "a kubeconfig file; default: the in-cluster config"),
    _Flag("registry_dir", "NODEDRA_REGISTRY_DIR", "the kubelet's plugin registry directory"),
    _Flag("plugin_dir", "NODEDRA_PLUGIN_DIR", "the DRA socket's directory"),
    _Flag("cdi_dir", "NODEDRA_CDI_DIR", "where the claims' CDI specs are written"),
    _Flag("state_dir", "NODEDRA_STATE_DIR", "where the checkpoint lives (default: plugin dir)"),
    _Flag("config", "NODEDRA_CONFIG", f"the policy configuration file ({DEFAULT_CONFIG})"),
    _Flag("sysfs", "NODEDRA_SYSFS", "the sysfs root to read the topology from (/sys)"),
    _Flag("pod_uid", "POD_UID", "this pod's UID: enables rolling updates beside another pod"),
    _Flag("log_level", "NODEDRA_LOG_LEVEL", "debug, info, warning or error"),
    _Flag("log_format", "NODEDRA_LOG_FORMAT", "text or json"),
    _Flag("metrics_address", "NODEDRA_METRICS_ADDRESS", "host:port of /metrics; empty: off"),
    _Flag("health_address", "NODEDRA_HEALTH_ADDRESS", "host:port of /healthz; empty: off"),
    _Flag(
        "status_address",
        "NODEDRA_STATUS_ADDRESS",
        "host:port of /status, the CPU map (keep it on localhost); empty: off",
    ),
    _Flag("watch_claims", "NODEDRA_WATCH_CLAIMS", "watch ResourceClaims (true/false)"),
    _Flag("release_orphans", "NODEDRA_RELEASE_ORPHANS", "release claims gone from the API"),
    _Flag("orphan_grace", "NODEDRA_ORPHAN_GRACE", "seconds a claim may be gone before it counts"),
    _Flag("config_poll", "NODEDRA_CONFIG_POLL", "seconds between checks of the config file"),
    _Flag("resync_period", "NODEDRA_RESYNC_PERIOD", "seconds between ResourceSlice checks"),
    _Flag(
        "pinning",
        "NODEDRA_PINNING",
        "pin containers to their claims' CPUs: required (claims wait for the runtime), "
        "best-effort or off",
    ),
    _Flag("nri_socket", "NODEDRA_NRI_SOCKET", "the container runtime's NRI socket"),
    _Flag("nri_index", "NODEDRA_NRI_INDEX", "the NRI plugin index, two digits (50)"),
    _Flag(
        "allow_whole_numa_node_devices",
        "NODEDRA_ALLOW_WHOLE_NUMA_NODE_DEVICES",
        "publish the topology-aware devices where the API server has DRAConsumableCapacity "
        "off, though a claim of one then takes its whole NUMA node (default: false, they "
        "are withheld)",
    ),
    _Flag(
        "kubelet_cpu_manager_state",
        "NODEDRA_KUBELET_CPU_MANAGER_STATE",
        "the kubelet's CPU manager state file, read to refuse pinning where its policy is "
        f"static ({KUBELET_STATE_FILE})",
    ),
    _Flag(
        "kubelet_config",
        "NODEDRA_KUBELET_CONFIG",
        "the kubelet's configuration file (kubeadm: /var/lib/kubelet/config.yaml), read for "
        "its CPU, memory and topology manager policies and reservedSystemCPUs (default: none)",
    ),
    _Flag(
        "irq_dir",
        "NODEDRA_IRQ_DIR",
        "the host's /proc/irq, written with quietCPUs.interrupts (in a pod: a hostPath of "
        "it, since the container's own is read-only)",
    ),
    _Flag(
        "workqueue_dir",
        "NODEDRA_WORKQUEUE_DIR",
        "the host's /sys/devices/virtual/workqueue, written with quietCPUs.unboundWork",
    ),
    _Flag(
        "system_bus",
        "NODEDRA_SYSTEM_BUS",
        "the host's D-Bus system bus socket, through which systemd is asked to keep its "
        "slices off claimed CPUs (quietCPUs.hostProcesses)",
    ),
    _Flag(
        "irqbalance_dir",
        "NODEDRA_IRQBALANCE_DIR",
        "where irqbalance makes its socket on the host, through which it is told to keep "
        "interrupts off claimed CPUs (quietCPUs.interrupts; in a pod: under a hostPath of "
        "the host's /run, since irqbalance makes the directory anew at each start)",
    ),
)
_TYPES = {f.name: f.type for f in fields(Settings)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every setting as ``--flag`` (``node_name`` is ``--node-name``)."""
    for flag in FLAGS:
        parser.add_argument(
            "--" + flag.name.replace("_", "-"),
            dest=flag.name,
            default=None,
            help=f"{flag.help} [${flag.env}]",
        )


def load_settings(
    args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Settings from flags (when given) over environment variables over defaults."""
    environ = os.environ if environ is None else environ
    values: dict[str, object] = {}
    for flag in FLAGS:
        raw = getattr(args, flag.name, None) if args is not None else None
        if raw is None:
            raw = environ.get(flag.env)
        if raw is None or (raw == "" and flag.name not in ADDRESSES):
            continue
        values[flag.name] = _convert(flag, str(raw))
    if not values.get("node_name"):
        raise SettingsError(
            "no node name: pass --node-name or set NODE_NAME (in a DaemonSet, from the "
            "downward API: fieldRef spec.nodeName)"
        )
    if "config" in values:
        values["config_required"] = True
    settings = Settings(**values)  # type: ignore[arg-type]
    _check(settings)
    return settings


def to_environ(settings: Settings) -> dict[str, str]:
    """The environment variables that reproduce ``settings`` (for ``kopf run``)."""
    out = {}
    for flag in FLAGS:
        value = getattr(settings, flag.name)
        if value is not None:
            out[flag.env] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def _convert(flag: _Flag, raw: str) -> object:
    kind = str(_TYPES[flag.name])
    try:
        if "bool" in kind:
            if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError("expected true or false")
            return raw.lower() in ("true", "1", "yes")
        if "float" in kind:
            value = float(raw)
            if value <= 0:
                raise ValueError("must be positive")
            return value
        if "Path" in kind:
            return Path(raw)
    except ValueError as err:
        raise SettingsError(
            f"--{flag.name.replace('_', '-')} / ${flag.env}: bad value {raw!r}: {err}"
        ) from None
    return raw


def _check(settings: Settings) -> None:
    if settings.log_format not in ("text", "json"):
        raise SettingsError(
            f"--log-format / $NODEDRA_LOG_FORMAT: {settings.log_format!r} is not text or json"
        )
    if settings.log_level.lower() not in ("debug", "info", "warning", "error"):
        raise SettingsError(
            f"--log-level / $NODEDRA_LOG_LEVEL: {settings.log_level!r} is not one of "
            "debug, info, warning, error"
        )
    if settings.pinning not in PINNING_MODES:
        raise SettingsError(
            f"--pinning / $NODEDRA_PINNING: {settings.pinning!r} is not one of "
            f"{', '.join(PINNING_MODES)}"
        )
    if not re.fullmatch("[0-9]{2}", settings.nri_index):
        raise SettingsError(
            f"--nri-index / $NODEDRA_NRI_INDEX: {settings.nri_index!r} is not two digits (00-99)"
        )
    for name in ADDRESSES:
        address = getattr(settings, name)
        if address and not _is_address(address):
            flag = next(f for f in FLAGS if f.name == name)
            raise SettingsError(
                f"--{name.replace('_', '-')} / ${flag.env}: {address!r} is not host:port"
            )


def _is_address(address: str) -> bool:
    _, sep, port = address.rpartition(":")
    return bool(sep) and port.isdigit() and 0 < int(port) < 65536


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` as (host, port); an empty host means every interface."""
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)
