"""``nodedra version``, ``--version`` and ``nodedra topology`` here and on every fixture."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nodedra import __version__
from nodedra.cli import main
from nodedra.policy import PolicyConfig, make_policy
from nodedra.topology import read_topology
from tests.unit.policy.conftest import FIXTURES, SHAPES


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version"]) == 0
    assert capsys.readouterr().out == f"nodedra {__version__}\n"


def test_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """``nodedra --version`` prints what ``nodedra version`` does, and needs no command."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"nodedra {__version__}\n"


@pytest.mark.parametrize("sysfs", [*(str(FIXTURES / s) for s in SHAPES), "/sys"])
def test_topology_json(sysfs: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topology", "--sysfs", sysfs, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"cpus", "numa_nodes", "devices"}
    topology = read_topology(sysfs)
    assert [c["id"] for c in data["cpus"]] == list(topology.cpu_ids)
    for name in ("topology-aware", "static"):
        expected = make_policy(topology, PolicyConfig(policy=name)).devices()
        assert data["devices"][name] == json.loads(json.dumps(expected))
    assert len(data["devices"]["static"]) == len(topology.cpus)


@pytest.mark.parametrize("sysfs", [*(str(FIXTURES / s) for s in SHAPES), "/sys"])
def test_topology_text(sysfs: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topology", "--sysfs", sysfs]) == 0
    out = capsys.readouterr().out
    assert out.startswith("CPUs: ")
    assert "topology-aware devices (" in out
    assert "static devices (" in out


def test_topology_with_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("reservedCPUs: 0-3\n")
    sysfs = str(FIXTURES / "two-socket-smt2-numa4")
    assert main(["topology", "--sysfs", sysfs, "--config", str(config), "--json"]) == 0
    names = [d["name"] for d in json.loads(capsys.readouterr().out)["devices"]["static"]]
    assert names[0] == "cpu004"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sysfs", "/nonexistent"], "cannot read /nonexistent/devices/system/cpu/online"),
        (["--config", "/nonexistent.yaml"], "cannot read configuration /nonexistent.yaml"),
    ],
)
def test_topology_errors(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topology", *args]) == 1
    assert message in capsys.readouterr().err


def test_preflight_without_a_node_name_says_which_setting_is_missing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert main(["preflight"]) == 2
    assert "nodedra preflight: no node name: pass --node-name" in capsys.readouterr().err
