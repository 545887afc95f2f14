"""``nodedra gather`` and ``nodedra get``, against nodedra's own HTTP endpoints served here.

The endpoints are nodedra's own listeners (:mod:`nodedra.httpserver`) answering with made-up
readiness, metrics and a CPU map: fakes of our own protocol. The archive is read back with
tarfile and each part checked for what a bug report would look for in it.
"""

from __future__ import annotations

import io
import json
import socket
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge

from nodedra import __version__, gather, httpserver
from nodedra.cli import main
from nodedra.resmgr.checkpoint import FILE_NAME, Checkpoint, State

FIXTURES = Path(__file__).parent.parent / "fixtures" / "sysfs"
SCOPE = "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podu1.slice"


def cpu_map() -> dict[str, Any]:
    """A CPU map of schema 1 with one container, on CPUs 2-3, whose cgroup is given."""
    return {
        "schema": 1,
        "node": "n1",
        "driver": "topology-aware.nri.io",
        "pinning": "required",
        "runtime_connected": True,
        "online": "0-3",
        "reserved": "0",
        "claimed": "2-3",
        "shared": "0-1",
        "isolated": "",
        "numa_nodes": [],
        "claims": [],
        "containers": [
            {
                "id": "aaaa",
                "name": "main",
                "pod": {"uid": "u1", "namespace": "shop", "name": "checkout"},
                "claims": {"uid-a": [0]},
                "cpus": "2-3",
                "mems": "",
                "told": {"cpus": "2-3", "mems": ""},
                "in_sync": True,
                "cgroup": "kubepods-besteffort-podu1.slice:cri-containerd:aaaa",
            }
        ],
    }


def closed_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


class Instance:
    """nodedra's listeners with a made-up readiness, one metric and a CPU map."""

    def __init__(self) -> None:
        self.ready = False
        registry = CollectorRegistry()
        Gauge("nodedra_nri_connected", "connected", registry=registry).set(1)
        self.metrics_port, self._stop_metrics = httpserver.serve(
            "127.0.0.1",
            0,
            httpserver.metrics_app(registry, lambda: (self.ready, {"registered": self.ready})),
        )
        body = json.dumps(cpu_map()).encode()
        self.status_port, self._stop_status = httpserver.serve(
            "127.0.0.1", 0, httpserver.status_app(lambda: body)
        )

    def stop(self) -> None:
        self._stop_metrics()
        self._stop_status()


@pytest.fixture
def instance() -> Iterator[Instance]:
    served = Instance()
    try:
        yield served
    finally:
        served.stop()


def node_files(tmp_path: Path) -> dict[str, str]:
    """A config file, a checkpoint holding one claim, a CDI spec and a v2 cgroup tree."""
    config = tmp_path / "config.yaml"
    config.write_text('policy: topology-aware\nreservedCPUs: "0"\n')
    state = tmp_path / "state"
    state.mkdir()
    Checkpoint(state / FILE_NAME).save(
        State(
            "topology-aware",
            "topology-aware.nri.io",
            {"uid-a": {"cpus": [2, 3]}},
            {"uid-a": {"namespace": "shop", "name": "checkout-cpus", "pods": ["u1"]}},
        )
    )
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "topology-aware.nri.io-uid-a.json").write_text("{}")
    cgroup = tmp_path / "cgroup"
    scope = cgroup / SCOPE / "cri-containerd-aaaa.scope"
    scope.mkdir(parents=True)
    (cgroup / "cgroup.controllers").write_text("cpuset\n")
    (scope / "cpuset.cpus.effective").write_text("2-3\n")
    (scope / "cpuset.mems.effective").write_text("0\n")
    return {
        "NODEDRA_CONFIG": str(config),
        "NODEDRA_STATE_DIR": str(state),
        "NODEDRA_CDI_DIR": str(cdi),
        "NODEDRA_CGROUP_ROOT": str(cgroup),
        "NODEDRA_REGISTRY_DIR": str(tmp_path / "no-registry"),
        "NODEDRA_PLUGIN_DIR": str(tmp_path),
        "NODEDRA_NRI_SOCKET": str(tmp_path / "nri.sock"),
    }


def environ(instance: Instance, tmp_path: Path) -> dict[str, str]:
    return {
        "NODE_NAME": "n1",
        "NODEDRA_METRICS_ADDRESS": f"0.0.0.0:{instance.metrics_port}",
        "NODEDRA_STATUS_ADDRESS": f"127.0.0.1:{instance.status_port}",
        "NODEDRA_HEALTH_ADDRESS": f"127.0.0.1:{closed_port()}",  # kopf's: not served here
        "HOME": "/root",  # not a setting: left out
        **node_files(tmp_path),
    }


def members(data: bytes) -> dict[str, bytes]:
    """The archive's files by name below its one top directory."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        names = tar.getnames()
        tops = {name.split("/", 1)[0] for name in names}
        assert len(tops) == 1, names
        (top,) = tops
        assert top.startswith("nodedra-gather-n1-"), top
        out = {}
        for member in tar.getmembers():
            extracted = tar.extractfile(member)
            assert extracted is not None, member.name
            out[member.name.split("/", 1)[1]] = extracted.read()
    return out


def test_the_archive_holds_every_part_and_records_the_one_that_failed(
    instance: Instance, tmp_path: Path
) -> None:
    sources = gather.Sources(
        environ=environ(instance, tmp_path), sysfs=FIXTURES / "two-socket-smt2-numa4"
    )
    files = members(gather.archive(sources))
    errors = json.loads(files["errors.json"])
    assert list(errors) == ["healthz.txt"], errors
    assert "Connection refused" in errors["healthz.txt"]
    assert files["healthz.txt.error"].decode().strip() == errors["healthz.txt"]
    assert set(files) == {
        "README.txt",
        "errors.json",
        "healthz.txt.error",
        *(name for name in gather.PARTS if name != "healthz.txt"),
    }
    assert files["version.txt"].decode().startswith(f"nodedra {__version__}\n")
    settings = json.loads(files["settings.json"])
    assert settings["NODEDRA_CONFIG"] == str(tmp_path / "config.yaml")
    assert "HOME" not in settings
    assert files["config.yaml"] == (tmp_path / "config.yaml").read_bytes()
    (container,) = json.loads(files["status.json"])["containers"]
    assert container["kernel"]["source"] == "cgroup"
    assert container["kernel"]["check"] == "match"
    assert json.loads(files["readyz.json"]) == {"ready": False, "registered": False}
    assert b"nodedra_nri_connected 1.0" in files["metrics.txt"]
    topology = json.loads(files["topology.json"])
    assert topology, "the fixture's topology"
    checkpoint = json.loads(files["checkpoint.json"])
    assert checkpoint["claims_held"] == 1
    assert checkpoint["claims"]["uid-a"]["reservation"]["name"] == "checkout-cpus"
    cdi = json.loads(files["cdi.json"])
    assert [spec["name"] for spec in cdi["specs"]] == ["topology-aware.nri.io-uid-a.json"]
    node = json.loads(files["node.json"])
    assert node["cgroups"]["version"] == "v2"
    assert node["nri_socket"]["present"] is False
    assert "No such file" in node["kubelet_plugin_registry"]["error"]


def test_a_part_that_raises_leaves_the_others(tmp_path: Path) -> None:
    def broken(_: gather.Sources) -> str:
        raise RuntimeError("disk on fire")

    parts: dict[str, gather.Part] = {
        "a.txt": lambda _: "first\n",
        "b.txt": broken,
        "c.txt": lambda _: b"third\n",
    }
    files = members(gather.archive(gather.Sources(environ={"NODE_NAME": "n1"}), parts))
    assert files["a.txt"] == b"first\n"
    assert files["c.txt"] == b"third\n"
    assert files["b.txt.error"] == b"RuntimeError: disk on fire\n"
    assert json.loads(files["errors.json"]) == {"b.txt": "RuntimeError: disk on fire"}


def test_nothing_reachable_still_gives_an_archive_of_errors(tmp_path: Path) -> None:
    """A pod whose nodedra is down, with no files: every part but the local ones fails."""
    closed = f"127.0.0.1:{closed_port()}"
    sources = gather.Sources(
        environ={
            "NODE_NAME": "n1",
            "NODEDRA_METRICS_ADDRESS": closed,
            "NODEDRA_STATUS_ADDRESS": closed,
            "NODEDRA_HEALTH_ADDRESS": closed,
            "NODEDRA_CONFIG": str(tmp_path / "none.yaml"),
            "NODEDRA_STATE_DIR": str(tmp_path / "none"),
            "NODEDRA_CDI_DIR": str(tmp_path / "none"),
        },
        sysfs=tmp_path / "no-sys",
        timeout=2,
    )
    files = members(gather.archive(sources))
    errors = json.loads(files["errors.json"])
    assert set(errors) == {
        "config.yaml",
        "status.json",
        "readyz.json",
        "metrics.txt",
        "healthz.txt",
        "topology.json",
        "cdi.json",
    }, errors
    assert json.loads(files["checkpoint.json"])["state"] is None, "no checkpoint: a first start"
    assert "version.txt" in files
    assert "node.json" in files


def test_gather_writes_to_stdout_or_a_file(
    instance: Instance,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    for name, value in environ(instance, tmp_path).items():
        monkeypatch.setenv(name, value)
    assert main(["gather"]) == 0
    assert "status.json" in members(capsysbinary.readouterr().out)
    out = tmp_path / "gather.tar.gz"
    assert main(["gather", "--output", str(out)]) == 0
    assert "metrics.txt" in members(out.read_bytes())
    bad = tmp_path / "no-dir" / "gather.tar.gz"
    assert main(["gather", "--output", str(bad)]) == 1
    assert f"cannot write {bad}" in capsysbinary.readouterr().err.decode()


def test_get_prints_the_answer_and_fails_when_it_is_not_ok(
    instance: Instance,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in environ(instance, tmp_path).items():
        monkeypatch.setenv(name, value)
    assert main(["get", "readyz"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"ready": False, "registered": False}
    assert f"http://127.0.0.1:{instance.metrics_port}/readyz answered 503" in captured.err
    instance.ready = True
    assert main(["get", "readyz"]) == 0
    assert json.loads(capsys.readouterr().out)["ready"] is True
    assert main(["get", "metrics"]) == 0
    assert "nodedra_nri_connected 1.0" in capsys.readouterr().out
    assert main(["get", "status"]) == 0
    assert json.loads(capsys.readouterr().out)["node"] == "n1"
    assert main(["get", "healthz"]) == 1
    assert "nodedra get healthz: cannot read http://127.0.0.1:" in capsys.readouterr().err
    monkeypatch.setenv("NODEDRA_METRICS_ADDRESS", "")
    assert main(["get", "metrics"]) == 1
    assert "turned off here" in capsys.readouterr().err
