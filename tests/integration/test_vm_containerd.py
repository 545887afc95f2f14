"""containerd on the VM node pins a container as a production node does: through systemd.

The guest (tests.peers.vm) carries containerd, its shim, ctr and runc from the peers' builds
and the node's image archives (tests.peers.vm_image); containerd's unit is not started at
boot, so the module starts it. On cgroup v2 with systemd's cgroup driver runc does not write
the cpuset files itself first: it asks systemd for a transient scope with ``AllowedCPUs`` and
``AllowedMemoryNodes``. What counts is read inside the guest: the container's
``/proc/<pid>/status`` and its cgroup's ``cpuset.*.effective``.
"""

from __future__ import annotations

import time

import pytest

from tests.peers.pods import WORKLOAD_IMAGE
from tests.peers.vm import VMNode
from tests.peers.vm_image import GUEST_IMAGES_DIR

CTR = "ctr -n k8s.io"


@pytest.fixture(scope="module")
def containerd(vm_node: VMNode) -> VMNode:
    """The guest with containerd started and serving, and the node's images imported."""
    started = time.monotonic()
    vm_node.run("systemctl start containerd", timeout=180).check()
    vm_node.run(f"{CTR} version", timeout=60).check()
    serving = time.monotonic() - started
    for archive in ("pause", "workload"):
        vm_node.run(
            f"{CTR} images import --snapshotter overlayfs {GUEST_IMAGES_DIR}/{archive}.tar",
            timeout=300,
        ).check()
    print(
        f"[vm] containerd serving {serving:.1f}s after `systemctl start`, images imported "
        f"{time.monotonic() - started:.1f}s after it"
    )
    return vm_node


def test_containerd_runs_runc_with_systemd_cgroups_nri_and_cdi(containerd: VMNode) -> None:
    assert containerd.run("systemctl is-active containerd").output.strip() == "active"
    config = containerd.run("containerd config dump", timeout=120).check()
    assert "SystemdCgroup = true" in config, config
    assert "cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']" in config, config
    assert containerd.run("test -S /var/run/nri/nri.sock").returncode == 0, "no NRI socket"
    assert containerd.run("test -d /var/run/cdi").returncode == 0, "no /var/run/cdi"
    images = containerd.run(f"{CTR} images list --quiet").check().split()
    assert WORKLOAD_IMAGE in images, images


def test_a_container_pinned_to_numa_node_1_through_systemd(containerd: VMNode) -> None:
    name = "nodedra-pinned"
    started = time.monotonic()
    containerd.run(
        f"{CTR} run -d --null-io --runc-systemd-cgroup --cgroup system.slice:nodedra:{name} "
        f"--cpuset-cpus 2-3 --cpuset-mems 1 {WORKLOAD_IMAGE} {name}",
        timeout=180,
    ).check()
    try:
        ran = time.monotonic() - started
        tasks = containerd.run(f"{CTR} tasks list").check()
        (pid,) = [line.split()[1] for line in tasks.splitlines() if line.startswith(name)]
        status = containerd.run(f"grep -E '^(Cpus|Mems)_allowed_list' /proc/{pid}/status").check()
        fields = dict(line.split(":\t") for line in status.strip().splitlines())
        assert fields == {"Cpus_allowed_list": "2-3", "Mems_allowed_list": "1"}, status
        cgroup = containerd.run(f"cat /proc/{pid}/cgroup").check().strip()
        # systemd's driver: a transient scope of the slice named in the cgroup path.
        assert cgroup == f"0::/system.slice/nodedra-{name}.scope", cgroup
        group = f"/sys/fs/cgroup{cgroup[3:]}"
        effective = containerd.run(
            f"cat {group}/cpuset.cpus.effective {group}/cpuset.mems.effective"
        ).check()
        assert effective.split() == ["2-3", "1"], effective
        unit = containerd.run(
            f"systemctl show -p AllowedCPUs -p AllowedMemoryNodes nodedra-{name}.scope"
        ).check()
        assert sorted(unit.split()) == ["AllowedCPUs=2-3", "AllowedMemoryNodes=1"], unit
        print(f"[vm] `ctr run -d` of the pinned container took {ran:.1f}s")
    finally:
        containerd.run(f"{CTR} tasks kill -s KILL {name}", timeout=60)
        containerd.run(
            f"for i in $(seq 50); do {CTR} tasks delete {name} && break; sleep 0.2; done; "
            f"{CTR} containers delete {name}",
            timeout=120,
        )
