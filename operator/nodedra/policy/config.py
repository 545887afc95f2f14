"""The policy configuration file: which policy, which CPUs are reserved, policy options.

```yaml
policy: topology-aware      # or: static
reservedCPUs: "0-1"         # never offered to claims (the system's and the kubelet's)
nodeAllocatable: true       # devices map the node's cpu and memory (KEP-5517)
fullPhysicalCores: false    # claims get whole physical cores only
numaNodeAttribute:          # resource.kubernetes.io/numaNode, for constraints with other
  form: scalar              #   drivers' devices: scalar, or list (DRAListTypeAttributes)
  aliases: []               #   the scalar under other names too (dra.net/numaNode)
quietCPUs:                  # the host's work kept off claimed CPUs (all off by default)
  interrupts: false         #   device interrupts (/proc/irq)
  unboundWork: false        #   unbound kernel workqueues
  hostProcesses: false      #   systemd's slices but the pods' (system.slice, user.slice...)
options:                    # per policy, see docs/configuration.md
  reservedMemory: 2Gi       # topology-aware: memory per NUMA node kept out of claims
  reservedHugepages:        # topology-aware: huge pages per NUMA node kept out of claims
    2Mi: 64Mi               #   page size: bytes (rounded up to whole pages)
  isolatedCPUs: offered     # topology-aware: offered, preferred or reserved (isolcpus=)
```

Parsing checks the file on its own (unknown keys, types, cpu lists); what depends on the
node (reserving every CPU, say) is checked when a policy takes the configuration.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from nodedra.lib.quantity import parse_quantity
from nodedra.quiet.work import QuietKinds
from nodedra.topology.cpulist import parse_cpu_list

POLICIES = ("topology-aware", "static")
OPTIONS: Mapping[str, Mapping[str, str]] = MappingProxyType(
    {
        "topology-aware": MappingProxyType(
            {
                "reservedMemory": "memory per NUMA node kept out of claims (a quantity, e.g. 2Gi)",
                "reservedHugepages": "huge pages per NUMA node kept out of claims, by page size "
                "(e.g. {2Mi: 64Mi})",
                "isolatedCPUs": "what claims get of a NUMA node's isolated CPUs: offered (like "
                "the others), preferred (first) or reserved (a device of their own)",
            }
        ),
        "static": MappingProxyType({}),
    }
)
ISOLATED_MODES = ("offered", "preferred", "reserved")
"""The values of the topology-aware option ``isolatedCPUs``; the first is the default."""
_TOP_LEVEL = (
    "policy",
    "reservedCPUs",
    "nodeAllocatable",
    "fullPhysicalCores",
    "numaNodeAttribute",
    "quietCPUs",
    "options",
)
QUIET_KINDS = {
    "interrupts": "interrupts",
    "unboundWork": "unbound_work",
    "hostProcesses": "host_processes",
}
"""The keys of ``quietCPUs`` -> the fields of QuietKinds."""
NUMA_FORMS = ("scalar", "list")
"""The forms of ``numaNodeAttribute``; the first is the default."""
MAX_NUMA_ALIASES = 4
"""A device has room for 32 attributes; aliases are a few names of other drivers."""
_QUALIFIED_NAME = re.compile(
    r"(?=[^/]{1,63}/)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
    r"/[A-Za-z_][A-Za-z0-9_]{0,31}"
)
"""A fully qualified attribute name: a DNS subdomain, a slash and a C identifier."""


class ConfigError(ValueError):
    """A configuration that cannot be used; the message says where and why."""


@dataclass(frozen=True)
class NUMAAttribute:
    """How devices name their NUMA node (``nodedra.policy.numa_attribute``)."""

    form: str = NUMA_FORMS[0]
    """``scalar`` or ``list`` (the node, then the nearest of its socket)."""
    aliases: tuple[str, ...] = ()
    """Other attribute names that carry the scalar."""


@dataclass(frozen=True)
class PolicyConfig:
    """A parsed, checked configuration."""

    policy: str = "topology-aware"
    reserved_cpus: frozenset[int] = frozenset()
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    node_allocatable: bool = True
    """Whether devices say which node allocatable resources (cpu, memory) they stand for."""
    full_physical_cores: bool = False
    """Whether claims get whole physical cores only, and no thread of a claimed core goes to
    anyone else (the kubelet's ``full-pcpus-only``)."""
    numa_attribute: NUMAAttribute = NUMAAttribute()
    quiet: QuietKinds = field(default_factory=QuietKinds)
    """The host's work kept off the CPUs claims hold (``nodedra.quiet``)."""

    @property
    def reserved_memory(self) -> int:
        """Bytes per NUMA node the topology-aware policy keeps out of claims."""
        return int(self.options.get("reservedMemory", 0))

    @property
    def reserved_hugepages(self) -> Mapping[int, int]:
        """Page size -> bytes of each NUMA node's huge pages kept out of claims."""
        reserved: Mapping[int, int] = self.options.get("reservedHugepages", MappingProxyType({}))
        return reserved

    @property
    def isolated_cpus(self) -> str:
        """What the topology-aware policy does with isolated CPUs: one of ISOLATED_MODES."""
        return str(self.options.get("isolatedCPUs", ISOLATED_MODES[0]))


def parse_config(data: object, source: str = "configuration") -> PolicyConfig:
    """A configuration from parsed YAML; ConfigError naming ``source`` if it is bad."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: must be a mapping, not {type(data).__name__}")
    unknown = sorted(set(data) - set(_TOP_LEVEL))
    if unknown:
        raise ConfigError(f"{source}: unknown keys {unknown}; known: {list(_TOP_LEVEL)}")
    policy = data.get("policy", "topology-aware")
    if policy not in POLICIES:
        raise ConfigError(f"{source}: policy: {policy!r} is not one of {list(POLICIES)}")
    reserved = data.get("reservedCPUs", "")
    if isinstance(reserved, int) and not isinstance(reserved, bool):
        reserved = str(reserved)
    if not isinstance(reserved, str):
        raise ConfigError(f"{source}: reservedCPUs: must be a cpu list such as '0-1,8'")
    try:
        reserved_cpus = parse_cpu_list(reserved)
    except ValueError as err:
        raise ConfigError(f"{source}: reservedCPUs: {err}") from None
    node_allocatable = data.get("nodeAllocatable", True)
    if not isinstance(node_allocatable, bool):
        raise ConfigError(f"{source}: nodeAllocatable: must be true or false")
    full_cores = data.get("fullPhysicalCores", False)
    if not isinstance(full_cores, bool):
        raise ConfigError(f"{source}: fullPhysicalCores: must be true or false")
    return PolicyConfig(
        policy,
        reserved_cpus,
        _options(policy, data.get("options"), source),
        node_allocatable,
        full_cores,
        _numa_attribute(data.get("numaNodeAttribute"), f"{source}: numaNodeAttribute"),
        _quiet(data.get("quietCPUs"), f"{source}: quietCPUs"),
    )


def _quiet(raw: object, where: str) -> QuietKinds:
    raw = {} if raw is None else raw
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be a mapping of {sorted(QUIET_KINDS)} to true or false")
    unknown = sorted(set(raw) - set(QUIET_KINDS))
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown}; known: {sorted(QUIET_KINDS)}")
    kinds = {}
    for key, value in raw.items():
        if not isinstance(value, bool):
            raise ConfigError(f"{where}.{key}: must be true or false")
        kinds[QUIET_KINDS[key]] = value
    return QuietKinds(**kinds)


def _numa_attribute(raw: object, where: str) -> NUMAAttribute:
    raw = {} if raw is None else raw
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be a mapping with form and aliases")
    unknown = sorted(set(raw) - {"form", "aliases"})
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown}; known: ['aliases', 'form']")
    form = raw.get("form", NUMA_FORMS[0])
    if form not in NUMA_FORMS:
        raise ConfigError(f"{where}.form: {form!r} is not one of {list(NUMA_FORMS)}")
    aliases = raw.get("aliases") or []
    if not isinstance(aliases, list) or len(aliases) > MAX_NUMA_ALIASES:
        raise ConfigError(f"{where}.aliases: must be a list of at most {MAX_NUMA_ALIASES} names")
    for alias in aliases:
        if not isinstance(alias, str) or not _QUALIFIED_NAME.fullmatch(alias):
            raise ConfigError(
                f"{where}.aliases: {alias!r} is not a qualified attribute name such as "
                "dra.net/numaNode (a domain, a slash, a name of at most 32 characters)"
            )
        if alias.startswith("resource.kubernetes.io/"):
            raise ConfigError(f"{where}.aliases: {alias!r} is a standard attribute's name")
    if len(set(aliases)) != len(aliases):
        raise ConfigError(f"{where}.aliases: {aliases} names one attribute twice")
    return NUMAAttribute(form, tuple(aliases))


def _options(policy: str, raw: object, source: str) -> Mapping[str, Any]:
    raw = {} if raw is None else raw
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: options: must be a mapping")
    known = OPTIONS[policy]
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(
            f"{source}: options: {unknown} are not options of policy {policy}; "
            f"known: {sorted(known) or 'none'}"
        )
    options: dict[str, Any] = {}
    if "reservedMemory" in raw:
        options["reservedMemory"] = _bytes(
            raw["reservedMemory"], f"{source}: options.reservedMemory"
        )
    if "reservedHugepages" in raw:
        options["reservedHugepages"] = _hugepages(
            raw["reservedHugepages"], f"{source}: options.reservedHugepages"
        )
    if "isolatedCPUs" in raw:
        mode = raw["isolatedCPUs"]
        if mode not in ISOLATED_MODES:
            raise ConfigError(
                f"{source}: options.isolatedCPUs: {mode!r} is not one of {list(ISOLATED_MODES)}"
            )
        options["isolatedCPUs"] = mode
    return MappingProxyType(options)


def _bytes(raw: object, where: str) -> int:
    """A whole, non-negative number of bytes, as a quantity ("2Gi", 1024)."""
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        raise ConfigError(f"{where}: not a quantity: {raw!r}")
    try:
        value = parse_quantity(raw)
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from None
    if value < 0 or value.denominator != 1:
        raise ConfigError(f"{where}: {raw!r} is not a whole, non-negative number of bytes")
    return int(value)


def _hugepages(raw: object, where: str) -> Mapping[int, int]:
    """Page size -> bytes, from a mapping of quantities such as ``{2Mi: 64Mi, 1Gi: 1Gi}``."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must map page sizes to amounts, e.g. {{2Mi: 64Mi}}")
    reserved = {}
    for size, amount in raw.items():
        page = _bytes(size, f"{where}: page size")
        if page == 0:
            raise ConfigError(f"{where}: page size {size!r} is not a size")
        reserved[page] = _bytes(amount, f"{where}[{size}]")
    return MappingProxyType(reserved)


def load_config(path: str | Path) -> PolicyConfig:
    """Read and check a configuration file."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ConfigError(f"cannot read configuration {path}: {err.strerror or err}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    return parse_config(data, str(path))
