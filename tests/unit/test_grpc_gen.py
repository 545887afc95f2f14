"""The committed gRPC modules match their .proto files, and the wire names are the kubelet's."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpc_gen.generate import FOLDER, generate
from nodedra.grpc_gen import (
    dra_health_v1alpha1_pb2,
    dra_v1_pb2,
    dra_v1beta1_pb2,
    pluginregistration_v1_pb2,
)

REPO = Path(__file__).resolve().parents[2]


def test_generated_modules_match_the_protos(tmp_path: Path) -> None:
    generate(REPO, tmp_path)
    fresh = {p.name: p.read_bytes() for p in (tmp_path / FOLDER).iterdir()}
    committed = {p.name: p.read_bytes() for p in (REPO / FOLDER).iterdir() if "_pb2" in p.name}
    assert sorted(fresh) == sorted(committed), "generated files differ: run `tox -e gen`"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert stale == [], f"{stale} are stale: run `tox -e gen` and commit the result"


@pytest.mark.parametrize(
    ("module", "service", "methods"),
    [
        (
            pluginregistration_v1_pb2,
            "pluginregistration.Registration",
            ["GetInfo", "NotifyRegistrationStatus"],
        ),
        (
            dra_v1_pb2,
            "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
            ["NodePrepareResources", "NodeUnprepareResources"],
        ),
        (
            dra_v1beta1_pb2,
            "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
            ["NodePrepareResources", "NodeUnprepareResources"],
        ),
        (dra_health_v1alpha1_pb2, "v1alpha1.DRAResourceHealth", ["NodeWatchResources"]),
    ],
)
def test_service_names_are_the_kubelets(module: object, service: str, methods: list[str]) -> None:
    services = module.DESCRIPTOR.services_by_name  # type: ignore[attr-defined]
    (found,) = services.values()
    assert found.full_name == service
    assert [m.name for m in found.methods] == methods


def fields(message: object) -> dict[str, tuple[int, bool]]:
    """name -> (number, has explicit presence)."""
    return {
        f.name: (f.number, f.has_presence)
        for f in message.DESCRIPTOR.fields  # type: ignore[attr-defined]
    }


def test_field_numbers() -> None:
    assert fields(dra_v1_pb2.Claim) == {
        "namespace": (1, False),
        "uid": (2, False),
        "name": (3, False),
    }
    assert fields(dra_v1_pb2.Device) == {
        "request_names": (1, False),
        "pool_name": (2, False),
        "device_name": (3, False),
        "cdi_device_ids": (4, False),
        "share_id": (5, True),  # proto3 optional
    }
    assert "share_id" not in fields(dra_v1beta1_pb2.Device)
    assert fields(pluginregistration_v1_pb2.PluginInfo) == {
        "type": (1, False),
        "name": (2, False),
        "endpoint": (3, False),
        "supported_versions": (4, False),
    }
    assert fields(pluginregistration_v1_pb2.RegistrationStatus) == {
        "plugin_registered": (1, False),
        "error": (2, False),
    }
    assert fields(dra_v1_pb2.NodePrepareResourceResponse) == {
        "devices": (1, False),
        "error": (2, False),
    }
    assert fields(dra_v1_pb2.NodeUnprepareResourceResponse) == {"error": (1, False)}
