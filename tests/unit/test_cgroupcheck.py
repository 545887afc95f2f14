"""Verdicts from the containers' cgroups, on cgroup trees laid out as v1 and v2 hosts have them.

The trees are directories of plain files named as the kernel names them; what is tested is
that nodedra finds each container's cgroup from the path the runtime gave, in either
driver's form, and compares the cpuset the kernel applies with what nodedra decided.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodedra import cgroupcheck, cpumap
from nodedra.cgroupcheck import CgroupError

POD = "kubepods-besteffort-pod1a2b_3c.slice"
SYSTEMD_DIR = "kubepods.slice/kubepods-besteffort.slice/" + POD


def v2_root(tmp_path: Path) -> Path:
    """A cgroup v2 host with the systemd driver: two containers of one pod."""
    root = tmp_path / "v2"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    for cid, cpus, mems in (("aaaa", "2-3", "0"), ("bbbb", "0-1,4-7", "0-1")):
        directory = root / SYSTEMD_DIR / f"cri-containerd-{cid}.scope"
        directory.mkdir(parents=True)
        (directory / "cpuset.cpus.effective").write_text(cpus + "\n")
        (directory / "cpuset.mems.effective").write_text(mems + "\n")
        (directory / "cpuset.cpus").write_text("\n")  # empty: inherited, as runc leaves it
    return root


def v1_root(tmp_path: Path) -> Path:
    """A cgroup v1 host with the cgroupfs driver (a cpuset hierarchy beside the others)."""
    root = tmp_path / "v1"
    (root / "unified").mkdir(parents=True)
    (root / "unified" / "cgroup.controllers").write_text("\n")  # hybrid: v2 holds nothing
    cpuset = root / "cpuset"
    cpuset.mkdir()
    (cpuset / "cpuset.cpus").write_text("0-7\n")
    directory = cpuset / "kubepods" / "besteffort" / "pod1a2b-3c" / "cccc"
    directory.mkdir(parents=True)
    (directory / "cpuset.effective_cpus").write_text("5\n")
    (directory / "cpuset.effective_mems").write_text("1\n")
    (directory / "cpuset.cpus").write_text("5\n")
    return root


def entry(cid: str, cgroup: str, cpus: str, mems: str = "") -> dict[str, Any]:
    return {"id": cid, "cgroup": cgroup, "cpus": cpus, "mems": mems}


def test_systemd_names_are_expanded_as_systemd_does() -> None:
    assert cgroupcheck.relative_path(f"{POD}:cri-containerd:aaaa") == (
        f"{SYSTEMD_DIR}/cri-containerd-aaaa.scope"
    )
    assert cgroupcheck.relative_path("system.slice:crio:dd") == "system.slice/crio-dd.scope"
    assert cgroupcheck.relative_path("-.slice::foo.scope") == "foo.scope"
    assert cgroupcheck.relative_path("/kubepods/burstable/podx/eeee") == (
        "kubepods/burstable/podx/eeee"
    )


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("", "did not say which cgroup"),
        ("kubepods.slice:cri-containerd", "neither a path nor systemd's slice:prefix:name"),
        ("kubepods--x.slice:p:n", "not a systemd slice name"),
        ("/kubepods/../../etc", "climbs out of the hierarchy"),
    ],
)
def test_a_path_nodedra_cannot_place_is_named_with_the_problem(path: str, problem: str) -> None:
    with pytest.raises(CgroupError, match=problem):
        cgroupcheck.relative_path(path)


def test_v2_verdicts_come_from_the_effective_cpuset(tmp_path: Path) -> None:
    root = v2_root(tmp_path)
    checked = cpumap.check(
        {
            "containers": [
                entry("aaaa", f"{POD}:cri-containerd:aaaa", "2-3", mems="0"),
                entry("bbbb", f"{POD}:cri-containerd:bbbb", "0-1,4-6"),
            ]
        },
        root,
        tmp_path / "no-proc",
    )
    ok, wrong = (c["kernel"] for c in checked["containers"])
    assert ok == {
        "source": "cgroup",
        "where": str(root / SYSTEMD_DIR / "cri-containerd-aaaa.scope"),
        "pid": None,
        "cpus": "2-3",
        "mems": "0",
        "check": "match",
    }
    assert (wrong["source"], wrong["cpus"], wrong["check"]) == ("cgroup", "0-1,4-7", "mismatch")


def test_v1_verdicts_come_from_the_cpuset_hierarchy(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    path = "/kubepods/besteffort/pod1a2b-3c/cccc"
    checked = cpumap.check(
        {"containers": [entry("cccc", path, "5", mems="1"), entry("c2", path, "5", mems="0")]},
        root,
        tmp_path / "no-proc",
    )
    ok, wrong_node = (c["kernel"] for c in checked["containers"])
    assert (ok["source"], ok["where"], ok["check"]) == (
        "cgroup",
        str(root / "cpuset" / path.lstrip("/")),
        "match",
    )
    assert wrong_node["check"] == "mismatch", "the right CPU, the wrong memory node"


def test_a_cgroup_not_found_falls_back_to_proc_and_says_why_when_neither_is_there(
    tmp_path: Path,
) -> None:
    root = v2_root(tmp_path)
    proc = tmp_path / "proc"
    (proc / "77").mkdir(parents=True)
    (proc / "77" / "cgroup").write_text("0::/kubepods/besteffort/podx/ffff\n")
    (proc / "77" / "status").write_text("Cpus_allowed_list:\t3\nMems_allowed_list:\t0\n")
    checked = cpumap.check(
        {
            "containers": [
                entry("ffff", "/kubepods/besteffort/podx/ffff", "3"),
                entry("gggg", f"{POD}:cri-containerd:gggg", "3"),
            ]
        },
        root,
        proc,
    )
    from_proc, unchecked = (c["kernel"] for c in checked["containers"])
    assert (from_proc["source"], from_proc["pid"], from_proc["check"]) == ("proc", 77, "match")
    assert unchecked["check"] == "not checked"
    assert unchecked["source"] is None
    assert unchecked["detail"] == (
        f"cgroup '{POD}:cri-containerd:gggg' not found: no "
        f"{root / SYSTEMD_DIR / 'cri-containerd-gggg.scope'}; and no process of it is "
        f"visible in {proc}"
    )


def test_a_root_that_is_no_cgroup_filesystem_says_what_to_mount(tmp_path: Path) -> None:
    with pytest.raises(CgroupError, match="mount the host's /sys/fs/cgroup there and set"):
        cgroupcheck.read_cpuset(tmp_path, "/kubepods/x")


def test_an_unreadable_cpuset_file_is_named(tmp_path: Path) -> None:
    root = v2_root(tmp_path)
    directory = root / SYSTEMD_DIR / "cri-containerd-aaaa.scope"
    (directory / "cpuset.mems.effective").unlink()
    with pytest.raises(CgroupError, match=r"cannot read .*cpuset\.mems\.effective"):
        cgroupcheck.read_cpuset(root, f"{POD}:cri-containerd:aaaa")


def test_the_text_says_which_source_each_verdict_came_from(tmp_path: Path) -> None:
    root = v2_root(tmp_path)
    container = {
        **entry("aaaa", f"{POD}:cri-containerd:aaaa", "2-3"),
        "name": "main",
        "pod": {"uid": "u", "namespace": "shop", "name": "checkout"},
        "claims": {"uid-a": [0]},
        "told": {"cpus": "2-3", "mems": ""},
        "in_sync": True,
    }
    cpu_map = cpumap.check({"containers": [container], "claims": []}, root, tmp_path)
    drawing = cpumap._Drawing(cpu_map, colour=False, width=100)
    lines = list(drawing.containers())
    assert "  ?  shop/checkout main  CPUs 2-3  ok: its cgroup runs on 2-3" in lines, lines


def test_the_default_root_is_the_variable_else_sys_fs_cgroup() -> None:
    assert cgroupcheck.default_root({}) == Path("/sys/fs/cgroup")
    assert cgroupcheck.default_root({"NODEDRA_CGROUP_ROOT": "/host/sys/fs/cgroup"}) == Path(
        "/host/sys/fs/cgroup"
    )
