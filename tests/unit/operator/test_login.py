"""Where kopf connects in a pod: the address nodedra's own client uses, not a DNS name."""

from __future__ import annotations

import pytest

from nodedra.handlers import in_cluster_server


@pytest.mark.parametrize(
    ("host", "port", "server"),
    [
        ("10.96.0.1", "443", "https://10.96.0.1:443"),
        ("fd00:10:96::1", "6443", "https://[fd00:10:96::1]:6443"),
    ],
)
def test_in_cluster_server_is_the_kubernetes_service_address(
    host: str, port: str, server: str
) -> None:
    environ = {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}
    assert in_cluster_server(environ) == server


@pytest.mark.parametrize(
    "environ", [{}, {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, {"KUBERNETES_SERVICE_PORT": "443"}]
)
def test_outside_a_pod_there_is_no_in_cluster_server(environ: dict[str, str]) -> None:
    assert in_cluster_server(environ) is None
