"""The Helm chart charts/nodedra: it lints, renders what manifests/ renders, and its values work.

Two ways to install nodedra must not drift apart: `kubectl apply -k manifests/` and the chart.
With default values and release namespace nodedra the chart renders exactly the objects of
`kubectl kustomize manifests/` (after YAML parsing; the ConfigMap's config.yaml is compared
parsed too). The values then change what they say, the configuration file they make is one
nodedra's own loader accepts, the environment one nodedra's own settings accept, and the API
server accepts every object (a server-side dry run). helm and kubectl are the real binaries
built by tests.peers.build, never ones from PATH. No node runs here.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodedra import __version__
from nodedra.cleanup import NodePaths
from nodedra.nri import PINNING_MODES
from nodedra.policy import POLICIES, PolicyConfig, load_config
from nodedra.policy.config import NUMAAttribute
from nodedra.quiet import QuietKinds
from nodedra.settings import Settings, load_settings, split_address
from nodedra.topology import parse_cpu_list
from tests.peers.build import PeerBinaries
from tests.peers.controlplane import ControlPlane
from tests.peers.nodedra_node import CLUSTER_SCOPED_KINDS, MANIFESTS, ROOT, apply_objects

CHART = ROOT / "charts" / "nodedra"
OVERLAYS = ROOT / "deploy" / "overlays"
RELEASE = "nodedra"

#: The kinds the chart renders, by scope; a kind in neither fails the tests until it is added.
NAMESPACED = frozenset({"ServiceAccount", "ConfigMap", "DaemonSet"})

#: Values that change everything the brief of the chart names (test 3 and its dry run).
CUSTOM = {
    "policy": "static",
    "reservedCPUs": "0-1",
    "image.repository": "registry.example.com/nodedra",
    "image.tag": "1.2.3",
    "pinning": "best-effort",
    "metrics.address": "0.0.0.0:9500",
    "status.address": "127.0.0.1:9600",
}
CUSTOM_SET = ",".join(f"{name}={value}" for name, value in CUSTOM.items())

Object = dict[str, Any]


# -- running helm and kubectl ---------------------------------------------------------------------


@dataclass(frozen=True)
class Rendered:
    """An object of a rendering, and the template (``# Source:``) it came from, if known."""

    obj: Object
    source: str

    @property
    def key(self) -> str:
        return object_key(self.obj)

    @property
    def where(self) -> str:
        """``key`` and, for the chart's objects, the template (charts/nodedra/templates/...)."""
        return f"{self.key} (charts/{self.source})" if self.source else self.key


@dataclass(frozen=True)
class Tools:
    """helm and kubectl, with an environment of their own (no user's config, no cluster)."""

    helm: Path
    kubectl: Path
    env: Mapping[str, str]

    def run(
        self, argv: Sequence[str | Path], stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(arg) for arg in argv],
            input=stdin,
            capture_output=True,
            text=True,
            env=dict(self.env),
            timeout=120,
            check=False,
        )

    def check(self, argv: Sequence[str | Path], stdin: str | None = None) -> str:
        """stdout of a command that must succeed; a failure shows its stderr."""
        result = self.run(argv, stdin)
        if result.returncode != 0:
            command = " ".join(str(arg) for arg in argv)
            pytest.fail(
                f"`{command}` exited {result.returncode}:\n{result.stderr}{result.stdout}",
                pytrace=False,
            )
        return result.stdout

    def template_text(self, namespace: str, *options: str) -> str:
        return self.check(
            [self.helm, "template", RELEASE, CHART, "--namespace", namespace, *options]
        )

    def template(self, namespace: str, *options: str) -> list[Rendered]:
        """``helm template nodedra charts/nodedra --namespace <namespace> <options>``."""
        return split_documents(self.template_text(namespace, *options))

    def kustomize(self, directory: Path = MANIFESTS) -> list[Rendered]:
        """``kubectl kustomize manifests/`` (or an overlay of it)."""
        return split_documents(self.check([self.kubectl, "kustomize", directory]))


@pytest.fixture(scope="module")
def tools(node_binaries: PeerBinaries, tmp_path_factory: pytest.TempPathFactory) -> Tools:
    home = tmp_path_factory.mktemp("helm-home")
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
        # No cluster unless a command names one with --kubeconfig.
        "KUBECONFIG": str(home / "no-cluster.kubeconfig"),
    }
    return Tools(node_binaries.helm, node_binaries.kubectl, env)


def split_documents(text: str) -> list[Rendered]:
    """The objects of a multi-document YAML stream, each with its ``# Source:`` comment."""
    rendered = []
    for document in re.split(r"^---[ \t]*$", text, flags=re.MULTILINE):
        obj = yaml.safe_load(document)
        if obj is None:
            continue
        assert isinstance(obj, dict), f"not an object: {document[:200]}"
        source = re.search(r"^# Source: (\S+)", document, flags=re.MULTILINE)
        rendered.append(Rendered(obj, source.group(1) if source else ""))
    return rendered


def object_key(obj: Mapping[str, Any]) -> str:
    """``Kind namespace/name`` or, cluster-scoped, ``Kind name``."""
    metadata = obj.get("metadata", {})
    namespace = metadata.get("namespace")
    name = metadata.get("name")
    return f"{obj.get('kind')} {namespace}/{name}" if namespace else f"{obj.get('kind')} {name}"


def by_key(rendered: Sequence[Rendered]) -> dict[str, Rendered]:
    keyed: dict[str, Rendered] = {}
    for item in rendered:
        assert item.key not in keyed, f"{item.key} is rendered twice"
        keyed[item.key] = item
    return keyed


def objects_of(rendered: Sequence[Rendered], kind: str) -> list[Object]:
    return [item.obj for item in rendered if item.obj["kind"] == kind]


def one(rendered: Sequence[Rendered], kind: str) -> Object:
    found = objects_of(rendered, kind)
    assert len(found) == 1, f"{len(found)} objects of kind {kind}, not one"
    return found[0]


# -- comparing objects ----------------------------------------------------------------------------


def normalized(obj: Object) -> Object:
    """``obj`` with every ``*.yaml`` entry of a ConfigMap's data parsed (comments do not count)."""
    if obj.get("kind") != "ConfigMap":
        return obj
    data = {
        key: yaml.safe_load(value) if key.endswith((".yaml", ".yml")) else value
        for key, value in obj.get("data", {}).items()
    }
    return {**obj, "data": data}


def _short(value: object) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def _child(path: str, key: object) -> str:
    if isinstance(key, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def _named(items: list[Any]) -> dict[str, Any] | None:
    """A list of objects with unique names, by name (containers, env, ports, volumes...)."""
    if not items or not all(isinstance(i, dict) and isinstance(i.get("name"), str) for i in items):
        return None
    names = {i["name"]: i for i in items}
    return names if len(names) == len(items) else None


def _keyed_diffs(
    chart: Mapping[Any, Any], manifests: Mapping[Any, Any], child: Callable[[Any], str]
) -> list[str]:
    """The diffs of the entries of two mappings, in the order of the chart's, then the rest."""
    diffs: list[str] = []
    for key in [*chart, *(key for key in manifests if key not in chart)]:
        if key not in manifests:
            diffs.append(f"{child(key)}: only in the chart: {_short(chart[key])}")
        elif key not in chart:
            diffs.append(f"{child(key)}: only in manifests/: {_short(manifests[key])}")
        else:
            diffs += field_diffs(chart[key], manifests[key], child(key))
    return diffs


def field_diffs(chart: object, manifests: object, path: str = "") -> list[str]:
    """Where two parsed objects differ, one line per field (lists of named objects by name)."""
    if isinstance(chart, dict) and isinstance(manifests, dict):
        return _keyed_diffs(
            dict(sorted(chart.items(), key=lambda item: str(item[0]))),
            manifests,
            lambda key: _child(path, key),
        )
    if isinstance(chart, list) and isinstance(manifests, list):
        chart_named, manifests_named = _named(chart), _named(manifests)
        if chart_named is None or manifests_named is None:
            return _keyed_diffs(
                dict(enumerate(chart)), dict(enumerate(manifests)), lambda i: f"{path}[{i}]"
            )
        diffs = _keyed_diffs(chart_named, manifests_named, lambda name: f"{path}[name={name}]")
        if not diffs and list(chart_named) != list(manifests_named):
            diffs.append(
                f"{path}: order differs: chart {list(chart_named)}, "
                f"manifests/ {list(manifests_named)}"
            )
        return diffs
    # type() too: True == 1 in Python, but not in Kubernetes.
    if type(chart) is not type(manifests) or chart != manifests:
        return [f"{path}: chart {_short(chart)}, manifests/ {_short(manifests)}"]
    return []


def drift_report(chart: Sequence[Rendered], manifests: Sequence[Rendered]) -> list[str]:
    """What differs between the two renderings, object by object; empty when nothing."""
    chart_keys, manifests_keys = by_key(chart), by_key(manifests)
    lines: list[str] = []
    for key in sorted(set(chart_keys) | set(manifests_keys)):
        if key not in manifests_keys:
            lines.append(f"{chart_keys[key].where}: only in the chart")
            continue
        if key not in chart_keys:
            lines.append(f"{key}: only in manifests/")
            continue
        diffs = field_diffs(normalized(chart_keys[key].obj), normalized(manifests_keys[key].obj))
        if diffs:
            lines.append(f"{chart_keys[key].where}:")
            lines += [f"    {diff}" for diff in diffs]
    return lines


def test_field_diffs_name_the_fields_that_differ() -> None:
    """The drift test's report: it must point at the field, so check that it does."""
    manifests = {
        "kind": "DaemonSet",
        "spec": {
            "containers": [
                {
                    "name": "nodedra",
                    "env": [{"name": "A", "value": "1"}],
                    "image": f"nodedra:{__version__}",
                }
            ],
            "flag": True,
            "labels": {"app.kubernetes.io/name": "nodedra"},
        },
    }
    chart = {
        "kind": "DaemonSet",
        "spec": {
            "containers": [
                {
                    "name": "nodedra",
                    "env": [{"name": "A", "value": "2"}, {"name": "B", "value": "x"}],
                    "image": f"nodedra:{__version__}",
                }
            ],
            "flag": 1,
            "labels": {
                "app.kubernetes.io/name": "nodedra",
                "helm.sh/chart": f"nodedra-{__version__}",
            },
        },
    }
    assert field_diffs(chart, manifests) == [
        'spec.containers[name=nodedra].env[name=A].value: chart "2", manifests/ "1"',
        'spec.containers[name=nodedra].env[name=B]: only in the chart: {"name": "B", "value": "x"}',
        "spec.flag: chart 1, manifests/ true",
        f'spec.labels["helm.sh/chart"]: only in the chart: "nodedra-{__version__}"',
    ]
    assert field_diffs(manifests, manifests) == []
    config = {"kind": "ConfigMap", "data": {"config.yaml": "# a comment\npolicy: static\n"}}
    same = {"kind": "ConfigMap", "data": {"config.yaml": "policy: static  # another\n"}}
    assert field_diffs(normalized(config), normalized(same)) == []


# -- 1. helm lint ---------------------------------------------------------------------------------


def test_chart_metadata_follows_nodedra_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "nodedra"
    assert (chart["version"], chart["appVersion"]) == (__version__, __version__), (
        "Chart.yaml's version and appVersion must be nodedra's __version__ "
        f"(operator/nodedra/__init__.py, {__version__})"
    )


@pytest.mark.parametrize(
    "options",
    [
        pytest.param((), id="defaults"),
        pytest.param(("--namespace", "other", "--set", CUSTOM_SET), id="custom"),
    ],
)
def test_helm_lint_strict(tools: Tools, options: tuple[str, ...]) -> None:
    output = tools.check([tools.helm, "lint", "--strict", CHART, *options])
    assert "1 chart(s) linted, 0 chart(s) failed" in output, output
    assert "[ERROR]" not in output, output
    assert "[WARNING]" not in output, output


# -- 2. the drift test ----------------------------------------------------------------------------


def test_default_values_render_the_kustomize_manifests(tools: Tools) -> None:
    chart = tools.template("nodedra")
    manifests = tools.kustomize()
    assert {item.obj["kind"] for item in manifests} <= CLUSTER_SCOPED_KINDS | NAMESPACED
    # Not vacuous: every file kustomization.yaml lists gives objects, and so both sides do.
    assert len(manifests) >= len(
        yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["resources"]
    )
    report = drift_report(chart, manifests)
    assert not report, (
        "`helm template nodedra charts/nodedra --namespace nodedra` (default values) and "
        "`kubectl kustomize manifests/` no longer render the same objects; whoever changed "
        "one side must change the other (charts/nodedra/templates/<file> and "
        "manifests/<file>, or values.yaml):\n  " + "\n  ".join(report)
    )


# -- 3. values change what they should ------------------------------------------------------------


def container(rendered: Sequence[Rendered]) -> Object:
    containers = one(rendered, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["nodedra"]
    result: Object = containers[0]
    return result


def environment(rendered: Sequence[Rendered]) -> dict[str, str]:
    """The container's environment as the pod would see it (downward API values made up)."""
    made_up = {"spec.nodeName": "node-1", "metadata.uid": "0123-4567"}
    env: dict[str, str] = {}
    for var in container(rendered).get("env", []):
        assert var["name"] not in env, f"{var['name']} is set twice"
        if "value" in var:
            assert isinstance(var["value"], str), f"{var['name']}: {var['value']!r} is no string"
            env[var["name"]] = var["value"]
        else:
            env[var["name"]] = made_up[var["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def settings_of(rendered: Sequence[Rendered]) -> Settings:
    """What nodedra's own settings make of the container's environment."""
    return load_settings(environ=environment(rendered))


def config_of(rendered: Sequence[Rendered], tmp_path: Path) -> PolicyConfig:
    """The ConfigMap's config.yaml as nodedra loads it from the mounted volume."""
    configmap = one(rendered, "ConfigMap")
    assert configmap["metadata"]["name"] == "nodedra-config"
    volumes = one(rendered, "DaemonSet")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "config", "configMap": {"name": "nodedra-config"}} in volumes
    path = tmp_path / "config.yaml"
    path.write_text(configmap["data"]["config.yaml"])
    return load_config(path)


def metrics_port(rendered: Sequence[Rendered]) -> int:
    """The container port the readiness probe uses, which must be the metrics port."""
    spec = container(rendered)
    ports = {port["name"]: port["containerPort"] for port in spec["ports"]}
    probe = spec["readinessProbe"]["httpGet"]
    assert probe["path"] == "/readyz"
    port = probe["port"]
    assert port == "metrics", f"the readiness probe uses port {port!r}, not the metrics port"
    value = ports["metrics"]
    assert isinstance(value, int)
    return value


def test_default_values_mean_nodedra_defaults(tools: Tools, tmp_path: Path) -> None:
    rendered = tools.template("nodedra")
    config = config_of(rendered, tmp_path)
    assert config == PolicyConfig("topology-aware", frozenset({0}), {}, True)
    settings = settings_of(rendered)
    assert "NODEDRA_PINNING" not in environment(rendered)
    assert settings.pinning == Settings.pinning == "required"
    assert settings.metrics_address == "0.0.0.0:9464"
    assert split_address(settings.metrics_address)[1] == metrics_port(rendered) == 9464
    assert settings.status_address == "127.0.0.1:9465", "the CPU map on localhost only"
    assert "status" not in {port["name"] for port in container(rendered)["ports"]}
    assert settings.log_format == "json"
    assert container(rendered)["image"] == f"nodedra:{__version__}"


def test_values_reach_the_config_and_the_daemonset(tools: Tools, tmp_path: Path) -> None:
    rendered = tools.template("nodedra", "--set", CUSTOM_SET)
    config = config_of(rendered, tmp_path)
    assert config.policy == "static"
    assert config.reserved_cpus == parse_cpu_list("0-1") == frozenset({0, 1})
    assert config.node_allocatable is True
    assert dict(config.options) == {}

    spec = container(rendered)
    assert spec["image"] == "registry.example.com/nodedra:1.2.3"
    assert spec["imagePullPolicy"] == "IfNotPresent"
    env = environment(rendered)
    assert env["NODEDRA_PINNING"] == "best-effort"
    assert env["NODEDRA_METRICS_ADDRESS"] == "0.0.0.0:9500"
    settings = settings_of(rendered)
    assert settings.pinning == "best-effort"
    assert split_address(settings.metrics_address) == ("0.0.0.0", 9500)
    assert settings.status_address == "127.0.0.1:9600"
    assert metrics_port(rendered) == 9500


def test_whole_cores_reach_the_config(tools: Tools, tmp_path: Path) -> None:
    rendered = tools.template("nodedra", "--set", "policy=static,fullPhysicalCores=true")
    config = config_of(rendered, tmp_path)
    assert (config.policy, config.full_physical_cores) == ("static", True)


def test_the_numa_node_attribute_reaches_the_config(tools: Tools, tmp_path: Path) -> None:
    rendered = tools.template(
        "nodedra",
        "--set-json",
        'numaNodeAttribute={"form":"list","aliases":["dra.net/numaNode"]}',
    )
    config = config_of(rendered, tmp_path)
    assert config.numa_attribute == NUMAAttribute("list", ("dra.net/numaNode",))


def by_name(daemonset: Rendered) -> Rendered:
    """``daemonset`` with its volumes, and its containers' variables and mounts, in name
    order (a kustomize patch puts what it adds first, the chart where it writes it)."""
    spec = daemonset.obj["spec"]["template"]["spec"]
    spec["volumes"].sort(key=lambda v: v["name"])
    for each in spec["containers"]:
        each["env"].sort(key=lambda v: v["name"])
        each["volumeMounts"].sort(key=lambda m: m["name"])
    return daemonset


def test_quiet_cpus_mount_what_the_quiet_cpus_overlay_mounts(tools: Tools, tmp_path: Path) -> None:
    """The value turns the feature on and mounts the host's files as deploy/overlays/quiet-cpus/
    does; without it nothing of the host's is writable."""
    chart = tools.template(
        "nodedra",
        "--set",
        "quietCPUs.interrupts=true,quietCPUs.unboundWork=true,quietCPUs.hostProcesses=true",
    )
    assert config_of(chart, tmp_path).quiet == QuietKinds(
        interrupts=True, unbound_work=True, host_processes=True
    )
    settings = settings_of(chart)
    assert (settings.irq_dir, settings.workqueue_dir, settings.irqbalance_dir) == (
        Path("/host/proc/irq"),
        Path("/host/sys/devices/virtual/workqueue"),
        Path("/host/run/irqbalance"),
    )
    daemonsets = [by_name(r) for r in chart if r.obj["kind"] == "DaemonSet"]
    overlay = [
        by_name(r) for r in tools.kustomize(OVERLAYS / "quiet-cpus") if r.obj["kind"] == "DaemonSet"
    ]
    assert not drift_report(daemonsets, overlay), drift_report(daemonsets, overlay)
    default = one(tools.template("nodedra"), "DaemonSet")["spec"]["template"]["spec"]["volumes"]
    assert not {v["name"] for v in default} & {"irq", "workqueue", "system-bus", "host-run"}
    # Without hostProcesses, the system bus is not mounted.
    kernel_only = one(tools.template("nodedra", "--set", "quietCPUs.interrupts=true"), "DaemonSet")
    volumes = kernel_only["spec"]["template"]["spec"]["volumes"]
    assert "system-bus" not in {v["name"] for v in volumes}
    # Its cleanup gives the host's work back: the same files, where `nodedra cleanup` looks.
    cleanup = one(tools.kustomize(OVERLAYS / "quiet-cpus-cleanup"), "DaemonSet")
    (init,) = cleanup["spec"]["template"]["spec"]["initContainers"]
    env = {e["name"]: e["value"] for e in init["env"]}
    mounts = {m["mountPath"] for m in init["volumeMounts"]}
    assert {env["NODEDRA_IRQ_DIR"], env["NODEDRA_WORKQUEUE_DIR"]} <= mounts
    assert str(NodePaths().system_bus.parent) in mounts
    assert str(Path(env["NODEDRA_IRQBALANCE_DIR"]).parent) in mounts


def test_options_node_allocatable_and_the_rest(tools: Tools, tmp_path: Path) -> None:
    rendered = tools.template(
        "nodedra",
        "--set",
        "options.reservedMemory=2Gi,nodeAllocatable=false,logFormat=text,image.pullPolicy=Always",
        "--set-string",
        r"reservedCPUs=0\,32",
        "--set-string",
        "nodeSelector.node-role\\.example\\.com/cpu=true",
        "--set-json",
        'extraEnv=[{"name":"NODEDRA_LOG_LEVEL","value":"debug"}]',
        "--set-json",
        'tolerations=[{"key":"dedicated","operator":"Equal","value":"cpu","effect":"NoSchedule"}]',
        "--set-json",
        'resources={"requests":{"cpu":"100m","memory":"128Mi"}}',
    )
    config = config_of(rendered, tmp_path)
    assert config == PolicyConfig(
        "topology-aware", frozenset({0, 32}), {"reservedMemory": 2 * 1024**3}, False
    )
    pod = one(rendered, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"node-role.example.com/cpu": "true"}
    assert pod["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "cpu", "effect": "NoSchedule"}
    ]
    spec = container(rendered)
    # Helm merges maps: the default limits stay (resources.limits=null drops them).
    assert spec["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"memory": "256Mi"},
    }
    assert spec["imagePullPolicy"] == "Always"
    settings = settings_of(rendered)
    assert (settings.log_level, settings.log_format) == ("debug", "text")


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_of_nodedra_renders(tools: Tools, tmp_path: Path, policy: str) -> None:
    rendered = tools.template("nodedra", "--set", f"policy={policy}")
    assert config_of(rendered, tmp_path).policy == policy


@pytest.mark.parametrize("mode", PINNING_MODES)
def test_every_pinning_mode_of_nodedra_renders(tools: Tools, mode: str) -> None:
    rendered = tools.template("nodedra", "--set", f"pinning={mode}")
    assert settings_of(rendered).pinning == mode
    # The default stays unset, so that default values render manifests/ exactly.
    assert ("NODEDRA_PINNING" in environment(rendered)) == (mode != Settings.pinning)


@pytest.mark.parametrize("allowed", [False, True])
def test_whole_numa_node_devices_are_allowed_only_when_asked(
    tools: Tools, *, allowed: bool
) -> None:
    rendered = tools.template("nodedra", "--set", f"allowWholeNUMANodeDevices={allowed}")
    assert settings_of(rendered).allow_whole_numa_node_devices is allowed
    # The default stays unset, so that default values render manifests/ exactly.
    assert ("NODEDRA_ALLOW_WHOLE_NUMA_NODE_DEVICES" in environment(rendered)) is allowed


def test_the_kubelet_s_files_are_mounted_alone_where_nodedra_reads_them(tools: Tools) -> None:
    """Each one file, read-only, never created; the state file below kubeletDir, the
    configuration file only when given."""
    rendered = tools.template(
        "nodedra",
        "--set",
        "kubeletDir=/srv/kubelet",
        "--set",
        "kubelet.config=/srv/kubelet/config.yaml",
    )
    settings = settings_of(rendered)
    assert settings.kubelet_cpu_manager_state == Path("/srv/kubelet/cpu_manager_state")
    assert settings.kubelet_config == Path("/srv/kubelet/config.yaml")
    mounts = {m["name"]: m for m in container(rendered)["volumeMounts"]}
    (daemonset,) = [r.obj for r in rendered if r.obj["kind"] == "DaemonSet"]
    volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    for name, path in (
        ("kubelet-cpu-manager-state", "/srv/kubelet/cpu_manager_state"),
        ("kubelet-config", "/srv/kubelet/config.yaml"),
    ):
        assert (mounts[name]["mountPath"], mounts[name]["readOnly"]) == (path, True)
        assert volumes[name]["hostPath"] == {"path": path, "type": "File"}
    default = tools.template("nodedra")
    assert "kubelet-config" not in {m["name"] for m in container(default)["volumeMounts"]}
    assert "NODEDRA_KUBELET_CONFIG" not in environment(default)


@pytest.mark.parametrize(
    ("value", "annotations"),
    [
        ("", None),
        ("tolerate-nri.example.com", {"tolerate-nri.example.com": "true"}),
    ],
    ids=["none", "another-key"],
)
def test_the_tolerate_missing_plugins_annotation_follows_its_value(
    tools: Tools, value: str, annotations: dict[str, str] | None
) -> None:
    """The key is whatever the node's validator was told (its
    tolerate_missing_plugins_annotation); the default is the one manifests/ carries
    (test_default_values_render_the_kustomize_manifests)."""
    rendered = tools.template(
        "nodedra", "--set-string", f"tolerateMissingNRIPluginsAnnotation={value}"
    )
    metadata = one(rendered, "DaemonSet")["spec"]["template"]["metadata"]
    assert metadata.get("annotations") == annotations


#: Values the chart refuses, and what it says.
BAD_VALUES = [
    ("policy=dynamic", 'policy: "dynamic" is not one of topology-aware, static'),
    ("pinning=always", 'pinning: "always" is not one of required, best-effort, off'),
    ("logFormat=xml", 'logFormat: "xml" is not one of text, json'),
    ("nodeAllocatable=maybe", 'nodeAllocatable: "maybe" is not true or false'),
    ("fullPhysicalCores=maybe", 'fullPhysicalCores: "maybe" is not true or false'),
    ("metrics.address=", 'metrics.address: "" is not host:port'),
    ("metrics.address=0.0.0.0:0", 'metrics.address: "0.0.0.0:0" is not host:port'),
    ("metrics.address=9464", 'metrics.address: "9464" is not host:port'),
]


@pytest.mark.parametrize(("value", "message"), BAD_VALUES, ids=[v for v, _ in BAD_VALUES])
def test_bad_values_are_refused(tools: Tools, value: str, message: str) -> None:
    result = tools.run([tools.helm, "template", RELEASE, CHART, "--set", value])
    assert result.returncode != 0, result.stdout
    assert message in result.stderr


def strings_of(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings_of(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings_of(item)


def check_namespace(rendered: Sequence[Rendered], namespace: str) -> None:
    """Every namespaced object, the binding's subject and the policy's match condition name
    ``namespace``, and nothing names nodedra's namespace when it is another."""
    for item in rendered:
        kind, metadata = item.obj["kind"], item.obj["metadata"]
        assert kind in CLUSTER_SCOPED_KINDS | NAMESPACED, f"{item.key}: add {kind} to the scopes"
        if kind in NAMESPACED:
            assert metadata.get("namespace") == namespace, item.key
        else:
            assert "namespace" not in metadata, item.key
    binding = one(rendered, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "nodedra", "namespace": namespace}
    ]
    policy = one(rendered, "ValidatingAdmissionPolicy")
    assert policy["spec"]["matchConditions"] == [
        {
            "name": "is-nodedra",
            "expression": (
                f"request.userInfo.username == 'system:serviceaccount:{namespace}:nodedra'"
            ),
        }
    ]
    if namespace != "nodedra":
        for item in rendered:
            for text in strings_of(item.obj):
                assert "serviceaccount:nodedra:" not in text, f"{item.key}: {text}"


def test_release_namespace_is_everywhere(tools: Tools) -> None:
    kept = tools.template("other", "--set", "namespace.create=false")
    assert objects_of(kept, "Namespace") == []
    check_namespace(kept, "other")

    created = tools.template("other")
    namespace = one(created, "Namespace")
    assert namespace["metadata"] == {
        "name": "other",
        "labels": {
            "app.kubernetes.io/name": "nodedra",
            "pod-security.kubernetes.io/enforce": "privileged",
        },
    }
    check_namespace(created, "other")
    # Apart from the Namespace, namespace.create changes nothing.
    assert [i.obj for i in created if i.obj["kind"] != "Namespace"] == [i.obj for i in kept]


# -- 4. the API server accepts it -----------------------------------------------------------------


def dry_run(tools: Tools, cp: ControlPlane, manifest: str) -> list[Object]:
    """``kubectl apply --dry-run=server`` as cluster admin: the objects the server would store."""
    output = tools.check(
        [
            tools.kubectl,
            "--kubeconfig",
            cp.admin_kubeconfig,
            "apply",
            "--dry-run=server",
            "--validate=strict",
            "--output=json",
            "--filename=-",
        ],
        stdin=manifest,
    )
    result = json.loads(output)
    items: list[Object] = result["items"] if result.get("kind") == "List" else [result]
    return items


def check_accepted(tools: Tools, cp: ControlPlane, namespace: str, *options: str) -> None:
    text = tools.template_text(namespace, *options)
    rendered = split_documents(text)
    # The Namespace first, for real (as install_nodedra applies it), so that a dry run of the
    # namespaced objects finds it.
    apply_objects(cp, objects_of(rendered, "Namespace"))
    accepted = dry_run(tools, cp, text)
    assert sorted(object_key(obj) for obj in accepted) == sorted(i.key for i in rendered)
    daemonset = next(obj for obj in accepted if obj["kind"] == "DaemonSet")
    assert daemonset["metadata"]["namespace"] == namespace
    policy = next(obj for obj in accepted if obj["kind"] == "ValidatingAdmissionPolicy")
    assert f"system:serviceaccount:{namespace}:nodedra" in json.dumps(policy)


def test_default_rendering_is_accepted_by_the_api_server(
    tools: Tools, control_plane: ControlPlane
) -> None:
    check_accepted(tools, control_plane, "nodedra")


def test_custom_rendering_is_accepted_by_the_api_server(
    tools: Tools, control_plane: ControlPlane, namespace: str
) -> None:
    check_accepted(
        tools, control_plane, namespace, "--set", CUSTOM_SET, "--set", "namespace.create=false"
    )
