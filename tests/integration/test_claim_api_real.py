"""KubeClusterAPI against the real API server, and the plugin's claim fetches through it.

Claims and their allocations are written as the admin, through a client other than the one
under test; the status subresource takes the allocation as the scheduler writes it.
"""

from __future__ import annotations

import json
import ssl
import urllib.request
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient, Configuration

from nodedra.dra import ClaimRef, KubeAPIError, KubeClusterAPI, Options, Plugin
from tests.peers.cluster import resource_slices
from tests.peers.controlplane import ControlPlane
from tests.peers.ports import LOOPBACK, free_port
from tests.peers.profile import ClusterProfile
from tests.unit.dra.fakes import FakeOwner, FakePolicy

RESOURCE = "/apis/resource.k8s.io/v1"
OTHER_DRIVER = "gpu.example.com"


@pytest.fixture
def api(admin_api: ApiClient) -> KubeClusterAPI:
    return KubeClusterAPI(admin_api)


@pytest.fixture
def driver() -> str:
    return f"c{uuid.uuid4().hex[:8]}.nri.io"


def claims_path(namespace: str, name: str = "") -> str:
    return f"{RESOURCE}/namespaces/{namespace}/resourceclaims" + (f"/{name}" if name else "")


def create_claim(cp: ControlPlane, namespace: str, name: str, driver: str) -> dict[str, Any]:
    """A claim for two CPUs of ``driver`` and a GPU of another driver, with opaque config."""
    claim: dict[str, Any] = cp.request(
        "POST",
        claims_path(namespace),
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "labels": {"app": "test"}},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "cpus", "exactly": {"deviceClassName": driver, "count": 2}},
                        {"name": "gpu", "exactly": {"deviceClassName": OTHER_DRIVER}},
                    ],
                    "config": [
                        {
                            "requests": ["cpus"],
                            "opaque": {"driver": driver, "parameters": {"pin": True}},
                        }
                    ],
                }
            },
        },
    )
    return claim


def allocation(driver: str, node: str = "node-a", *, consumed: bool = True) -> dict[str, Any]:
    """What the scheduler writes for the claim of create_claim (``consumed=False``: as the
    server keeps it without DRAConsumableCapacity)."""
    first: dict[str, Any] = {"request": "cpus", "driver": driver, "pool": node, "device": "cpu0"}
    if consumed:
        first["consumedCapacity"] = {"cpu": "2"}
    return {
        "devices": {
            "results": [
                first,
                {"request": "cpus", "driver": driver, "pool": node, "device": "cpu1"},
                {"request": "gpu", "driver": OTHER_DRIVER, "pool": node, "device": "gpu0"},
            ],
            "config": [
                {
                    "source": "FromClaim",
                    "requests": ["cpus"],
                    "opaque": {"driver": driver, "parameters": {"pin": True}},
                }
            ],
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        },
    }


def allocate(
    cp: ControlPlane, claim: Mapping[str, Any], alloc: Mapping[str, Any], *, go_json: bool = True
) -> dict[str, Any]:
    """Write ``alloc`` into the claim's status, as the scheduler does (an update of /status).

    The server keeps the opaque parameters byte for byte as they come. ``go_json``: send
    them as Go clients do (compact, keys sorted); otherwise as Python's json.dumps does.
    """
    body = {**claim, "status": {"allocation": alloc}}
    text = json.dumps(body, separators=(",", ":"), sort_keys=True) if go_json else json.dumps(body)
    meta = claim["metadata"]
    request = urllib.request.Request(
        cp.url + claims_path(meta["namespace"], meta["name"]) + "/status",
        data=text.encode(),
        method="PUT",
        headers={"Content-Type": "application/json", "Accept": "application/json"},
    )
    context = ssl.create_default_context(cafile=str(cp.ca.pair.cert))
    context.load_cert_chain(str(cp.admin.cert), str(cp.admin.key))
    with urllib.request.urlopen(request, context=context, timeout=30) as response:
        stored: dict[str, Any] = json.loads(response.read())
    return stored


def ref_of(claim: Mapping[str, Any]) -> ClaimRef:
    meta = claim["metadata"]
    return ClaimRef(meta["namespace"], meta["name"], meta["uid"])


# --- claims -----------------------------------------------------------------------------


def test_get_claim_returns_every_field(
    control_plane: ControlPlane,
    api: KubeClusterAPI,
    namespace: str,
    driver: str,
    *,
    cluster_profile: ClusterProfile,
) -> None:
    created = create_claim(control_plane, namespace, "full", driver)
    allocate(control_plane, created, allocation(driver))
    got = api.get_claim(namespace, "full")
    assert got == control_plane.request("GET", claims_path(namespace, "full"))
    assert got["metadata"]["uid"] == created["metadata"]["uid"]
    assert got["metadata"]["labels"] == {"app": "test"}
    assert got["spec"] == created["spec"]
    assert got["spec"]["devices"]["requests"][1]["exactly"] == {
        "deviceClassName": OTHER_DRIVER,
        "allocationMode": "ExactCount",  # the server's defaults are there too
        "count": 1,
    }
    kept = cluster_profile.on("DRAConsumableCapacity")
    assert got["status"] == {"allocation": allocation(driver, consumed=kept)}


def test_get_missing_claim_is_the_servers_404(api: KubeClusterAPI, namespace: str) -> None:
    with pytest.raises(KubeAPIError) as missing:
        api.get_claim(namespace, "no-such-claim")
    assert missing.value.not_found
    assert missing.value.status == 404
    assert 'resourceclaims.resource.k8s.io "no-such-claim" not found' in str(missing.value)


# --- slices -----------------------------------------------------------------------------


def slice_body(node: str, driver: str, devices: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": "api-test-"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": f"dev{i}"} for i in range(devices)],
        },
    }


def test_list_slices_selects_by_node_and_driver(
    control_plane: ControlPlane, api: KubeClusterAPI, ready_node: str, driver: str
) -> None:
    other_node = f"elsewhere-{uuid.uuid4().hex[:8]}"
    other_driver = f"o{driver}"
    wanted = control_plane.request(
        "POST", f"{RESOURCE}/resourceslices", slice_body(ready_node, driver, 2)
    )
    for node, name in [(ready_node, other_driver), (other_node, driver)]:
        control_plane.request("POST", f"{RESOURCE}/resourceslices", slice_body(node, name))
    (found,) = api.list_slices(ready_node, driver)
    assert found["metadata"]["uid"] == wanted["metadata"]["uid"]
    assert found["spec"] == wanted["spec"]
    assert len(api.list_slices(other_node, driver)) == 1
    assert api.list_slices(ready_node, f"none{driver}") == []


def test_create_slice_dry_run_stores_nothing(
    control_plane: ControlPlane, api: KubeClusterAPI, ready_node: str, driver: str
) -> None:
    answer = api.create_slice(slice_body(ready_node, driver, 3), dry_run=True)
    assert answer["spec"]["devices"] == [{"name": "dev0"}, {"name": "dev1"}, {"name": "dev2"}]
    assert answer["metadata"]["name"].startswith("api-test-")
    assert resource_slices(control_plane, ready_node, driver) == []
    bad = slice_body(ready_node, driver)
    bad["spec"]["devices"] = [{"name": "Not_A_Name"}]
    with pytest.raises(KubeAPIError) as refused:
        api.create_slice(bad, dry_run=True)
    assert refused.value.status == 422


def test_update_slice_with_a_stale_resource_version_conflicts(
    control_plane: ControlPlane, api: KubeClusterAPI, ready_node: str, driver: str
) -> None:
    ours = api.create_slice(slice_body(ready_node, driver))
    name = ours["metadata"]["name"]
    theirs = control_plane.request("GET", f"{RESOURCE}/resourceslices/{name}")
    theirs["spec"]["devices"] = [{"name": "theirs"}]
    control_plane.request("PUT", f"{RESOURCE}/resourceslices/{name}", theirs)
    with pytest.raises(KubeAPIError) as conflict:
        api.update_slice({**ours, "spec": {**ours["spec"], "devices": [{"name": "ours"}]}})
    assert conflict.value.status == 409
    assert "the object has been modified" in str(conflict.value)
    (stored,) = resource_slices(control_plane, ready_node, driver)
    assert stored["spec"]["devices"] == [{"name": "theirs"}]


def test_delete_slice_preconditions(
    control_plane: ControlPlane, api: KubeClusterAPI, ready_node: str, driver: str
) -> None:
    first = api.create_slice(slice_body(ready_node, driver))
    meta = first["metadata"]
    updated = api.update_slice({**first, "spec": {**first["spec"], "devices": []}})
    for uid, version, message in [
        (meta["uid"], meta["resourceVersion"], "the ResourceVersion in the precondition"),
        (str(uuid.uuid4()), updated["metadata"]["resourceVersion"], "does not match the UID"),
    ]:
        with pytest.raises(KubeAPIError) as conflict:
            api.delete_slice(meta["name"], uid, version)
        assert conflict.value.status == 409
        assert message in str(conflict.value)
    assert len(resource_slices(control_plane, ready_node, driver)) == 1
    api.delete_slice(meta["name"], meta["uid"], updated["metadata"]["resourceVersion"])
    assert resource_slices(control_plane, ready_node, driver) == []
    api.delete_slice(meta["name"], meta["uid"], updated["metadata"]["resourceVersion"])  # gone


# --- claim status -------------------------------------------------------------------------


def their_status(
    cp: ControlPlane, claim: Mapping[str, Any], entries: list[dict[str, Any]]
) -> dict[str, Any]:
    """Another driver's entries, applied by its own field manager."""
    meta = claim["metadata"]
    path = claims_path(meta["namespace"], meta["name"])
    stored: dict[str, Any] = cp.request(
        "PATCH",
        f"{path}/status?fieldManager={OTHER_DRIVER}&force=true",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "status": {"devices": entries},
        },
        content_type="application/apply-patch+yaml",
    )
    return stored


def entries_of(claim: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["device"]: e for e in claim["status"].get("devices") or []}


def test_apply_claim_status_writes_only_our_entries(
    control_plane: ControlPlane,
    api: KubeClusterAPI,
    namespace: str,
    driver: str,
    *,
    cluster_profile: ClusterProfile,
) -> None:
    claim = allocate(
        control_plane, create_claim(control_plane, namespace, "shared", driver), allocation(driver)
    )
    gpu = {"driver": OTHER_DRIVER, "pool": "node-a", "device": "gpu0", "data": {"uuid": "GPU-1"}}
    their_status(control_plane, claim, [gpu])
    ours = [
        {"driver": driver, "pool": "node-a", "device": "cpu0", "data": {"cpus": "2-3"}},
        {"driver": driver, "pool": "node-a", "device": "cpu1", "data": {"cpus": "4"}},
    ]
    written = api.apply_claim_status(ref_of(claim), ours, driver)
    assert {d: e.get("data") for d, e in entries_of(written).items()} == {
        "gpu0": {"uuid": "GPU-1"},
        "cpu0": {"cpus": "2-3"},
        "cpu1": {"cpus": "4"},
    }
    written = api.apply_claim_status(ref_of(claim), ours[1:], driver)
    assert sorted(entries_of(written)) == ["cpu1", "gpu0"]
    written = api.apply_claim_status(ref_of(claim), [], driver)
    assert sorted(entries_of(written)) == ["gpu0"]
    assert entries_of(written)["gpu0"]["data"] == {"uuid": "GPU-1"}
    kept = allocation(driver, consumed=cluster_profile.on("DRAConsumableCapacity"))
    assert written["status"]["allocation"] == kept, "the allocation is untouched"
    stored = control_plane.request("GET", claims_path(namespace, "shared"))
    assert entries_of(stored) == entries_of(written)


def test_apply_claim_status_refuses_a_replaced_claim(
    control_plane: ControlPlane, api: KubeClusterAPI, namespace: str, driver: str
) -> None:
    old = create_claim(control_plane, namespace, "replaced", driver)
    control_plane.request("DELETE", claims_path(namespace, "replaced"))
    new = allocate(
        control_plane,
        create_claim(control_plane, namespace, "replaced", driver),
        allocation(driver),
    )
    entry = {"driver": driver, "pool": "node-a", "device": "cpu0"}
    with pytest.raises(KubeAPIError) as refused:
        api.apply_claim_status(ref_of(old), [entry], driver)
    # Server-side apply takes the UID we name as a change of it, which the server refuses.
    assert refused.value.status == 422
    assert f'metadata.uid: Invalid value: "{old["metadata"]["uid"]}": field is immutable' in str(
        refused.value
    )
    stored = control_plane.request("GET", claims_path(namespace, "replaced"))
    assert stored["metadata"]["uid"] == new["metadata"]["uid"]
    assert "devices" not in stored["status"]


def test_status_of_a_claim_written_by_a_python_client_is_refused_upstream(
    control_plane: ControlPlane,
    cluster_profile: ClusterProfile,
    api: KubeClusterAPI,
    namespace: str,
    driver: str,
) -> None:
    """Kubernetes re-encodes the allocation's opaque parameters on any status patch and
    compares the bytes (every release tested; 1.37 words the refusal differently), so a
    claim whose parameters are not compact JSON with sorted keys (as Python clients write
    them) cannot get a status.devices entry. nodedra logs that and goes on (the claim is
    prepared all the same); this test notices when a Kubernetes release changes it, so the
    note in docs/operations.md ("The ResourceClaim watch") can go."""
    claim = allocate(
        control_plane,
        create_claim(control_plane, namespace, "pythonic", driver),
        allocation(driver),
        go_json=False,
    )
    entry = {"driver": driver, "pool": "node-a", "device": "cpu0"}
    with pytest.raises(KubeAPIError) as refused:
        api.apply_claim_status(ref_of(claim), [entry], driver)
    assert refused.value.status == 422
    wording = (
        "field cannot be modified once set" if cluster_profile.minor > 36 else "field is immutable"
    )
    assert wording in str(refused.value)


# --- the plugin's claim fetches ---------------------------------------------------------


def plugin(kube_client: ApiClient, tmp: Path, driver: str) -> tuple[Plugin, FakeOwner, FakePolicy]:
    """A plugin on the real client, with fakes of our own Owner and policy."""
    owner, policy = FakeOwner(), FakePolicy()
    options = Options(
        node_name="node-a",
        kube_client=kube_client,
        owner=owner,
        policy=policy,
        registrar_dir=tmp / "registry",
        plugin_data_dir=tmp / "plugin",
        cdi_dir=tmp / "cdi",
    )
    prepared = Plugin(driver, options)
    prepared.allow_claims()
    return prepared, owner, policy


def test_prepare_fetch_errors_are_per_claim(
    control_plane: ControlPlane,
    admin_api: ApiClient,
    namespace: str,
    driver: str,
    tmp_path: Path,
) -> None:
    cp = control_plane
    good = allocate(cp, create_claim(cp, namespace, "good", driver), allocation(driver))
    unallocated = create_claim(cp, namespace, "unallocated", driver)
    under_test, owner, policy = plugin(admin_api, tmp_path, driver)
    refs = [
        ref_of(good),
        ClaimRef(namespace, "missing", "m-uid"),
        ref_of(unallocated),
        ClaimRef(namespace, "good", "old-uid"),  # the claim was replaced since
        ClaimRef(namespace, "nameless", ""),
    ]
    answers = under_test.node_prepare(refs)
    good_uid, unallocated_uid = good["metadata"]["uid"], unallocated["metadata"]["uid"]
    assert set(answers) == {good_uid, "m-uid", unallocated_uid, "old-uid", ""}
    assert answers[good_uid].error is None
    assert [d.device_name for d in answers[good_uid].devices] == ["cpu0", "cpu1"]
    messages = {uid: str(a.error) for uid, a in answers.items() if uid != good_uid}
    assert messages["m-uid"] == (
        f"claim {namespace}/missing (m-uid): cannot get it from the API server: (404) GET "
        f"{claims_path(namespace, 'missing')}: "
        'resourceclaims.resource.k8s.io "missing" not found'
    )
    assert messages[unallocated_uid] == (
        f"claim {namespace}/unallocated ({unallocated_uid}) is not allocated"
    )
    assert messages["old-uid"] == (
        f"claim {namespace}/good (old-uid) was replaced: the API server has UID {good_uid!r}"
    )
    assert messages[""] == f"claim {namespace}/nameless: the request has no claim UID"
    assert owner.locks == 1, "one lock for the claims fetched, outside it"
    (fetched,) = policy.claims
    assert fetched == cp.request("GET", claims_path(namespace, "good"))


def test_prepare_when_the_api_server_cannot_be_reached(tmp_path: Path, driver: str) -> None:
    """Nothing listens where the client goes: the failure of a real connection."""
    unreachable = ApiClient(Configuration(host=f"https://{LOOPBACK}:{free_port()}"))
    under_test, _, policy = plugin(unreachable, tmp_path, driver)
    ref = ClaimRef("default", "claim", "u1")
    answers = under_test.node_prepare([ref])
    assert "claim default/claim (u1): cannot get it from the API server" in str(answers["u1"].error)
    assert "Connection refused" in str(answers["u1"].error)
    assert policy.claims == []
