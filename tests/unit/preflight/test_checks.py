"""Each check's verdict from what was read: ok, unknown (never fine), warn, fail and a fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodedra.preflight import checks
from nodedra.preflight.gather import failed, render_text
from nodedra.preflight.kubelet import Read

STATE = Path("/var/lib/kubelet/cpu_manager_state")
CONFIG = Path("/var/lib/kubelet/config.yaml")
NONE = Read(None, None, "not read")


def state(policy: str, *, stale: bool = False) -> Read:
    return Read(STATE, {"policyName": policy}, "", stale)


def config(**values: Any) -> Read:
    return Read(CONFIG, dict(values))


def test_a_static_cpu_manager_fails_with_the_steps_out_of_it() -> None:
    check = checks.cpu_manager(state("static"), NONE)
    assert check.status == "fail"
    assert "policy is static" in check.detail
    assert str(STATE) in check.detail
    for step in ("drain", "cpuManagerPolicy: none", "cpu_manager_state", "uncordon"):
        assert step in check.fix
    assert "docs/troubleshooting.md" in check.fix


def test_the_state_file_wins_over_the_configuration_file() -> None:
    """The kubelet refuses a policy other than its state file's: the file is in effect."""
    assert checks.cpu_manager(state("static"), config(cpuManagerPolicy="none")).status == "fail"
    assert checks.cpu_manager(state("none"), NONE).status == "ok"


def test_without_the_state_file_the_configuration_file_decides() -> None:
    assert checks.cpu_manager(NONE, config(cpuManagerPolicy="static")).status == "fail"
    assert checks.cpu_manager(NONE, config(cpuManagerPolicy="none")).status == "ok"
    default = checks.cpu_manager(NONE, config())
    assert (default.status, "default none" in default.detail) == ("ok", True)


def test_with_neither_file_the_cpu_manager_is_unknown_not_fine() -> None:
    check = checks.cpu_manager(Read(STATE, None, f"{STATE} does not exist"), NONE)
    assert check.status == "unknown"
    assert f"{STATE} does not exist" in check.detail
    assert "--kubelet-cpu-manager-state" in check.fix


def test_without_the_files_a_kubelet_asking_for_cpusets_is_a_warning() -> None:
    """The kubelet sets cpusets only with a CPU manager policy other than none."""
    check = checks.cpu_manager(Read(STATE, None, "absent"), NONE, asked=3)
    assert check.status == "warn"
    assert "asked for a container's cpuset 3 times" in check.detail
    assert "cpuManagerPolicy: none" in check.fix
    assert checks.cpu_manager(state("none"), NONE, asked=3).status == "ok"


def test_a_stale_state_file_says_to_restart_the_pod() -> None:
    """Static when the pod started: still a failure, and the way to read it again."""
    static = checks.cpu_manager(state("static", stale=True), NONE)
    assert static.status == "fail"
    assert "delete nodedra's pod" in static.fix
    none = checks.cpu_manager(state("none", stale=True), NONE)
    assert none.status == "unknown"
    assert "delete nodedra's pod" in none.detail


@pytest.mark.parametrize(
    ("values", "status"),
    [
        ({}, "ok"),
        ({"memoryManagerPolicy": "Static"}, "warn"),
        ({"topologyManagerPolicy": "single-numa-node"}, "warn"),
        ({"topologyManagerPolicy": "best-effort"}, "ok"),
    ],
)
def test_memory_and_topology_managers(values: dict[str, str], status: str) -> None:
    assert checks.kubelet_managers(config(**values)).status == status
    assert checks.kubelet_managers(NONE).status == "unknown"


def test_the_kubelet_s_reserved_cpus_must_be_among_nodedra_s() -> None:
    short = checks.reserved_cpus(frozenset({0}), config(reservedSystemCPUs="0-1"))
    assert short.status == "warn"
    assert "claims may get 1" in short.detail
    assert 'reservedCPUs: "0-1"' in short.fix
    assert checks.reserved_cpus(frozenset({0, 1}), config(reservedSystemCPUs="0-1")).status == (
        "ok"
    )
    assert checks.reserved_cpus(frozenset(), config()).status == "ok"
    assert checks.reserved_cpus(frozenset(), NONE).status == "unknown"
    bad = checks.reserved_cpus(frozenset(), config(reservedSystemCPUs="0-x"))
    assert (bad.status, "0-x" in bad.detail) == ("unknown", True)


def node(runtime: str) -> dict[str, Any]:
    return {"status": {"nodeInfo": {"containerRuntimeVersion": runtime}}}


@pytest.mark.parametrize(
    ("runtime", "status"),
    [
        ("containerd://2.4.2", "ok"),
        ("containerd://2.0.0", "ok"),
        ("cri-o://1.34.1", "ok"),
        ("containerd://1.7.24", "fail"),
        ("containerd://v1.6.9", "fail"),
        ("docker://28.0.1", "warn"),
    ],
)
def test_the_runtime_and_its_version(runtime: str, status: str) -> None:
    check = checks.container_runtime(node(runtime))
    assert check.status == status
    assert runtime in check.detail


def test_containerd_1_7_is_refused_naming_the_version_and_the_ways_out() -> None:
    check = checks.container_runtime(node("containerd://1.7.24"))
    assert "containerd://1.7.24" in check.detail
    assert "NRI off by default" in check.detail
    assert "containerd 2.0 or later" in check.fix
    assert 'io.containerd.nri.v1.nri"] disable = false' in check.fix


def test_an_unknown_runtime_is_unknown() -> None:
    assert checks.container_runtime(None, "cannot read Node n").status == "unknown"
    assert checks.container_runtime({"status": {}}).status == "unknown"


def slice_of(driver: str) -> dict[str, Any]:
    return {"spec": {"driver": driver, "nodeName": "n"}}


def test_another_cpu_driver_on_the_node_fails() -> None:
    check = checks.other_cpu_drivers([slice_of("static.nri.io"), slice_of("dra.cpu")])
    assert check.status == "fail"
    assert "dra.cpu (dra-driver-cpu" in check.detail
    assert checks.other_cpu_drivers([slice_of("gpu.example.com")]).status == "ok"
    assert checks.other_cpu_drivers(None, "forbidden").status == "unknown"


def test_feature_gates() -> None:
    meaning = {"DRAConsumableCapacity": "claims get whole devices"}
    off = checks.feature_gates({"DRAConsumableCapacity": False}, meaning)
    assert off.status == "warn"
    assert "claims get whole devices" in off.detail
    assert checks.feature_gates({"DRAConsumableCapacity": True}, meaning).status == "ok"
    assert checks.feature_gates({"DRAConsumableCapacity": None}, meaning).status == "unknown"
    assert checks.feature_gates({}, meaning).status == "unknown"


@pytest.mark.parametrize(
    ("form", "lists_on", "version", "status"),
    [
        ("scalar", False, "v1.36.3", "ok"),
        ("list", True, "v1.37.2", "ok"),
        ("list", True, "v1.36.3", "warn"),
        ("list", False, "v1.37.2", "warn"),
        ("list", None, "v1.37.2", "unknown"),
        ("list", True, "a fork", "unknown"),
    ],
)
def test_the_list_form_of_numa_node(
    form: str, lists_on: bool | None, version: str, status: str
) -> None:
    check = checks.numa_attribute(form, lists_on, version)
    assert check.status == status, check
    if status == "warn":
        assert "scalar" in check.fix, check


def test_at_1_36_the_list_form_says_claims_would_stay_pending() -> None:
    check = checks.numa_attribute("list", True, "v1.36.3")
    assert "v1.36.3" in check.detail
    assert "stays Pending" in check.detail
    assert check.fix.startswith("leave numaNodeAttribute.form at scalar")


def test_the_report_prints_each_check_and_the_fixes_of_the_others() -> None:
    results = [
        checks.Check("a", "ok", "fine", "never printed"),
        checks.Check("b", "fail", "broken", "mend it"),
    ]
    assert render_text(results) == "OK      a: fine\nFAIL    b: broken\n        fix: mend it\n"
    assert failed(results)
    assert not failed(results[:1])
