"""What real platforms set in charts/nodedra, and the private-registry overlay of deploy/.

The values a platform needs beyond nodedra's own configuration: the image as a full reference
with pull secrets, the kubelet's root directory, the pods' annotations, labels, security
contexts and scheduling (node pools: test_helm_node_pools). Each is rendered with the real helm
(``helm template``) and must land where it should, bad ones must be refused with a message
naming the value. The overlay
deploy/overlays/private-registry is rendered with the real kubectl (``kubectl kustomize``).
helm and kubectl are the binaries built by tests.peers.build (the fixture ``tools`` of
test_helm_chart); no node runs here (test_deploy runs a node pool on a real node).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from _pytest.mark.structures import ParameterSet

from nodedra import __version__
from nodedra.dra.names import driver_name
from nodedra.settings import load_settings
from tests.integration import test_helm_chart
from tests.integration.test_helm_chart import (
    CHART,
    RELEASE,
    Object,
    Rendered,
    Tools,
    drift_report,
    environment,
    objects_of,
    one,
    split_documents,
)
from tests.peers.nodedra_node import ROOT

#: helm and kubectl (the fixture of test_helm_chart, shared).
tools = test_helm_chart.tools

OVERLAY = ROOT / "deploy" / "overlays" / "private-registry"
DIGEST = "sha256:" + "0123456789abcdef" * 4

#: Two pools with labels of their own, a node may have both (test_helm_node_pools).
POOLS: dict[str, Any] = {
    "nodePools": [
        {
            "name": "big",
            "nodeSelector": {"node.example.com/size": "big"},
            "reservedCPUs": "0-3",
            "options": {"reservedMemory": "4Gi"},
        },
        {
            "name": "static",
            "nodeSelector": {"node.example.com/policy": "static"},
            "policy": "static",
            "fullPhysicalCores": True,
        },
    ],
}


def render(tools: Tools, tmp_path: Path, values: Mapping[str, Any]) -> list[Rendered]:
    """``helm template`` with ``values`` as a values file (-f), as an admin writes them."""
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(dict(values)))
    return tools.template("nodedra", "-f", str(path))


def refused(tools: Tools, tmp_path: Path, values: Mapping[str, Any]) -> str:
    """helm's error for ``values``, which it must refuse."""
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(dict(values)))
    result = tools.run([tools.helm, "template", RELEASE, CHART, "-f", str(path)])
    assert result.returncode != 0, f"accepted: {values}\n{result.stdout[:2000]}"
    return result.stderr


def daemonsets(rendered: Sequence[Rendered]) -> dict[str, Object]:
    return {ds["metadata"]["name"]: ds for ds in objects_of(rendered, "DaemonSet")}


def pod_spec(daemonset: Object) -> Object:
    spec: Object = daemonset["spec"]["template"]["spec"]
    return spec


def the_container(daemonset: Object) -> Object:
    (container,) = pod_spec(daemonset)["containers"]
    result: Object = container
    return result


# -- the image ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("image", "reference"),
    [
        ({"registry": "registry.example.com"}, f"registry.example.com/nodedra:{__version__}"),
        (
            {"registry": "registry.example.com:5000/team/", "repository": "cpu/nodedra"},
            f"registry.example.com:5000/team/cpu/nodedra:{__version__}",
        ),
        ({"tag": "1.2.3"}, "nodedra:1.2.3"),
        (
            {"registry": "registry.example.com", "tag": "1.2.3", "digest": DIGEST},
            f"registry.example.com/nodedra@{DIGEST}",
        ),
    ],
    ids=["registry", "registry-with-path", "tag", "digest-wins"],
)
def test_image_is_a_full_reference(
    tools: Tools, tmp_path: Path, image: dict[str, str], reference: str
) -> None:
    rendered = render(tools, tmp_path, {"image": image})
    assert the_container(daemonsets(rendered)["nodedra"])["image"] == reference


def test_image_pull_secrets_take_names_or_references(tools: Tools, tmp_path: Path) -> None:
    rendered = render(tools, tmp_path, {"imagePullSecrets": ["regcred", {"name": "mirror"}]})
    spec = pod_spec(daemonsets(rendered)["nodedra"])
    assert spec["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror"}]
    assert "imagePullSecrets" not in pod_spec(daemonsets(tools.template("nodedra"))["nodedra"])


# -- the kubelet's root directory -----------------------------------------------------------------


def host_mounts(daemonset: Object) -> dict[str, str]:
    """hostPath -> where the container sees it, for every hostPath volume."""
    volumes = {
        v["name"]: v["hostPath"]["path"] for v in pod_spec(daemonset)["volumes"] if "hostPath" in v
    }
    mounts = {m["name"]: m["mountPath"] for m in the_container(daemonset)["volumeMounts"]}
    assert set(volumes) <= set(mounts), "a hostPath volume is not mounted"
    return {volumes[name]: mounts[name] for name in volumes}


def under(path: Path, mounts: Mapping[str, str]) -> bool:
    """``path`` (as the container sees it) is on a hostPath volume at the same path."""
    return any(host == inside and path.is_relative_to(inside) for host, inside in mounts.items())


@pytest.mark.parametrize("root", ["/var/lib/k0s/kubelet", "/var/lib/k0s/kubelet/"])
def test_kubelet_dir_moves_sockets_volumes_and_mounts_together(
    tools: Tools, tmp_path: Path, root: str
) -> None:
    """The kubelet is told the socket's path: nodedra's registry and plugin directories (its
    own settings, from the environment the chart gives it) must be on hostPath volumes of the
    kubelet's root, mounted at their host paths; for each pool's policy's driver too."""
    rendered = render(tools, tmp_path, {"kubeletDir": root, **POOLS})
    for name, daemonset in daemonsets(rendered).items():
        mounts = host_mounts(daemonset)
        assert not any(p.startswith("/var/lib/kubelet") for p in mounts), (name, mounts)
        settings = load_settings(environ=environment([Rendered(daemonset, "")]))
        policy = "static" if name == "nodedra-static" else "topology-aware"
        assert settings.registry_dir == Path("/var/lib/k0s/kubelet/plugins_registry")
        assert settings.plugin_dir == Path("/var/lib/k0s/kubelet/plugins") / driver_name(policy)
        assert under(settings.registry_dir, mounts), (name, mounts)
        assert under(settings.plugin_dir, mounts), (name, mounts)
    default = tools.template("nodedra")
    env = environment(default)
    assert "NODEDRA_REGISTRY_DIR" not in env
    assert "NODEDRA_PLUGIN_DIR" not in env
    assert "/var/lib/kubelet/plugins_registry" in host_mounts(one(default, "DaemonSet"))


# -- the pods -------------------------------------------------------------------------------------


def test_pod_metadata_security_and_scheduling_values(tools: Tools, tmp_path: Path) -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}
                        ]
                    }
                ]
            }
        }
    }
    rendered = render(
        tools,
        tmp_path,
        {
            "podAnnotations": {"example.com/team": "platform"},
            "podLabels": {"team": "platform"},
            "priorityClassName": "nodedra-critical",
            "podSecurityContext": {"seLinuxOptions": {"type": "spc_t"}},
            "securityContext": {"seLinuxOptions": {"type": "spc_t"}},
            "nodeSelector": {"kubernetes.io/arch": "amd64"},
            "affinity": affinity,
            "tolerations": [{"key": "dedicated", "operator": "Exists"}],
        },
    )
    daemonset = daemonsets(rendered)["nodedra"]
    template = daemonset["spec"]["template"]
    assert template["metadata"]["annotations"] == {
        "example.com/team": "platform",
        "tolerate-missing-nri-plugins.noderesource.dev": "true",
    }
    assert template["metadata"]["labels"] == {
        "app.kubernetes.io/name": "nodedra",
        "team": "platform",
    }
    assert daemonset["spec"]["selector"] == {"matchLabels": {"app.kubernetes.io/name": "nodedra"}}
    spec = pod_spec(daemonset)
    assert spec["priorityClassName"] == "nodedra-critical"
    # Helm merges maps: the defaults stay beside what was added.
    assert spec["securityContext"] == {
        "seccompProfile": {"type": "RuntimeDefault"},
        "seLinuxOptions": {"type": "spc_t"},
    }
    assert the_container(daemonset)["securityContext"] == {
        "runAsUser": 0,
        "runAsGroup": 0,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seLinuxOptions": {"type": "spc_t"},
    }
    assert spec["nodeSelector"] == {"kubernetes.io/arch": "amd64"}
    assert spec["affinity"] == affinity  # no pools: nothing added
    assert spec["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]


def test_default_pods_are_what_manifests_have(tools: Tools) -> None:
    """The new values' defaults are the manifests' (the drift test compares all of it; this
    names the fields)."""
    spec = pod_spec(one(tools.template("nodedra"), "DaemonSet"))
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert "affinity" not in spec
    assert "nodeSelector" not in spec
    assert spec["tolerations"] == [{"operator": "Exists"}]


# -- bad values -----------------------------------------------------------------------------------

#: Values the chart refuses, and what it says.
BAD_VALUES: list[tuple[str, dict[str, Any], str]] = [
    ("digest", {"image": {"digest": "abc"}}, 'image.digest: "abc" is not sha256:<64'),
    ("repository", {"image": {"repository": ""}}, "image.repository: is empty"),
    ("pull-secret-empty", {"imagePullSecrets": [""]}, 'imagePullSecrets[0]: "" is neither'),
    (
        "pull-secret-object",
        {"imagePullSecrets": ["a", {"secret": "b"}]},
        'imagePullSecrets[1]: {"secret":"b"} is neither',
    ),
    (
        "kubelet-dir",
        {"kubeletDir": "var/lib/kubelet"},
        'kubeletDir: "var/lib/kubelet" is not an absolute path',
    ),
    ("kubelet-dir-root", {"kubeletDir": "/"}, 'kubeletDir: "/" is not an absolute path'),
    (
        "pod-label",
        {"podLabels": {"app.kubernetes.io/name": "other"}},
        "podLabels: \"app.kubernetes.io/name\" is the DaemonSets' selector's label",
    ),
]


def bad_cases(table: Sequence[tuple[str, dict[str, Any], str]]) -> list[ParameterSet]:
    """A table of (id, values, the message helm must give) as pytest's parameters."""
    return [pytest.param(values, message, id=name) for name, values, message in table]


@pytest.mark.parametrize(("values", "message"), bad_cases(BAD_VALUES))
def test_bad_platform_values_are_refused(
    tools: Tools, tmp_path: Path, values: dict[str, Any], message: str
) -> None:
    assert message in refused(tools, tmp_path, values)


# -- the private-registry overlay ------------------------------------------------------------------


def test_private_registry_overlay_changes_only_the_image_and_its_secret(tools: Tools) -> None:
    """``kubectl kustomize deploy/overlays/private-registry``: the DaemonSet's pods pull
    nodedra's image from the registry with the Secret; every other field is manifests/'s."""
    overlay = split_documents(tools.check([tools.kubectl, "kustomize", OVERLAY]))
    manifests = tools.kustomize()
    daemonset = one(overlay, "DaemonSet")
    spec = pod_spec(daemonset)
    assert the_container(daemonset)["image"] == (
        f"registry.example.com/platform/nodedra:{__version__}"
    ), "the overlay's newTag must follow nodedra's version"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    # drift_report calls its first side "the chart": here it is the overlay.
    image = f"registry.example.com/platform/nodedra:{__version__}"
    assert drift_report(overlay, manifests) == [
        "DaemonSet nodedra/nodedra:",
        f'    spec.template.spec.containers[name=nodedra].image: chart "{image}", '
        f'manifests/ "nodedra:{__version__}"',
        '    spec.template.spec.imagePullSecrets: only in the chart: [{"name": "regcred"}]',
    ]
