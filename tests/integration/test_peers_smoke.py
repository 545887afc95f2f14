"""Smoke tests of the real Kubernetes peers, with the Go reference driver.

They prove, without nodedra, that the control plane serves DRA as nodedra
needs it, that a DRA kubelet plugin registers through the kubelet's own
plugin manager, and that a pod's claim goes the whole way: template -> claim
(controller-manager) -> allocation and binding (scheduler) -> prepare and
unprepare through the kubelet's DRA manager -> CDI spec on disk.
"""

from __future__ import annotations

import json
import os
import re
import socket
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import (
    ApiClient,
    AuthenticationV1Api,
    Configuration,
    CoreV1Api,
    ResourceV1Api,
    V1DeviceClass,
    V1Pod,
    V1ResourceClaimTemplate,
    V1ResourceSlice,
    V1SelfSubjectReview,
)
from kubernetes.client.exceptions import ApiException

from tests.conftest import GoDriverFactory, KubeletFactory
from tests.peers.build import PeerBinaries
from tests.peers.cluster import (
    get_claim,
    get_pod,
    pod_claim_name,
    poll,
    resource_slices,
    wait_for_slices,
    wait_pod_scheduled,
)
from tests.peers.controlplane import ControlPlane
from tests.peers.ports import LOOPBACK
from tests.peers.profile import ClusterProfile

DRA_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


def _raw(response: Any) -> Any:
    """Decode a `_preload_content=False` response: the raw API JSON, with
    every field the server sent (the generated models drop unknown ones)."""
    return json.loads(response.data)


def test_control_plane_serves_resource_v1_with_dra_gates(
    control_plane: ControlPlane, admin_api: ApiClient, cluster_profile: ClusterProfile
) -> None:
    resource = ResourceV1Api(admin_api)
    driver = f"smoke-{uuid.uuid4().hex[:8]}.nodedra.test"
    resource.create_resource_slice(
        V1ResourceSlice.model_validate(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"generateName": "smoke-"},
                "spec": {
                    "driver": driver,
                    "nodeName": "smoke-node",
                    "pool": {"name": "smoke-node", "generation": 1, "resourceSliceCount": 1},
                    "devices": [
                        {
                            "name": "numa0",
                            "attributes": {"resource.kubernetes.io/numaNode": {"int": 0}},
                            "capacity": {
                                "cpu": {
                                    "value": "4",
                                    "requestPolicy": {"default": "1", "validRange": {"min": "1"}},
                                }
                            },
                            # Kept only when DRAConsumableCapacity is on.
                            "allowMultipleAllocations": True,
                        }
                    ],
                },
            }
        )
    )

    listed = _raw(
        resource.list_resource_slice(field_selector=f"spec.driver={driver}", _preload_content=False)
    )
    assert [item["spec"]["nodeName"] for item in listed["items"]] == ["smoke-node"]
    (device,) = listed["items"][0]["spec"]["devices"]
    assert device["name"] == "numa0"
    assert device["attributes"] == {"resource.kubernetes.io/numaNode": {"int": 0}}
    if cluster_profile.on("DRAConsumableCapacity"):
        assert device["allowMultipleAllocations"] is True
        assert device["capacity"]["cpu"]["requestPolicy"]["default"] == "1"
    else:  # dropped
        assert "allowMultipleAllocations" not in device
        assert device["capacity"]["cpu"] == {"value": "4"}

    # The gates we set are what the API server runs with.
    text = control_plane.get_text("/metrics")
    for gate, on in control_plane.feature_gates.items():
        assert re.search(
            rf'^kubernetes_feature_enabled{{name="{gate}",stage="[A-Z]*"}} {int(on)}$',
            text,
            re.MULTILINE,
        ), gate


def test_go_driver_registers_through_kubelet_plugin_manager(
    control_plane: ControlPlane,
    ready_node: str,
    kubelet_factory: KubeletFactory,
    go_driver_factory: GoDriverFactory,
) -> None:
    kubelet = kubelet_factory(ready_node)
    # The kubelet wipes the node's slices once it sees its Node; after that
    # the driver's slices stay.
    kubelet.wait_slice_wipe("")
    driver = go_driver_factory(kubelet)

    plugin = kubelet.wait_registered(driver.driver_name)
    assert plugin.endpoint == str(driver.endpoint)
    assert plugin.versions == DRA_SERVICES
    assert plugin.chosen_service == "v1.DRAPlugin"
    assert kubelet.registered_plugins() == [plugin]

    devices = wait_for_slices(control_plane, ready_node, driver.driver_name, devices=4)
    assert sorted(d["name"] for d in devices) == [
        "dev-0",
        "dev-1",
        "dev-2",
        "dev-3",
    ]
    slices = resource_slices(control_plane, ready_node, driver.driver_name)
    assert {s["spec"]["pool"]["name"] for s in slices} == {ready_node}

    # Stopping the driver removes its registration socket; the plugin
    # watcher notices and the kubelet deregisters it.
    driver.stop()
    kubelet.wait_unregistered(driver.driver_name)
    assert kubelet.registered_plugins() == []
    assert list(kubelet.registry_dir.iterdir()) == []


def test_kubelet_falls_back_to_v1beta1_when_plugin_offers_only_that(
    ready_node: str, kubelet_factory: KubeletFactory, go_driver_factory: GoDriverFactory
) -> None:
    kubelet = kubelet_factory(ready_node)
    driver = go_driver_factory(kubelet, services=("v1beta1",))

    plugin = kubelet.wait_registered(driver.driver_name)
    assert plugin.versions == ("v1beta1.DRAPlugin",)
    assert plugin.chosen_service == "v1beta1.DRAPlugin"


def test_pod_claim_from_template_is_allocated_bound_prepared_and_unprepared(  # noqa: PLR0917
    workload_controllers: ControlPlane,
    admin_api: ApiClient,
    namespace: str,
    ready_node: str,
    kubelet_factory: KubeletFactory,
    go_driver_factory: GoDriverFactory,
) -> None:
    cp = workload_controllers
    kubelet = kubelet_factory(ready_node)
    kubelet.wait_slice_wipe("")
    driver = go_driver_factory(kubelet)
    kubelet.wait_registered(driver.driver_name)
    wait_for_slices(cp, ready_node, driver.driver_name, devices=4)

    resource = ResourceV1Api(admin_api)
    device_class = f"{driver.driver_name}-class"
    resource.create_device_class(
        V1DeviceClass.model_validate(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": device_class},
                "spec": {
                    "selectors": [
                        {"cel": {"expression": f'device.driver == "{driver.driver_name}"'}}
                    ]
                },
            }
        )
    )
    resource.create_namespaced_resource_claim_template(
        namespace,
        V1ResourceClaimTemplate.model_validate(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": "one-device"},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [
                                {"name": "dev", "exactly": {"deviceClassName": device_class}}
                            ]
                        }
                    }
                },
            }
        ),
    )
    CoreV1Api(admin_api).create_namespaced_pod(
        namespace,
        V1Pod.model_validate(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "consumer"},
                "spec": {
                    # Keeps the pod off nodes of other tests; the scheduler
                    # still does the allocation and the binding.
                    "nodeSelector": {"kubernetes.io/hostname": ready_node},
                    "automountServiceAccountToken": False,
                    "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": "one-device"}],
                    "containers": [
                        {
                            "name": "with-device",
                            "image": "registry.invalid/none:0",
                            "resources": {"claims": [{"name": "dev"}]},
                        },
                        {"name": "without-device", "image": "registry.invalid/none:0"},
                    ],
                },
            }
        ),
    )

    pod = wait_pod_scheduled(cp, namespace, "consumer")
    assert pod["spec"]["nodeName"] == ready_node
    claim_name = pod_claim_name(pod, "dev")
    assert claim_name is not None, pod.get("status")
    claim = get_claim(cp, namespace, claim_name)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"], result["request"]) == (
        driver.driver_name,
        ready_node,
        "dev",
    )
    assert result["device"] in {"dev-0", "dev-1", "dev-2", "dev-3"}
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [pod["metadata"]["uid"]]
    claim_uid = claim["metadata"]["uid"]

    containers = kubelet.prepare(namespace, "consumer")

    cdi_id = f"{driver.driver_name}/device=claim-{claim_uid}-0"
    assert containers == {"with-device": [cdi_id], "without-device": []}
    spec = yaml.safe_load(driver.spec_path(claim_uid).read_text())
    assert spec["kind"] == f"{driver.driver_name}/device"
    (cdi_device,) = spec["devices"]
    assert cdi_device["name"] == f"claim-{claim_uid}-0"
    env_name = f"GO_DRIVER_{claim_uid.replace('-', '_')}_0_DEVICE"
    assert cdi_device["containerEdits"]["env"] == [f"{env_name}={ready_node}/{result['device']}"]

    kubelet.unprepare(namespace, "consumer")
    assert not driver.spec_path(claim_uid).exists()
    # The pod and its claim are untouched by unprepare; only node-local
    # state went away.
    assert get_pod(cp, namespace, "consumer")["spec"]["nodeName"] == ready_node
    assert resource_slices(cp, ready_node, driver.driver_name)


def test_controller_manager_creates_claim_before_binding(
    workload_controllers: ControlPlane, namespace: str
) -> None:
    """Without any driver the claim stays unallocated and the pod unbound:
    the scheduler does not bind a pod whose claim it cannot allocate."""
    cp = workload_controllers
    cp.request(
        "POST",
        f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "nothing"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "dev", "exactly": {"deviceClassName": "no-such-class"}}
                        ]
                    }
                }
            },
        },
    )
    cp.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "waiting"},
            "spec": {
                "automountServiceAccountToken": False,
                "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": "nothing"}],
                "containers": [
                    {
                        "name": "c",
                        "image": "registry.invalid/none:0",
                        "resources": {"claims": [{"name": "dev"}]},
                    }
                ],
            },
        },
    )

    def unschedulable() -> dict[str, Any] | None:
        pod = get_pod(cp, namespace, "waiting")
        conditions = (pod.get("status") or {}).get("conditions") or []
        refused = any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conditions)
        return pod if refused and pod_claim_name(pod, "dev") else None

    pod = poll(
        unschedulable,
        60,
        lambda: f"pod {namespace}/waiting to be unschedulable with a generated claim",
    )
    assert not pod["spec"].get("nodeName")
    claim_name = pod_claim_name(pod, "dev")
    assert claim_name is not None
    assert "allocation" not in (get_claim(cp, namespace, claim_name).get("status") or {})


def test_service_account_kubeconfig_authenticates_as_the_account(
    control_plane: ControlPlane, namespace: str
) -> None:
    kubeconfig = json.loads(
        control_plane.service_account_kubeconfig(namespace, "tester").read_text()
    )
    (user,) = kubeconfig["users"]
    configuration = Configuration(
        host=control_plane.url,
        ssl_ca_cert=str(control_plane.ca.pair.cert),
        api_key={"BearerToken": user["user"]["token"]},
        api_key_prefix={"BearerToken": "Bearer"},
    )
    with ApiClient(configuration) as api:
        review = AuthenticationV1Api(api).create_self_subject_review(
            V1SelfSubjectReview.model_validate(
                {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
            )
        )
        assert review.status is not None
        assert review.status.user_info is not None
        assert review.status.user_info.username == f"system:serviceaccount:{namespace}:tester"
        # RBAC applies: a fresh account may not list pods.
        with pytest.raises(ApiException) as denied:
            CoreV1Api(api).list_namespaced_pod(namespace)
        assert denied.value.status == 403


def _port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_control_plane_stop_leaves_no_process_or_port(
    peer_binaries: PeerBinaries, tmp_path: Path
) -> None:
    cp = ControlPlane(peer_binaries, tmp_path / "cp")
    cp.start()
    cp.start_workload_controllers()
    pids = [proc.pid for proc in cp.processes.values()]
    ports = [_port_of(cp.url), _port_of(cp.etcd_url)]
    assert len(pids) == 4

    cp.stop()

    assert cp.processes == {}
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            # SO_REUSEADDR tolerates connections in TIME_WAIT, not a listener.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((LOOPBACK, port))
            s.listen()
    assert {p.name for p in tmp_path.joinpath("cp").glob("*.log")} == {
        "etcd.log",
        "kube-apiserver.log",
        "kube-scheduler.log",
        "kube-controller-manager.log",
    }
