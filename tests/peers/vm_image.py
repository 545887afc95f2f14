"""The disk image of the VM node: a Debian bookworm guest with systemd and cgroup v2.

This machine's cgroup controllers are bound to v1 hierarchies (see tests/peers/README.md, "VM
node"); a guest kernel has cgroups of its own, with every controller on the unified hierarchy,
as on the nodes nodedra's users run. The guest is made from Debian's packages only, on this
machine, without loop mounts:

1. ``debootstrap --variant=minbase`` of bookworm with systemd as init (:data:`PACKAGES`),
   in a mount namespace of its own (as tests.peers.image builds its base layer), stripped
   as that base layer is (tests.peers.image_base.strip_rootfs);
2. Debian's generic kernel (``linux-image-6.1.0-<abi>-amd64``, the newest apt-cache offers:
   the ``-cloud`` flavour lacks 9p), downloaded, not installed: ``dpkg-deb -x``; its modules
   go into the root filesystem (less the drivers no virtual machine has, :data:`MODULE_PRUNE`)
   and ``depmod`` runs there;
3. an initramfs of static busybox (tests.peers.busybox) that loads the virtio and ext4
   modules (built as modules in Debian's kernel) and switches to the disk's ``/sbin/init``;
4. the uncompressed kernel (``vmlinux``, taken out of vmlinuz) for qboot's PVH entry, which
   boots in a fraction of a second where SeaBIOS and the compressed kernel take seconds;
5. ``mkfs.ext4 -d`` of the tree into a sparse raw disk.

The guest's only channel to the tests is a virtio-serial port on which a small shell agent
(:data:`AGENT_SCRIPT`, a systemd unit) runs the commands the host sends (tests.peers.vm).

A build takes a few minutes and depends only on the recipe, so it is cached under
``tests.peers.cache.cache_root()/vm-image-<hash>/``, the hash covering everything here that
shapes the image (:func:`recipe_key`), built under a lock (once for parallel runs) in a
working directory renamed into place when complete. Building needs root and the Debian mirror;
it installs QEMU, debootstrap and e2fsprogs from Debian's packages when missing. Every failure
raises VMImageError saying what is missing.

Build from the command line (prints where the image is)::

    python -m tests.peers.vm_image
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.peers import go_driver_daemonset
from tests.peers.build import PeerBinaries, ensure_binaries
from tests.peers.busybox import busybox_binary
from tests.peers.cache import Log, PeerBuildError, cache_root, locked, prune_cache_entries
from tests.peers.debian import (
    SUITE,
    VARIANT,
    debian_mirror,
    ensure_debootstrap,
    install_debian_packages,
    run_debootstrap,
)
from tests.peers.image_base import strip_rootfs
from tests.peers.image_build import ImageBuildError, run_step
from tests.peers.oci import ImageSpec, write_image_archive
from tests.peers.peer_groups import CNI_PLUGINS, CONTAINERD_VERSIONS, containerd_peer
from tests.peers.podnet import conflist
from tests.peers.pods import PAUSE_IMAGE, node_image_specs
from tests.peers.process import PeerProcess, PeerProcessError

#: Bump when the build changes in a way the recipe key does not see.
VM_IMAGE_SCHEME = "2"

#: What debootstrap adds to minbase: systemd as PID 1 (systemd-sysv), device nodes and module
#: loading (udev, kmod), ``ip`` (iproute2), libseccomp2, which runc (built with seccomp) links
#: against, and ``nft`` (nftables), with which kube-proxy and the bridge plugin program the
#: pod network's rules.
PACKAGES: tuple[str, ...] = (
    "systemd-sysv",
    "udev",
    "kmod",
    "iproute2",
    "libseccomp2",
    "nftables",
    # The system bus, on which systemd serves its API (nodedra's quietCPUs.hostProcesses).
    "dbus",
    # Balances interrupts where it runs (nodedra's quietCPUs.interrupts tells it what to
    # avoid); installed, not started at boot: test_quiet_cpus starts it.
    "irqbalance",
)

#: The kernel flavour: the generic one (the cloud flavour has no 9p); the newest ABI of this
#: series that apt-cache offers is taken.
KERNEL_PATTERN = re.compile(r"linux-image-6\.1\.0-(\d+)-amd64")

#: Module directories (under ``lib/modules/<version>/kernel``) the guest has no device for:
#: left out, they save some 250 MB of the disk and of mkfs's time.
MODULE_PRUNE: tuple[str, ...] = (
    "sound",
    "drivers/gpu",
    "drivers/media",
    "drivers/infiniband",
    "drivers/usb",
    "drivers/iio",
    "drivers/staging",
    "drivers/comedi",
    "drivers/hid",
    "drivers/input",
    "drivers/hwmon",
    "drivers/mtd",
    "drivers/video",
    "drivers/bluetooth",
    "drivers/isdn",
    "drivers/net/wireless",
    "drivers/net/ethernet",
    "drivers/net/can",
    "net/wireless",
    "net/mac80211",
    "net/bluetooth",
)

#: What the initramfs loads, in dependency order, before it can mount the virtio disk.
INITRAMFS_MODULES: tuple[str, ...] = (
    "virtio_ring",
    "virtio",
    "virtio_pci_modern_dev",
    "virtio_pci_legacy_dev",
    "virtio_pci",
    "virtio_blk",
    "crc32c_generic",
    "crc32c-intel",
    "jbd2",
    "mbcache",
    "crc16",
    "ext4",
)

#: The initramfs' /init: load the modules, mount the disk, hand over to systemd. Whatever
#: fails powers the guest off (QEMU runs with -no-reboot), so a broken image ends QEMU at
#: once rather than at its timeout.
INIT_SCRIPT = """#!/bin/busybox sh
/bin/busybox --install -s /bin
mkdir -p /proc /sys /dev /newroot
mount -t proc proc /proc
mount -t devtmpfs devtmpfs /dev
fail() { echo "initramfs: $*" > /dev/console; poweroff -f; }
for module in $(cat /modules.order); do
    insmod "/modules/$module.ko" || fail "cannot load $module"
done
i=0
while [ ! -b /dev/vda ]; do
    i=$((i + 1)); [ "$i" -gt 300 ] && fail "no /dev/vda"; sleep 0.1
done
mount -t ext4 -o rw /dev/vda /newroot || fail "cannot mount /dev/vda"
umount /proc
umount /dev
exec switch_root /newroot /sbin/init
"""

#: The name of the agent's virtio-serial port (``/dev/virtio-ports/<name>`` in the guest).
AGENT_PORT = "nodedra.agent"

#: The guest's agent. Protocol, one line each way, so that a shell can speak it: the host
#: sends ``<id> <seconds> <command, base64>``, the agent runs the command with ``sh`` under
#: ``timeout`` and answers ``<id> <exit code> <stdout and stderr, base64>``; it greets with
#: ``hello <boot id>`` when it opens the port. A virtio-serial port needs no network in the
#: guest (its network stays cut off) and no listener beyond this script.
AGENT_SCRIPT = f"""#!/bin/sh
# nodedra's test agent: runs the commands of the host's tests (tests/peers/vm.py).
port=/dev/virtio-ports/{AGENT_PORT}
work=/run/nodedra-agent
i=0
while [ ! -e "$port" ]; do
    i=$((i + 1)); [ "$i" -gt 600 ] && {{ echo "no $port" >&2; exit 1; }}; sleep 0.1
done
mkdir -p "$work"
exec 3<>"$port"
echo "hello $(cat /proc/sys/kernel/random/boot_id)" >&3
while read -r id limit command <&3; do
    if printf '%s' "$command" | base64 -d > "$work/command" 2>/dev/null; then
        timeout -s KILL "$limit" sh "$work/command" < /dev/null > "$work/output" 2>&1
        rc=$?
    else
        echo "agent: the command is not base64" > "$work/output"; rc=126
    fi
    echo "$id $rc $(base64 -w0 "$work/output")" >&3
done
"""

AGENT_UNIT = """[Unit]
Description=nodedra test agent on the virtio-serial port
[Service]
ExecStartPre=-/sbin/modprobe virtio_console
ExecStart=/usr/local/sbin/nodedra-agent
Restart=always
RestartSec=1
[Install]
WantedBy=multi-user.target
"""

#: Units masked in the guest: the serial getty would take the console and nobody logs in
#: (the gettys of the virtual terminals were a fifth of the boot), the others are periodic
#: jobs a test node does not want running during a test.
MASKED_UNITS: tuple[str, ...] = (
    "serial-getty@ttyS0.service",
    "getty.target",
    "getty-static.service",
    "e2scrub_all.timer",
    "e2scrub_reap.service",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer",
    "fstrim.timer",
)

#: The container runtime of the guest: the newest containerd the peers build, with its shim,
#: ``ctr`` and runc, in ``/usr/local/bin`` (copied into the disk: from a 9p share a big Go
#: binary takes seconds to load under TCG).
GUEST_CONTAINERD = CONTAINERD_VERSIONS[0]
_CONTAINERD_COMMANDS = ("containerd", "containerd-shim-runc-v2", "ctr")

#: The guest's containerd store, into which the images are imported when the image is built.
CONTAINERD_ROOT = "/var/lib/containerd"

#: containerd's configuration in the guest, as a production node has it: default paths,
#: runc through systemd's cgroup driver (``SystemdCgroup``: runc asks systemd for a scope and
#: sets cpusets as its ``AllowedCPUs``/``AllowedMemoryNodes``), CDI specs from the two
#: standard directories, NRI on its default socket, the pause image pinned (it is imported,
#: never pulled), and the hugetlb controller kept, as a node that offers huge pages needs
#: (containerd's default drops every container's huge page limit, the kubelet's included).
CONTAINERD_CONFIG = f"""\
version = 3

[plugins.'io.containerd.cri.v1.runtime']
  cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']
  disable_hugetlb_controller = false

[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = 'runc'

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = 'io.containerd.runc.v2'

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  SystemdCgroup = true

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = '{PAUSE_IMAGE}'

[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = '/var/run/nri/nri.sock'
"""

#: containerd's unit, as containerd ships it; not enabled: the guest boots without it (the
#: smoke tests' boot stays as short) and tests start it (``systemctl start containerd``).
CONTAINERD_UNIT = """[Unit]
Description=containerd container runtime
After=local-fs.target
[Service]
ExecStartPre=-/sbin/modprobe overlay
ExecStart=/usr/local/bin/containerd
Type=notify
Delegate=yes
KillMode=process
Restart=always
RestartSec=5
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
OOMScoreAdjust=-999
[Install]
WantedBy=multi-user.target
"""

#: The guest's address on QEMU's user network (its default guest address), the kubelet's node
#: IP. The interface gets it statically (systemd-networkd, started with the kubelet), with no
#: default route: the guest reaches only the forwards QEMU offers on 10.0.2.0/24. The unit
#: matches the NIC by its driver: matching every Ethernet link would make networkd take the
#: pods' veths too, and take them off the pod network's bridge.
GUEST_ADDRESS = "10.0.2.15"
NETWORK_UNIT = f"""[Match]
Driver=virtio_net
[Network]
Address={GUEST_ADDRESS}/24
LinkLocalAddressing=no
IPv6AcceptRA=no
"""

#: Where the kubelet's configuration and credentials go (written by the tests: they hold the
#: test control plane's CA and address).
KUBELET_DIR = "/etc/kubernetes"

#: The kubelet's unit; not enabled, as containerd's.
KUBELET_UNIT = f"""[Unit]
Description=kubelet
Wants=systemd-networkd.service containerd.service
After=systemd-networkd.service containerd.service
[Service]
ExecStart=/usr/local/bin/kubelet --config={KUBELET_DIR}/kubelet.json \\
  --kubeconfig={KUBELET_DIR}/kubelet.kubeconfig --node-ip={GUEST_ADDRESS} --v=2
Restart=always
RestartSec=2
[Install]
WantedBy=multi-user.target
"""

#: kube-proxy's unit (nftables mode); not enabled: a test writes its configuration and
#: credentials (KUBE_PROXY_CONFIG) and starts it.
KUBE_PROXY_CONFIG = f"{KUBELET_DIR}/kube-proxy.json"
KUBE_PROXY_UNIT = f"""[Unit]
Description=kube-proxy
Wants=systemd-networkd.service
After=systemd-networkd.service
[Service]
ExecStart=/usr/local/bin/kube-proxy --config={KUBE_PROXY_CONFIG} --v=2
Restart=always
RestartSec=2
[Install]
WantedBy=multi-user.target
"""

#: Where containerd looks for the CNI plugins (its default).
CNI_BIN_DIR = "/opt/cni/bin"

#: The guest's /etc files (beyond debootstrap's).
GUEST_FILES: dict[str, str] = {
    "etc/hostname": "nodedra-vm\n",
    "etc/hosts": "127.0.0.1 localhost\n127.0.1.1 nodedra-vm\n",
    "etc/fstab": "/dev/vda / ext4 rw,relatime 0 0\n",
    # No name server: the guest never resolves a name. containerd copies the file into
    # hostNetwork pods and fails their sandbox without it.
    "etc/resolv.conf": "# no name server: the VM node resolves nothing\n",
    "usr/local/sbin/nodedra-agent": AGENT_SCRIPT,
    "etc/systemd/system/nodedra-agent.service": AGENT_UNIT,
    "etc/containerd/config.toml": CONTAINERD_CONFIG,
    "etc/systemd/system/containerd.service": CONTAINERD_UNIT,
    # /run is a fresh tmpfs at each boot: the CDI directory of the running state is made anew.
    "etc/tmpfiles.d/cdi.conf": "d /run/cdi 0755 root root -\n",
    "etc/cdi/README": "CDI specs of the node (containerd's cdi_spec_dirs).\n",
    "etc/systemd/system/kubelet.service": KUBELET_UNIT,
    "etc/systemd/network/10-nodedra.network": NETWORK_UNIT,
    "etc/systemd/system/kube-proxy.service": KUBE_PROXY_UNIT,
    # The pod network: a bridge, addresses from host-local, masqueraded out of the NIC.
    "etc/cni/net.d/10-nodedra-pods.conflist": json.dumps(conflist(masquerade=True), indent=2)
    + "\n",
}

#: The disk's size: sparse, so it takes what the tree takes; the rest is room for what later
#: steps put on it (containerd, the kubelet, images).
DISK_BYTES = 4 << 30

_HOST_PACKAGES = {"qemu-system-x86_64": "qemu-system-x86", "qemu-img": "qemu-utils"}
_HOST_TOOLS = {"mkfs.ext4": "e2fsprogs", "dpkg-deb": "dpkg", "apt-get": "apt"}
_KEEP_ENTRIES = 2
_BUILD_PREFIX = ".vm-image-build-"
QBOOT = Path("/usr/share/qemu/qboot.rom")


class VMImageError(ImageBuildError):
    """The VM node's image could not be built; the message says what is missing."""


@dataclass(frozen=True)
class VMImage:
    """A built guest: what QEMU boots."""

    directory: Path
    kernel: Path
    """Uncompressed (ELF, PVH entry) for qboot."""
    initramfs: Path
    disk: Path
    """Raw ext4, the root filesystem (boot it with -snapshot to keep it as it is)."""
    kernel_version: str
    """``6.1.0-50-amd64``: the modules' directory name."""
    kernel_package: str
    """``linux-image-6.1.0-50-amd64 6.1.176-1``."""

    @classmethod
    def load(cls, directory: Path) -> VMImage:
        info = json.loads((directory / "image.json").read_text())
        return cls(
            directory,
            directory / "vmlinux",
            directory / "initramfs.cpio",
            directory / "disk.raw",
            info["kernel_version"],
            info["kernel_package"],
        )


def ensure_host_tools(log: Log = sys.stderr) -> None:
    """Install QEMU (and what the build runs) from Debian's packages when missing, as root;
    otherwise fail saying what to install."""
    wanted = {**_HOST_PACKAGES, **_HOST_TOOLS}
    missing = sorted({pkg for tool, pkg in wanted.items() if shutil.which(tool) is None})
    if not QBOOT.is_file():
        missing.append("qemu-system-x86")
    if missing:
        try:
            install_debian_packages(
                sorted(set(missing)),
                "the VM node (QEMU and its image build)",
                log,
                "Install them (Debian: apt-get install --no-install-recommends "
                "qemu-system-x86 qemu-utils debootstrap e2fsprogs).",
            )
        except PeerBuildError as err:
            raise VMImageError(str(err)) from None
    still = sorted(tool for tool in wanted if shutil.which(tool) is None)
    if still or not QBOOT.is_file():
        raise VMImageError(
            f"the VM node needs {', '.join(still) or QBOOT} after installing "
            "qemu-system-x86 qemu-utils e2fsprogs; install them"
        )


def pick_kernel() -> str:
    """The newest generic 6.1 kernel package apt-cache knows (e.g. linux-image-6.1.0-50-amd64)."""
    listed = subprocess.run(
        ["apt-cache", "pkgnames", "linux-image-6.1.0-"],
        capture_output=True,
        text=True,
        check=False,
    )
    found = [m for m in map(KERNEL_PATTERN.fullmatch, listed.stdout.split()) if m]
    if not found:
        raise VMImageError(
            f"apt-cache knows no package like {KERNEL_PATTERN.pattern} (exit "
            f"{listed.returncode}: {listed.stderr.strip()[-300:]}); run `apt-get update` with "
            f"Debian {SUITE} in apt's sources"
        )
    return max(found, key=lambda m: int(m.group(1))).group(0)


def guest_peer_names() -> list[str]:
    """The peers the guest carries: its programs and those of its images."""
    containerd = [containerd_peer(c, GUEST_CONTAINERD) for c in _CONTAINERD_COMMANDS]
    return [
        *containerd,
        "runc",
        "kubelet",
        "kube-proxy",
        *CNI_PLUGINS,
        "pause",
        "workload",
        "go-driver",
    ]


def guest_peers(log: Log = sys.stderr) -> PeerBinaries:
    """The peers' binaries the guest carries (cached, or built now)."""
    return ensure_binaries(log, guest_peer_names())


def guest_binaries(binaries: PeerBinaries) -> dict[str, Path]:
    """The guest's programs: path in the guest -> the peer's binary."""
    return {
        **{
            f"/usr/local/bin/{c}": binaries.containerd(GUEST_CONTAINERD, c)
            for c in _CONTAINERD_COMMANDS
        },
        "/usr/local/bin/runc": binaries.runc,
        "/usr/local/bin/kubelet": binaries.kubelet,
        "/usr/local/bin/kube-proxy": binaries.kube_proxy,
        **{f"{CNI_BIN_DIR}/{name}": binaries[name] for name in CNI_PLUGINS},
    }


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def guest_image_specs(binaries: PeerBinaries) -> tuple[ImageSpec, ...]:
    """The single-program images the guest carries: every node's (pause, workload) and the
    Go driver's, which the VM cluster deploys as a DaemonSet beside nodedra."""
    return (*node_image_specs(binaries), go_driver_daemonset.image_spec(binaries))


def recipe_key(kernel_package: str, binaries: PeerBinaries, images: Sequence[Path] = ()) -> str:
    """Everything that shapes the image, hashed: the cache entry's name (the peers' binaries,
    the node images' programs and the preloaded archives by their content, so a rebuilt peer
    or a new nodedra image rebuilds the image)."""
    digest = hashlib.sha256(VM_IMAGE_SCHEME.encode())
    carried = {
        **{f"bin:{name}": path for name, path in guest_binaries(binaries).items()},
        **{f"image/{spec.name}": spec.binary for spec in guest_image_specs(binaries)},
        **{f"archive/{path.name}": path for path in images},
    }
    parts = (
        SUITE,
        VARIANT,
        *PACKAGES,
        kernel_package,
        *MODULE_PRUNE,
        *INITRAMFS_MODULES,
        INIT_SCRIPT,
        *MASKED_UNITS,
        *(f"{path}={text}" for path, text in sorted(GUEST_FILES.items())),
        str(DISK_BYTES),
        *(f"{name}={_file_digest(path)}" for name, path in sorted(carried.items())),
    )
    for part in parts:
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


def ensure_vm_image(log: Log = sys.stderr, images: Sequence[Path] = ()) -> VMImage:
    """The VM node's image, with ``images`` (OCI archives, e.g. nodedra's) in its containerd
    beside the guest's own (pause, workload, the Go driver): cached, or built now (minutes)
    under a lock."""
    ensure_host_tools(log)
    kernel = pick_kernel()
    binaries = guest_peers(log)
    entry = cache_root() / f"vm-image-{recipe_key(kernel, binaries, images)}"
    with locked(cache_root() / ".vm-image.lock"):
        if (entry / "image.json").is_file():
            print(f"[vm] using the cached image {entry}", file=log, flush=True)
            return VMImage.load(entry)
        if os.geteuid() != 0:
            raise VMImageError(
                "building the VM node's image needs root (debootstrap, chroot, device nodes)"
            )
        _remove_stale_builds(log)
        started = time.monotonic()
        with tempfile.TemporaryDirectory(
            prefix=f"{_BUILD_PREFIX}{os.getpid()}-", dir=cache_root()
        ) as tmp:
            _build(Path(tmp), kernel, binaries, images, log)
            if entry.exists():
                shutil.rmtree(entry)
            # Complete or absent: the entry appears by one rename.
            os.chmod(tmp, 0o755)
            os.rename(tmp, entry)
            os.mkdir(tmp)  # for TemporaryDirectory's cleanup
        prune_cache_entries("vm-image-*", entry, _KEEP_ENTRIES, log)
        image = VMImage.load(entry)
        print(
            f"[vm] image ready in {time.monotonic() - started:.0f}s: {entry} (disk "
            f"{_used_mb(image.disk):.0f} MB used of {DISK_BYTES >> 30} GiB, kernel "
            f"{image.kernel_package})",
            file=log,
            flush=True,
        )
        return image


def _used_mb(path: Path) -> float:
    return path.stat().st_blocks * 512 / 1e6


def _remove_stale_builds(log: Log) -> None:
    """Working directories of builds whose process is gone (each some 700 MB)."""
    for path in cache_root().glob(f"{_BUILD_PREFIX}*"):
        pid = path.name[len(_BUILD_PREFIX) :].split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            print(f"[vm] removing the working directory of a build that is gone: {path}", file=log)
            shutil.rmtree(path, ignore_errors=True)


def _build(
    work: Path, kernel_package: str, binaries: PeerBinaries, images: Sequence[Path], log: Log
) -> None:
    ensure_debootstrap(log)
    transcript = work / "build.log"
    debs = work / "debs"
    debs.mkdir()
    print(f"[vm] building the VM image in {work}; log {transcript}", file=log, flush=True)
    _apt_download(kernel_package, debs)
    deb = next(debs.glob(f"{kernel_package}_*.deb"))
    kernel_tree = work / "kernel"
    run_step(
        ["dpkg-deb", "-x", str(deb), str(kernel_tree)],
        transcript,
        log,
        what=f"unpacking {deb.name}",
        hint="",
        timeout=600,
    )
    (version,) = [p.name for p in (kernel_tree / "lib" / "modules").iterdir()]
    rootfs = work / "rootfs"
    mirror = debian_mirror()
    run_debootstrap(
        PACKAGES,
        rootfs,
        mirror,
        transcript=transcript,
        log=log,
        needs=f"Debian {SUITE}'s packages.",
    )
    strip_rootfs(rootfs)
    _install_modules(kernel_tree / "lib" / "modules" / version, rootfs, transcript, log)
    _configure(rootfs)
    _install_runtime(rootfs, binaries)
    _preload_images(rootfs, binaries, images, work, transcript=transcript, log=log)
    _make_initramfs(kernel_tree / "lib" / "modules" / version, work / "initramfs.cpio", log)
    (work / "vmlinux").write_bytes(
        extract_vmlinux((kernel_tree / "boot" / f"vmlinuz-{version}").read_bytes())
    )
    disk = work / "disk.raw"
    with open(disk, "wb") as sparse:
        sparse.truncate(DISK_BYTES)
    run_step(
        ["mkfs.ext4", "-q", "-F", "-L", "nodedra-vm", "-d", str(rootfs), str(disk)],
        transcript,
        log,
        what="mkfs.ext4 -d of the guest's tree",
        hint="It needs e2fsprogs >= 1.43.",
        timeout=600,
    )
    shutil.rmtree(rootfs)
    shutil.rmtree(kernel_tree)
    shutil.rmtree(debs)
    (work / "image.json").write_text(
        json.dumps(
            {
                "kernel_version": version,
                "kernel_package": f"{kernel_package} {deb.name.split('_')[1]}",
                "packages": list(PACKAGES),
                "mirror": mirror,
            },
            indent=2,
        )
    )


def _apt_download(package: str, dest: Path) -> None:
    """``apt-get download``; a fresh machine may need ``apt-get update`` first."""
    argv = ["apt-get", "download", package]
    got = subprocess.run(argv, cwd=dest, capture_output=True, text=True, check=False)
    if got.returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, check=False)
        got = subprocess.run(argv, cwd=dest, capture_output=True, text=True, check=False)
    if got.returncode != 0:
        raise VMImageError(
            f"`apt-get download {package}` failed (exit {got.returncode}): "
            f"{got.stderr.strip()[-400:]}"
        )


def _install_modules(modules: Path, rootfs: Path, transcript: Path, log: Log) -> None:
    """The kernel's modules, less MODULE_PRUNE, into the guest, indexed by its depmod."""
    dest = rootfs / "lib" / "modules" / modules.name
    shutil.copytree(modules, dest, symlinks=True)
    for relative in MODULE_PRUNE:
        shutil.rmtree(dest / "kernel" / relative, ignore_errors=True)
    run_step(
        ["chroot", str(rootfs), "depmod", modules.name],
        transcript,
        log,
        what="depmod in the guest's tree",
        hint="",
        timeout=600,
    )


def _configure(rootfs: Path) -> None:
    for relative, text in GUEST_FILES.items():
        path = rootfs / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (rootfs / "usr/local/sbin/nodedra-agent").chmod(0o755)
    systemd = rootfs / "etc/systemd/system"
    for unit in MASKED_UNITS:
        (systemd / unit).unlink(missing_ok=True)
        (systemd / unit).symlink_to("/dev/null")
    wants = systemd / "multi-user.target.wants"
    wants.mkdir(exist_ok=True)
    (wants / "nodedra-agent.service").symlink_to("/etc/systemd/system/nodedra-agent.service")
    # Enabled by its package: every other test expects the interrupts where the kernel put
    # them.
    (wants / "irqbalance.service").unlink(missing_ok=True)


def _install_runtime(rootfs: Path, binaries: PeerBinaries) -> None:
    """containerd, its shim, ctr, runc, the kubelet, kube-proxy and the CNI plugins
    (guest_binaries)."""
    for name, path in guest_binaries(binaries).items():
        dest = rootfs / name.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)
        dest.chmod(0o755)


def _preload_images(
    rootfs: Path,
    binaries: PeerBinaries,
    images: Sequence[Path],
    work: Path,
    *,
    transcript: Path,
    log: Log,
) -> None:
    """Import the guest's images (pause, workload, the Go driver) and ``images`` into its
    containerd store, with the guest's containerd run here, on the tree: inside the guest,
    under TCG, ``ctr images import`` of nodedra's 317 MB image ran for over 10 minutes
    (hashing and unpacking in emulation), here it takes seconds. The store is containerd's
    own layout (content, metadata, overlayfs snapshots), relative to its root, so the guest's
    containerd finds the images unpacked, as after a pull. containerd runs without its CRI
    plugins, in a mount namespace of its own (unpacking mounts), and is stopped before mkfs."""
    archives = work / "archives"
    archives.mkdir()
    node_archives = []
    for spec in guest_image_specs(binaries):
        node_archives.append(archives / f"{spec.path_in_image}.tar")
        write_image_archive(spec, node_archives[-1])
    state = work / "containerd-state"
    state.mkdir()
    socket_path = state / "containerd.sock"
    config = work / "containerd-build.toml"
    config.write_text(
        f"""version = 3
root = '{rootfs / CONTAINERD_ROOT.lstrip("/")}'
state = '{state}'
disabled_plugins = ['io.containerd.grpc.v1.cri', 'io.containerd.cri.v1.runtime',
  'io.containerd.cri.v1.images', 'io.containerd.nri.v1.nri']
[grpc]
  address = '{socket_path}'
"""
    )
    containerd = binaries.containerd(GUEST_CONTAINERD, "containerd")
    ctr = binaries.containerd(GUEST_CONTAINERD, "ctr")
    daemon = PeerProcess(
        "containerd (the image import)",
        ["unshare", "--mount", "--propagation", "private", str(containerd), "--config",
         str(config)],
        work / "containerd.log",
    )  # fmt: skip
    try:
        try:
            daemon.wait_until(socket_path.exists, 60, "its socket appeared")
        except PeerProcessError as err:
            raise VMImageError(f"containerd for the image import did not start: {err}") from err
        for archive in [*node_archives, *images]:
            run_step(
                [str(ctr), "--address", str(socket_path), "-n", "k8s.io", "images",
                 "import", "--snapshotter", "overlayfs", str(archive)],
                transcript, log, what=f"importing {archive.name} into the guest's containerd",
                hint="", timeout=600,
            )  # fmt: skip
    finally:
        daemon.stop(grace=30)
    shutil.rmtree(state, ignore_errors=True)
    shutil.rmtree(archives)


def _make_initramfs(modules: Path, out: Path, log: Log) -> None:
    """busybox, /init and INITRAMFS_MODULES as an uncompressed newc cpio (busybox's cpio:
    the machine may have none)."""
    busybox = busybox_binary(log)
    with tempfile.TemporaryDirectory(prefix="initramfs-") as tmp:
        root = Path(tmp)
        for directory in ("bin", "modules", "dev", "proc", "sys", "newroot"):
            (root / directory).mkdir()
        shutil.copy2(busybox, root / "bin" / "busybox")
        (root / "init").write_text(INIT_SCRIPT)
        (root / "init").chmod(0o755)
        for name in INITRAMFS_MODULES:
            found = sorted(modules.rglob(f"{name}.ko"))
            if len(found) != 1:
                raise VMImageError(f"the kernel has {len(found)} modules {name}.ko: {found}")
            shutil.copy2(found[0], root / "modules" / f"{name}.ko")
        (root / "modules.order").write_text("\n".join(INITRAMFS_MODULES) + "\n")
        names = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
        with open(out, "wb") as stream:
            subprocess.run(
                [str(busybox), "cpio", "-o", "-H", "newc"],
                cwd=root,
                check=True,
                input="\n".join(names).encode() + b"\n",
                stdout=stream,
                stderr=subprocess.DEVNULL,
            )


_XZ_MAGIC = b"\xfd7zXZ\x00"


def extract_vmlinux(bzimage: bytes) -> bytes:
    """The ELF kernel inside a bzImage whose payload is xz-compressed (Debian's): qboot boots
    it by its PVH entry, without the decompression stage."""
    start = bzimage.find(_XZ_MAGIC)
    while start >= 0:
        try:
            elf = lzma.LZMADecompressor(lzma.FORMAT_XZ).decompress(bzimage[start:])
        except lzma.LZMAError:
            elf = b""
        if elf.startswith(b"\x7fELF"):
            return elf
        start = bzimage.find(_XZ_MAGIC, start + 1)
    raise VMImageError("no xz-compressed ELF kernel found in the vmlinuz")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.peers.vm_image [ARCHIVE...]``: the image, with the OCI archives given
    preloaded (the tests preload nodedra's, tests.peers.image)."""
    archives = [Path(arg) for arg in (sys.argv[1:] if argv is None else argv)]
    started = time.monotonic()
    try:
        image = ensure_vm_image(images=archives)
    except (VMImageError, ImageBuildError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(image.directory)
    print(f"[vm] ready in {time.monotonic() - started:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
