"""The deployment manifests in manifests/: well-formed, complete, least-privilege, consistent.

These tests read the YAML only; applying it to a real API server is the integration tests' job.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from nodedra import __version__, cgroupcheck
from nodedra.dra import driver_name
from nodedra.nri import DEFAULT_SOCKET
from nodedra.nri.plugin import PLUGIN_NAME
from nodedra.policy import POLICIES, PolicyConfig, load_config, parse_config
from nodedra.settings import FLAGS, KUBELET_STATE_FILE
from tests.pages import code_blocks, section
from tests.peers.busybox import APPLETS as BUSYBOX_APPLETS
from tests.peers.busybox import BUSYBOX_IMAGE
from tests.peers.node import TOLERATE_MISSING_PLUGINS_ANNOTATION
from tests.peers.nodedra_node import CLUSTER_SCOPED_KINDS

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
SAMPLES = MANIFESTS / "samples"
CLEANUP = MANIFESTS / "cleanup"
PINNING = ROOT / "docs" / "pinning.md"
NAMESPACE = "nodedra"
SAMPLES_NAMESPACE = "nodedra-demo"
SERVICE_ACCOUNT_USER = f"system:serviceaccount:{NAMESPACE}:nodedra"

#: Exactly what nodedra does with the API: (apiGroup, resource) -> verbs.
EXPECTED_RULES: dict[tuple[str, str], set[str]] = {
    ("resource.k8s.io", "resourceslices"): {"get", "list", "watch", "create", "update", "delete"},
    ("resource.k8s.io", "resourceclaims"): {"get", "list", "watch"},
    ("resource.k8s.io", "resourceclaims/status"): {"patch"},
    ("resource.k8s.io", "resourceclaims/driver"): {"associated-node:patch"},
    ("", "nodes"): {"get"},
    ("events.k8s.io", "events"): {"create"},
}

#: Environment variables the DaemonSet must set, with their values (None: from fieldRef).
EXPECTED_ENV: dict[str, str | None] = {
    "NODE_NAME": None,
    "POD_UID": None,
    "NODEDRA_STATE_DIR": "/var/lib/nodedra",
    "NODEDRA_CONFIG": "/etc/nodedra/config.yaml",
    "NODEDRA_LOG_FORMAT": "json",
    "NODEDRA_METRICS_ADDRESS": "0.0.0.0:9464",
    "NODEDRA_HEALTH_ADDRESS": "0.0.0.0:8080",
    "NODEDRA_STATUS_ADDRESS": "127.0.0.1:9465",
    "NODEDRA_CGROUP_ROOT": "/host/sys/fs/cgroup",
}

#: Host directories the DaemonSet needs.
EXPECTED_HOST_PATHS = {
    "/var/lib/kubelet/plugins_registry",
    "/var/lib/kubelet/plugins",
    "/var/run/cdi",
    "/var/run/nri",
    "/var/lib/nodedra",
    "/var/lib/kubelet/cpu_manager_state",
}


def _yaml_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml"))


def _documents(path: Path) -> list[Any]:
    with path.open() as stream:
        return [doc for doc in yaml.safe_load_all(stream) if doc is not None]


def _resources(directory: Path) -> list[Path]:
    """The files a kustomization.yaml lists, in its order."""
    (kustomization,) = _documents(directory / "kustomization.yaml")
    return [directory / name for name in kustomization["resources"]]


def _objects(directory: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in _resources(directory):
        for doc in _documents(path):
            yield path, doc


def _main_objects() -> list[dict[str, Any]]:
    return [obj for _, obj in _objects(MANIFESTS)]


def _sample_objects() -> list[dict[str, Any]]:
    return [obj for _, obj in _objects(SAMPLES)]


def _only(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _daemonset() -> dict[str, Any]:
    return _only(_main_objects(), "DaemonSet", "nodedra")


def _container() -> dict[str, Any]:
    (container,) = _daemonset()["spec"]["template"]["spec"]["containers"]
    return cast(dict[str, Any], container)


# -- files --------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    sorted(MANIFESTS.rglob("*.yaml")),
    ids=lambda p: str(p.relative_to(MANIFESTS)),
)
def test_every_file_parses(path: Path) -> None:
    assert _documents(path), f"{path} holds no object"


@pytest.mark.parametrize(
    "directory", [MANIFESTS, SAMPLES, CLEANUP], ids=["main", "samples", "cleanup"]
)
def test_kustomization_lists_exactly_the_files_present(directory: Path) -> None:
    present = {p.name for p in _yaml_files(directory)} - {"kustomization.yaml"}
    listed = [p.name for p in _resources(directory)]
    assert len(listed) == len(set(listed)), f"listed twice: {listed}"
    assert set(listed) == present


def test_samples_are_not_part_of_the_main_kustomization() -> None:
    (kustomization,) = _documents(MANIFESTS / "kustomization.yaml")
    assert not any("samples" in entry for entry in kustomization["resources"])
    assert not any("cleanup" in entry for entry in kustomization["resources"])


@pytest.mark.parametrize(
    ("directory", "namespace"),
    [(MANIFESTS, NAMESPACE), (SAMPLES, SAMPLES_NAMESPACE), (CLEANUP, NAMESPACE)],
    ids=["main", "samples", "cleanup"],
)
def test_objects_are_complete_and_in_their_namespace(directory: Path, namespace: str) -> None:
    objects = list(_objects(directory))
    assert objects
    for path, obj in objects:
        where = f"{path.name}: {obj.get('kind')} {obj.get('metadata', {}).get('name')}"
        assert obj.get("apiVersion"), where
        assert obj.get("kind"), where
        assert obj.get("metadata", {}).get("name"), where
        if obj["kind"] in CLUSTER_SCOPED_KINDS:
            assert "namespace" not in obj["metadata"], where
        else:
            assert obj["metadata"].get("namespace") == namespace, where
    namespaces = [o["metadata"]["name"] for _, o in objects if o["kind"] == "Namespace"]
    # The cleanup runs in nodedra's namespace, before it is deleted.
    assert namespaces == ([] if directory == CLEANUP else [namespace])


def test_api_versions() -> None:
    expected = {
        "Namespace": "v1",
        "ServiceAccount": "v1",
        "ConfigMap": "v1",
        "ClusterRole": "rbac.authorization.k8s.io/v1",
        "ClusterRoleBinding": "rbac.authorization.k8s.io/v1",
        "ValidatingAdmissionPolicy": "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicyBinding": "admissionregistration.k8s.io/v1",
        "DaemonSet": "apps/v1",
        "DeviceClass": "resource.k8s.io/v1",
        "ResourceClaimTemplate": "resource.k8s.io/v1",
        "Pod": "v1",
    }
    for obj in _main_objects() + _sample_objects():
        assert obj["apiVersion"] == expected[obj["kind"]], obj["kind"]


# -- RBAC ---------------------------------------------------------------------


def test_cluster_role_grants_exactly_what_nodedra_does() -> None:
    role = _only(_main_objects(), "ClusterRole", "nodedra")
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs", "resourceNames"}, rule
        if "resourceNames" in rule:  # only the drivers' synthetic status resource is named
            assert rule["resources"] == ["resourceclaims/driver"], rule
            assert sorted(rule["resourceNames"]) == sorted(map(driver_name, POLICIES)), rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    assert granted == EXPECTED_RULES


def test_cluster_role_has_no_wildcards_or_dangerous_rights() -> None:
    role = _only(_main_objects(), "ClusterRole", "nodedra")
    assert "aggregationRule" not in role
    for rule in role["rules"]:
        values = [*rule["apiGroups"], *rule["resources"], *rule["verbs"]]
        assert not any("*" in value for value in values), rule
        assert not {"secrets", "pods", "pods/exec"} & set(rule["resources"]), rule
        assert not any("exec" in resource for resource in rule["resources"]), rule
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), rule


def test_cluster_role_binding_names_the_service_account() -> None:
    objects = _main_objects()
    binding = _only(objects, "ClusterRoleBinding", "nodedra")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "nodedra",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "nodedra", "namespace": NAMESPACE}
    ]
    _only(objects, "ServiceAccount", "nodedra")


# -- admission policy ---------------------------------------------------------


def test_admission_policy_limits_nodedra_to_its_own_node() -> None:
    objects = _main_objects()
    policy = _only(objects, "ValidatingAdmissionPolicy")
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == ["resource.k8s.io"]
    assert rule["resources"] == ["resourceslices"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    (condition,) = spec["matchConditions"]
    assert SERVICE_ACCOUNT_USER in condition["expression"]
    expressions = " ".join(v["expression"] for v in spec.get("variables", []))
    expressions += " ".join(v["expression"] for v in spec["validations"])
    assert "request.userInfo.extra[?'authentication.kubernetes.io/node-name']" in expressions
    assert "object" in expressions
    assert "oldObject" in expressions
    assert "nodeName" in expressions
    for validation in spec["validations"]:
        assert validation.get("message") or validation.get("messageExpression"), validation

    binding = _only(objects, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]


# -- DaemonSet ----------------------------------------------------------------


def test_daemonset_env_uses_only_known_settings() -> None:
    # NODEDRA_CGROUP_ROOT is read by the commands run with kubectl exec, not by nodedra run.
    known = {flag.env for flag in FLAGS} | {"NODE_NAME", "POD_UID", cgroupcheck.ROOT_VARIABLE}
    env = _container()["env"]
    names = [var["name"] for var in env]
    assert len(names) == len(set(names)), names
    assert set(names) <= known, sorted(set(names) - known)
    values = {var["name"]: var.get("value") for var in env}
    assert values.items() >= EXPECTED_ENV.items()


def test_daemonset_gets_node_name_and_pod_uid_from_the_downward_api() -> None:
    env = {var["name"]: var for var in _container()["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["POD_UID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}


def test_daemonset_rolls_with_surge() -> None:
    strategy = _daemonset()["spec"]["updateStrategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


def test_daemonset_mounts_host_paths_at_the_same_path() -> None:
    pod = _daemonset()["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in _container()["volumeMounts"]}
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host_paths.pop("cgroup") == "/sys/fs/cgroup"  # below: not over the pod's own
    assert set(host_paths.values()) == EXPECTED_HOST_PATHS
    for name, path in host_paths.items():
        assert mounts.get(name) == path, f"hostPath volume {name} ({path}) mounted at {mounts}"
    volumes = {v["name"] for v in pod["volumes"]}
    assert set(mounts) <= volumes


def test_daemonset_mounts_the_host_s_cgroups_read_only_where_nodedra_status_reads_them() -> None:
    """The pod's own /sys/fs/cgroup shows its own cgroup only: the host's is mounted beside
    it, read-only, and NODEDRA_CGROUP_ROOT names it for `kubectl exec ... nodedra status`."""
    (mount,) = [m for m in _container()["volumeMounts"] if m["name"] == "cgroup"]
    assert mount["readOnly"] is True
    env = {var["name"]: var.get("value") for var in _container()["env"]}
    assert env["NODEDRA_CGROUP_ROOT"] == mount["mountPath"] != "/sys/fs/cgroup"


def test_daemonset_mounts_one_file_of_the_kubelet_s_read_only_where_nodedra_reads_it() -> None:
    """Never the kubelet's directory (the pods' secrets), never a type that creates the file
    (a kubelet refuses to start on an empty state file)."""
    pod = _daemonset()["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "kubelet-cpu-manager-state"]
    assert volume["hostPath"] == {"path": KUBELET_STATE_FILE, "type": "File"}
    (mount,) = [m for m in _container()["volumeMounts"] if m["name"] == volume["name"]]
    assert (mount["mountPath"], mount["readOnly"]) == (KUBELET_STATE_FILE, True)
    assert not any(
        v["hostPath"]["path"] in ("/var/lib/kubelet", "/var/lib/kubelet/")
        for v in pod["volumes"]
        if "hostPath" in v
    )


def test_daemonset_mounts_the_nri_socket_nodedra_connects_to() -> None:
    nri = {m["name"]: m["mountPath"] for m in _container()["volumeMounts"]}["nri"]
    assert Path(nri) == DEFAULT_SOCKET.parent


def test_daemonset_mounts_the_config_where_nodedra_reads_it() -> None:
    pod = _daemonset()["spec"]["template"]["spec"]
    (config,) = [v for v in pod["volumes"] if "configMap" in v]
    assert config["configMap"]["name"] == "nodedra-config"
    (mount,) = [m for m in _container()["volumeMounts"] if m["name"] == config["name"]]
    assert "subPath" not in mount  # a subPath mount never sees ConfigMap updates
    env = {var["name"]: var.get("value") for var in _container()["env"]}
    assert env["NODEDRA_CONFIG"] == mount["mountPath"] + "/config.yaml"


def test_daemonset_pod_settings() -> None:
    daemonset = _daemonset()
    pod = daemonset["spec"]["template"]["spec"]
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pod["serviceAccountName"] == "nodedra"
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["terminationGracePeriodSeconds"] == 60
    assert {"operator": "Exists"} in pod["tolerations"]
    assert not pod.get("hostNetwork")

    container = _container()
    assert container["image"] == f"nodedra:{__version__}"
    assert container["command"] == ["nodedra", "run"]
    assert container["resources"] == {
        "requests": {"cpu": "50m", "memory": "96Mi"},
        "limits": {"memory": "256Mi"},
    }
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 9464, "health": 8080}
    probe = container["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz"
    assert probe["port"] in ("health", 8080)
    # A slow start (a loaded node) is the startup probe's: liveness waits for its success.
    startup = container["startupProbe"]
    assert startup["httpGet"] == probe
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    assert "initialDelaySeconds" not in container["livenessProbe"]
    ready = container["readinessProbe"]["httpGet"]
    assert ready["path"] == "/readyz"
    assert ready["port"] in ("metrics", 9464)


def _pinning_page_validators() -> list[dict[str, Any]]:
    """The configurations docs/pinning.md ("Holding containers while nodedra is down") gives
    for requiring nodedra, one per runtime (its toml blocks): containerd's default validator
    table, and CRI-O's with its keys as containerd's names them."""
    text = section(PINNING, "Holding containers while nodedra is down")
    containerd, crio = (tomllib.loads(b) for b in code_blocks(text, "toml"))
    crio_table = crio["crio"]["nri"]["default_validator"]
    return [
        containerd["plugins"]["io.containerd.nri.v1.nri"]["default_validator"],
        {
            "enable": crio_table["nri_enable_default_validator"],
            "required_plugins": crio_table["nri_validator_required_plugins"],
            "tolerate_missing_plugins_annotation": crio_table[
                "nri_validator_tolerate_missing_plugins_annotation"
            ],
        },
    ]


def test_pinning_page_s_validator_requires_nodedra_and_lets_the_daemonset_start() -> None:
    """Where containerd requires nodedra, nodedra's own pod must be created without it: the
    DaemonSet carries the annotation the pinning page's configuration names, with a value the
    validator reads as true (Go's strconv.ParseBool), on the pod (all of its containers)."""
    for validator in _pinning_page_validators():
        assert validator["enable"] is True
        # The validator matches a plugin by its name or by <index>-<name>: the name holds
        # whatever index nodedra is given.
        assert validator["required_plugins"] == [PLUGIN_NAME]
        key = validator["tolerate_missing_plugins_annotation"]
        annotations = _daemonset()["spec"]["template"]["metadata"].get("annotations") or {}
        assert annotations.get(key) == "true", annotations
        # The real node's test (test_required_plugin.py) runs with this configuration.
        assert key == TOLERATE_MISSING_PLUGINS_ANNOTATION


def test_daemonset_security_context() -> None:
    security = _container()["securityContext"]
    assert security["runAsUser"] == 0
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert not security.get("privileged")


# -- configuration and classes ------------------------------------------------


def test_config_map_holds_a_valid_configuration(tmp_path: Path) -> None:
    config_map = _only(_main_objects(), "ConfigMap", "nodedra-config")
    text = config_map["data"]["config.yaml"]
    parsed = parse_config(yaml.safe_load(text), "config.yaml")
    assert parsed == PolicyConfig(policy="topology-aware", reserved_cpus=frozenset({0}))
    (tmp_path / "config.yaml").write_text(text)
    assert load_config(tmp_path / "config.yaml") == parsed


def test_device_classes_select_the_drivers() -> None:
    """A class per driver; the topology-aware one leaves out devices of isolated CPUs only,
    which a class of their own selects (what each selects is shown through the real
    scheduler: tests/integration/test_isolated_cpus.py)."""
    classes = [o for o in _main_objects() if o["kind"] == "DeviceClass"]
    by_name = {c["metadata"]["name"]: c for c in classes}
    topology_aware, static = driver_name("topology-aware"), driver_name("static")
    isolated = "topology-aware-isolated.nri.io"
    assert sorted(by_name) == sorted([topology_aware, static, isolated])
    expressions = {
        name: " ".join(selector["cel"]["expression"] for selector in c["spec"]["selectors"])
        for name, c in by_name.items()
    }
    assert expressions[static] == f'device.driver == "{static}"'
    for name in (topology_aware, isolated):
        assert expressions[name].startswith(f'device.driver == "{topology_aware}" && ')
    assert f'!("isolated" in device.attributes["{topology_aware}"]' in expressions[topology_aware]


# -- samples ------------------------------------------------------------------


def _pod_and_template(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    objects = _sample_objects()
    pod = _only(objects, "Pod", name)
    (pod_claim,) = pod["spec"]["resourceClaims"]
    template = _only(objects, "ResourceClaimTemplate", pod_claim["resourceClaimTemplateName"])
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["claims"] == [{"name": pod_claim["name"]}]
    # The image the test node is given for them (tests.peers.busybox), as containerd names it.
    assert "docker.io/library/" + container["image"] == BUSYBOX_IMAGE
    # Its variables, and the device metadata file of its claim's one request, which the
    # busybox image can print (its applets).
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    metadata = (
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/"
        f"{pod_claim['name']}/{request['name']}/{request['exactly']['deviceClassName']}"
        "-metadata.json"
    )
    assert container["command"] == ["sh", "-c", f"env | grep ^DRA_; cat {metadata}; sleep 3600"]
    assert {"sh", "env", "grep", "cat", "sleep"} <= set(BUSYBOX_APPLETS)
    return pod, template


def test_sample_topology_aware_asks_for_capacity() -> None:
    _, template = _pod_and_template("numa-cpus")
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    exactly = request["exactly"]
    assert exactly["deviceClassName"] == driver_name("topology-aware")
    assert exactly["capacity"] == {"requests": {"cpu": "1", "memory": "256Mi"}}


def test_sample_static_asks_for_two_cpus_on_one_numa_node() -> None:
    _, template = _pod_and_template("static-cpus")
    devices = template["spec"]["spec"]["devices"]
    (request,) = devices["requests"]
    assert request["exactly"]["deviceClassName"] == driver_name("static")
    assert request["exactly"]["count"] == 2
    assert devices["constraints"] == [
        {"requests": [request["name"]], "matchAttribute": "resource.kubernetes.io/numaNode"}
    ]


# -- the cleanup DaemonSet (docs/deploying.md, "Uninstalling") ---------------------------------


def _host_paths(pod_spec: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """Mount path -> host path of a container's hostPath volumes."""
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod_spec["volumes"] if "hostPath" in v}
    mounts = container["volumeMounts"]
    return {m["mountPath"]: volumes[m["name"]] for m in mounts if m["name"] in volumes}


def test_cleanup_daemonset_cleans_where_nodedra_writes() -> None:
    """Its `nodedra cleanup` runs with nodedra's image and sees every host path nodedra
    writes to, at the paths nodedra uses (the state directory through its parent, so that
    the directory itself can go); it needs no API access."""
    (cleanup,) = [obj for _, obj in _objects(CLEANUP)]
    spec = cleanup["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    assert init["image"] == _container()["image"]
    assert init["command"][:2] == ["nodedra", "cleanup"]
    seen = _host_paths(spec, init)
    state_flag = init["command"][init["command"].index("--state-dir") + 1]
    (state_mount,) = [m for m in seen if state_flag.startswith(m + "/")]
    state_on_host = seen[state_mount] + state_flag.removeprefix(state_mount)
    assert state_on_host == EXPECTED_ENV["NODEDRA_STATE_DIR"]
    # Not written: the runtime's socket, and the kubelet's state file (read only).
    written = EXPECTED_HOST_PATHS - {"/var/run/nri", state_on_host, KUBELET_STATE_FILE}
    assert written <= {host for mount, host in seen.items() if mount == host}
    assert spec["automountServiceAccountToken"] is False
    assert spec["tolerations"] == _daemonset()["spec"]["template"]["spec"]["tolerations"]


def test_cleanup_pod_is_not_let_past_a_runtime_that_requires_nodedra() -> None:
    """nodedra's own pod tolerates a missing nodedra; the cleanup's must not, so that on a
    node whose runtime still requires nodedra it is refused instead of cleaning up."""
    (cleanup,) = [obj for _, obj in _objects(CLEANUP)]
    annotations = cleanup["spec"]["template"]["metadata"].get("annotations") or {}
    assert TOLERATE_MISSING_PLUGINS_ANNOTATION not in annotations
    nodedra = _daemonset()["spec"]["template"]["metadata"]["annotations"]
    assert TOLERATE_MISSING_PLUGINS_ANNOTATION in nodedra
