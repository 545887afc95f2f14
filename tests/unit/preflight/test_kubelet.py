"""Reading the kubelet's files: absent, empty, damaged or replaced is unknown, never fine."""

from __future__ import annotations

import json
import os
from pathlib import Path

from nodedra.preflight.kubelet import read_config, read_state


def test_the_state_file_s_policy_is_read(tmp_path: Path) -> None:
    path = tmp_path / "cpu_manager_state"
    path.write_text(json.dumps({"policyName": "static", "defaultCpuSet": "0-3", "checksum": 1}))
    read = read_state(path)
    assert (read.get("policyName"), read.stale, read.why) == ("static", False, "")


def test_an_absent_empty_or_damaged_file_is_unknown_with_the_reason(tmp_path: Path) -> None:
    assert "does not exist" in read_state(tmp_path / "nothing").why
    assert read_state(tmp_path / "nothing").data is None
    (tmp_path / "empty").write_text("")
    assert "is empty" in read_state(tmp_path / "empty").why
    (tmp_path / "bad").write_text("{not json")
    assert "is not what the kubelet writes" in read_state(tmp_path / "bad").why
    (tmp_path / "list").write_text("[1, 2]")
    assert "is not a mapping" in read_config(tmp_path / "list").why
    assert read_config(None).why == (
        "the kubelet's configuration file is not read (no path is set)"
    )


def test_a_configuration_file_is_yaml_or_json(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
        "cpuManagerPolicy: static\nreservedSystemCPUs: 0-1\n"
    )
    read = read_config(tmp_path / "config.yaml")
    assert (read.get("cpuManagerPolicy"), read.get("reservedSystemCPUs")) == ("static", "0-1")
    (tmp_path / "config.json").write_text(json.dumps({"cpuManagerPolicy": "none"}))
    assert read_config(tmp_path / "config.json").get("cpuManagerPolicy") == "none"


def test_a_file_replaced_since_it_was_opened_by_its_mount_is_stale(tmp_path: Path) -> None:
    """As a hostPath mount of one file sees the kubelet's rename over it: the old inode.

    The pod's mount keeps the inode it was made on, which then has no name left on the
    host; an open descriptor's /proc path, read here, is such an inode.
    """
    state = tmp_path / "cpu_manager_state"
    state.write_text(json.dumps({"policyName": "static"}))
    with state.open() as held:
        fresh = tmp_path / ".tmp"
        fresh.write_text(json.dumps({"policyName": "none"}))
        os.rename(fresh, state)  # what the kubelet does
        seen = Path(f"/proc/self/fd/{held.fileno()}")
        read = read_state(seen)
        assert (read.get("policyName"), read.stale) == ("static", True)
    assert read_state(state).stale is False
    assert read_state(state).get("policyName") == "none"
