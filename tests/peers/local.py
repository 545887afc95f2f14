"""nodedra on this machine, in a whole local cluster, with a demo pod: `tox -e local`.

    python -m tests.peers.local                    # demo, then serve until Ctrl-C
    python -m tests.peers.local --exit-after-demo  # demo, stop, exit 0 if every step worked

It builds (or finds) the peers, starts etcd, kube-apiserver, kube-scheduler and
kube-controller-manager, and a real node on this machine: the kubelet, containerd and runc
(tests.peers.node). It applies what a cluster admin applies from manifests/, gives nodedra the
credentials its DaemonSet pod would have (a token bound to a pod on this node), and starts
`python -m nodedra run` reading this machine's /sys, registered with the node's kubelet and
pinning containers through its containerd (NRI). Then two pods run: one without a claim and
one that asks for one CPU and 64 MiB through a ResourceClaimTemplate. The demo prints what
happened at every step, the devices published, the allocation, the CDI spec, the claim's
status as nodedra wrote it, side by side the CPUs the claim holds and the CPUs each
container reports it runs on, and what `nodedra status` draws of the node's CPUs.

Nothing is installed on the machine and nothing of the node leaks onto it: every process is a
child of this one, every file is under one temporary directory, and Ctrl-C stops it all. Once
the peers are built, the demo moves into a network namespace of its own (tests.peers.netns),
so its traffic never reaches the machine's network; `nsenter --net=/proc/<pid>/ns/net`
enters it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import yaml

from nodedra.resmgr import Checkpoint
from nodedra.topology import format_cpu_list, parse_cpu_list
from tests.peers.build import PeerBinaries, ensure_binaries
from tests.peers.cache import PeerBuildError, cache_root
from tests.peers.cluster import (
    ensure_test_namespace,
    get_claim,
    pod_claim_name,
    resource_slices,
    wait_pod_scheduled,
)
from tests.peers.controlplane import ControlPlane
from tests.peers.netns import (
    NODE_ADDRESS,
    NetworkNamespaceError,
    enter_private_network,
    in_private_network,
)
from tests.peers.node import RealNode
from tests.peers.nodedra_node import (
    MANIFESTS,
    TOPOLOGY_AWARE,
    NodeDirs,
    NodedraProcess,
    apply_objects,
    claim_template,
    env_of_spec,
    expected_devices,
    install_nodedra,
    load_manifests,
    pod_identity,
    wait_claim_status,
    write_config,
)
from tests.peers.pods import create_pod, wait_pod_running, wait_reports, workload_pod

DEMO_NAMESPACE = "nodedra-demo"
DEMO_TEMPLATE = "one-cpu"
DEMO_POD = "one-cpu"
SHARED_POD = "no-claim"
DEMO_CAPACITY = {"cpu": "1", "memory": "64Mi"}
#: CPU 0 stays for the containers without claims (pinning needs one), so that on a machine
#: of two CPUs the demo pod gets the other.
DEMO_CONFIG = {"policy": "topology-aware", "reservedCPUs": "0"}


class DemoError(RuntimeError):
    """A step of the demo failed; the message says which and why."""


def node_name_of_host(hostname: str | None = None) -> str:
    """This machine's name as a Node name: a lowercase DNS subdomain (RFC 1123)."""
    name = (hostname or socket.gethostname()).lower()
    name = re.sub(r"[^a-z0-9.-]+", "-", name)
    name = re.sub(r"-*\.+-*", ".", name).strip(".-")[:253].strip(".-")
    return name or "localhost"


def say(message: str) -> None:
    print(message, flush=True)


def section(title: str) -> None:
    print(f"\n=== {title}", flush=True)


def indent(text: str, prefix: str = "    ") -> str:
    return "".join(prefix + line for line in text.splitlines(keepends=True))


def _quantity(value: object) -> str:
    """A byte count as people read it, next to the exact value the API shows."""
    text = str(value)
    if not text.isdigit() or int(text) < 1 << 20:
        return text
    size = int(text)
    unit = "GiB" if size >= 1 << 30 else "MiB"
    return f"{text} ({size / (1 << (30 if unit == 'GiB' else 20)):.1f} {unit})"


class Demo:
    """Every process and file of one demo run; `close()` stops them all, newest first."""

    def __init__(self, node_name: str, workdir: Path, sysfs: Path) -> None:
        self.node_name = node_name
        self.workdir = workdir
        self.sysfs = sysfs
        self.cp: ControlPlane | None = None
        self.node: RealNode | None = None
        self.nodedra: NodedraProcess | None = None
        self.dirs = NodeDirs.under(workdir / "node")
        self.config = write_config(workdir / "config.yaml", DEMO_CONFIG)

    # -- bringing it up ------------------------------------------------------------------------

    def peers(self) -> PeerBinaries:
        say(f"building peers (first time: ~9 min, later runs reuse {cache_root()})...")
        started = time.monotonic()
        try:
            binaries = ensure_binaries(log=_Prefixed(sys.stdout, "  "))
        except PeerBuildError as err:
            raise DemoError(f"the peers are unavailable: {err}") from None
        say(f"peers ready in {time.monotonic() - started:.1f} s")
        # Built: from here on nothing needs the machine's network. Every process of the demo
        # runs in a network namespace of its own, as in the tests (tests.peers.netns): the
        # node's address lives there.
        try:
            name = enter_private_network()
        except NetworkNamespaceError as err:
            raise DemoError(f"the real node needs a network namespace of its own: {err}") from None
        say(f"the demo runs in a private network namespace ({name}): lo and {NODE_ADDRESS}")
        return binaries

    def control_plane(self, binaries: PeerBinaries) -> ControlPlane:
        started = time.monotonic()
        self.cp = ControlPlane(binaries, self.workdir / "cp")
        self.cp.start()
        say(f"control plane up in {time.monotonic() - started:.1f} s at {self.cp.url}")
        started = time.monotonic()
        self.cp.start_workload_controllers()
        say(f"scheduler and controller-manager up in {time.monotonic() - started:.1f} s")
        return self.cp

    def start_node(self, cp: ControlPlane, binaries: PeerBinaries) -> RealNode:
        applied = install_nodedra(cp)
        kinds = ", ".join(f"{o['kind']} {o['metadata']['name']}" for o in applied)
        say(f"admin manifests applied (server-side): {kinds}")
        started = time.monotonic()
        self.node = RealNode(
            binaries, cp, self.node_name, self.workdir / "n", cdi_dir=self.dirs.cdi
        )
        self.node.start()
        say(
            f"node {self.node_name} Ready in {time.monotonic() - started:.1f} s: kubelet "
            f"{self.node.node()['status']['nodeInfo']['kubeletVersion']}, "
            f"{self.node.runtime.name}, runc; NRI on {self.node.nri_socket}"
        )
        return self.node

    def start_nodedra(self, cp: ControlPlane, node: RealNode) -> NodedraProcess:
        identity = pod_identity(
            cp, self.node_name, self.workdir / "identity", expiration_seconds=7 * 24 * 3600
        )
        say(
            f"nodedra's identity: pod nodedra/{identity.pod_name} bound to {self.node_name}, "
            "ServiceAccount token bound to that pod (TokenRequest)"
        )
        self.nodedra = NodedraProcess(
            name="nodedra",
            node_name=self.node_name,
            kubeconfig=identity.kubeconfig,
            registry_dir=node.registry_dir,
            dirs=self.dirs,
            sysfs=self.sysfs,
            config=self.config,
            log_path=self.workdir / "nodedra.log",
            pinning="required",
            nri_socket=node.nri_socket,
        )
        started = time.monotonic()
        self.nodedra.start()
        say(f"nodedra run started (pid {self.nodedra.pid}), log {self.nodedra.log_path}")
        devices = len(expected_devices(self.sysfs, self.config)["topology-aware"])
        self.nodedra.wait_ready(cp, self.node_name, TOPOLOGY_AWARE)
        say(
            f"nodedra registered with the kubelet, published {devices} device(s) and "
            f"synchronized with containerd in {time.monotonic() - started:.1f} s"
        )
        return self.nodedra

    # -- the demo pod ---------------------------------------------------------------------------

    def run_pods(self, cp: ControlPlane) -> None:
        """The demo: slices, a pod's claim allocated, prepared, described; where it runs."""
        self.show_slices(cp)
        ensure_test_namespace(cp, DEMO_NAMESPACE)
        create_pod(cp, DEMO_NAMESPACE, self.probe(SHARED_POD))
        wait_pod_running(cp, DEMO_NAMESPACE, SHARED_POD)
        claim = self.schedule_pod(cp)
        uid = claim["metadata"]["uid"]
        started = time.monotonic()
        wait_pod_running(cp, DEMO_NAMESPACE, DEMO_POD)
        elapsed = time.monotonic() - started
        section(f"the kubelet prepared the claim and started the pod ({elapsed:.1f} s)")
        self.show_spec(uid)
        entries = wait_claim_status(
            cp, DEMO_NAMESPACE, claim["metadata"]["name"], TOPOLOGY_AWARE, present=True
        )
        section(f"claim {claim['metadata']['name']} status.devices, written by nodedra")
        print(indent(yaml.safe_dump(entries, sort_keys=False)), end="", flush=True)
        self.show_where_they_run(cp, uid)
        self.show_status()
        self.show_metrics()

    def probe(self, name: str, template: str | None = None) -> dict[str, Any]:
        """A pod running the probe, which reports the CPUs it may use every second."""
        claims = [{"name": "cpus", "resourceClaimTemplateName": template}] if template else []
        return workload_pod(
            name,
            node_selector={"kubernetes.io/hostname": self.node_name},
            report_interval="1s",
            claims=claims,
        )

    def show_where_they_run(self, cp: ControlPlane, uid: str) -> None:
        """The claim's CPUs beside the CPUs each container says it runs on."""
        state = Checkpoint(self.dirs.checkpoint).load()
        if state is None or uid not in state.claims:
            raise DemoError(f"claim {uid} is not in nodedra's checkpoint")
        claimed = frozenset().union(
            *(parse_cpu_list(g["cpus"]) for g in state.claims[uid]["grants"])
        )
        section("where the containers run (what each reports of /proc/self/status)")
        say(f"  the claim holds CPUs {format_cpu_list(claimed)} (nodedra's checkpoint)")
        for pod, wanted in ((DEMO_POD, claimed), (SHARED_POD, None)):
            report = self.wait_report(cp, pod, wanted, claimed)
            say(
                f"  pod {pod}: Cpus_allowed_list {report['cpus_allowed_list']}, "
                f"Mems_allowed_list {report['mems_allowed_list']}, cgroup cpuset.cpus "
                f"{report['cgroup']['cpus']}"
            )

    def wait_report(
        self, cp: ControlPlane, pod: str, wanted: frozenset[int] | None, claimed: frozenset[int]
    ) -> dict[str, Any]:
        """The probe's first report that shows the pinning (``wanted``, or none of ``claimed``)."""
        deadline = time.monotonic() + 30
        while True:
            report = wait_reports(cp, DEMO_NAMESPACE, pod)[-1]
            cpus = parse_cpu_list(report["cpus_allowed_list"])
            if (cpus == wanted) if wanted is not None else (cpus and not cpus & claimed):
                return report
            if time.monotonic() > deadline:
                raise DemoError(f"pod {pod} runs on CPUs {format_cpu_list(cpus)}: {report}")
            time.sleep(0.5)

    def show_status(self) -> None:
        """What `nodedra status` says, run on this node against the running instance."""
        nodedra = self.nodedra
        assert nodedra is not None
        address = f"127.0.0.1:{nodedra.status_port}"
        section(f"nodedra status --address {address} (who holds each CPU, checked in /proc)")
        done = subprocess.run(
            [sys.executable, "-m", "nodedra", "status", "--address", address],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            raise DemoError(f"nodedra status failed ({done.returncode}): {done.stderr}")
        print(indent(done.stdout), end="", flush=True)

    def show_slices(self, cp: ControlPlane) -> None:
        section("ResourceSlices of this node, published by nodedra")
        for item in resource_slices(cp, self.node_name, TOPOLOGY_AWARE):
            spec = item["spec"]
            say(
                f"  {item['metadata']['name']}: driver {spec['driver']}, pool "
                f"{spec['pool']['name']} (generation {spec['pool']['generation']})"
            )
            for device in spec.get("devices") or []:
                attrs = " ".join(
                    f"{k.rsplit('/', 1)[-1]}={next(iter(v.values()))}"
                    for k, v in sorted(device.get("attributes", {}).items())
                )
                capacity = ", ".join(
                    f"{k}={_quantity(v['value'])}"
                    for k, v in sorted(device.get("capacity", {}).items())
                )
                shared = (
                    ", allowMultipleAllocations" if device.get("allowMultipleAllocations") else ""
                )
                say(f"    {device['name']}: {attrs}; capacity {capacity}{shared}")

    def schedule_pod(self, cp: ControlPlane) -> dict[str, Any]:
        """Create the sample and wait for the scheduler; the pod's allocated claim."""
        section("the demo pod")
        apply_objects(cp, load_manifests([MANIFESTS / "deviceclasses.yaml"]))
        say("  DeviceClass topology-aware.nri.io applied (manifests/deviceclasses.yaml)")
        cp.request(
            "POST",
            f"/apis/resource.k8s.io/v1/namespaces/{DEMO_NAMESPACE}/resourceclaimtemplates",
            claim_template(DEMO_TEMPLATE, TOPOLOGY_AWARE, DEMO_CAPACITY),
        )
        say(
            f"  ResourceClaimTemplate {DEMO_NAMESPACE}/{DEMO_TEMPLATE}: one device of class "
            f"{TOPOLOGY_AWARE}, capacity cpu {DEMO_CAPACITY['cpu']}, memory "
            f"{DEMO_CAPACITY['memory']}"
        )
        create_pod(cp, DEMO_NAMESPACE, self.probe(DEMO_POD, DEMO_TEMPLATE))
        started = time.monotonic()
        say(f"  Pod {DEMO_NAMESPACE}/{DEMO_POD} created (nodeSelector: this node)")
        pod = wait_pod_scheduled(cp, DEMO_NAMESPACE, DEMO_POD)
        claim_name = pod_claim_name(pod, "cpus")
        if claim_name is None:
            raise DemoError(f"pod scheduled but it names no claim: {pod.get('status')}")
        say(
            f"  scheduled to {pod['spec']['nodeName']} in {time.monotonic() - started:.1f} s; "
            f"its claim {claim_name} is allocated"
        )
        claim = get_claim(cp, DEMO_NAMESPACE, claim_name)
        section(
            f"claim {DEMO_NAMESPACE}/{claim_name} (uid {claim['metadata']['uid']}), "
            "allocated by the scheduler"
        )
        for result in claim["status"]["allocation"]["devices"]["results"]:
            consumed = ", ".join(
                f"{k} {_quantity(v)}"
                for k, v in sorted((result.get("consumedCapacity") or {}).items())
            )
            say(
                f"  request {result['request']}: driver {result['driver']}, pool "
                f"{result['pool']}, device {result['device']}; consumedCapacity: "
                f"{consumed or 'none (the whole device)'}"
            )
        reserved = [r["name"] for r in claim["status"].get("reservedFor") or []]
        say(f"  reserved for pod(s): {', '.join(reserved)}")
        for status in pod["status"].get("nodeAllocatableResourceClaimStatuses") or []:
            counted = ", ".join(
                f"{m['name']} {_quantity(m['quantity'])}" for m in status["mapping"]
            )
            say(f"  counted against the node's allocatable (pod status): {counted}")
        return claim

    def show_spec(self, uid: str) -> None:
        spec_path = self.dirs.spec_path(TOPOLOGY_AWARE, uid)
        if not spec_path.exists():
            raise DemoError(f"no CDI spec at {spec_path}")
        text = spec_path.read_text()
        section(f"CDI spec {spec_path}")
        print(indent(text), end="", flush=True)
        env = env_of_spec(yaml.safe_load(text))
        section("what the container gets (the DRA_* environment of the spec)")
        suffix = f"{uid.replace('-', '_')}_0"
        for key in ("CPUSET", "MEMSET", "MEMORY"):
            if f"DRA_{key}_{suffix}" not in env:
                raise DemoError(f"the CDI spec sets no DRA_{key}_{suffix}: {env}")
        memory = int(env[f"DRA_MEMORY_{suffix}"])
        say(f"  CPUs:        {env[f'DRA_CPUSET_{suffix}']}")
        say(f"  NUMA nodes:  {env[f'DRA_MEMSET_{suffix}']}")
        say(f"  memory:      {memory} bytes ({memory / (1 << 20):g} MiB)")

    def show_metrics(self) -> None:
        nodedra = self.nodedra
        assert nodedra is not None
        section("nodedra's metrics and health")
        prepared = nodedra.metric("nodedra_requests_total", {"kind": "prepare", "result": "ok"})
        say(f"  nodedra_requests_total{{kind=prepare,result=ok}} {prepared:g}")
        for metric in (
            "nodedra_devices_published",
            "nodedra_claims_held",
            "nodedra_nri_connected",
            "nodedra_containers",
            "nodedra_pinned_containers",
            "nodedra_shared_cpus",
        ):
            say(f"  {metric} {nodedra.metric(metric) or 0:g}")
        status, body = nodedra.readyz()
        say(f"  /readyz: {status} {json.dumps(json.loads(body), sort_keys=True)}")

    # -- tearing it down ------------------------------------------------------------------------

    def stop_nodedra(self) -> int:
        """SIGTERM nodedra as the kubelet would; its exit status."""
        if self.nodedra is None:
            return 0
        nodedra, self.nodedra = self.nodedra, None
        started = time.monotonic()
        code = nodedra.terminate(timeout=30)
        say(f"nodedra stopped with exit status {code} in {time.monotonic() - started:.1f} s")
        return code

    def close(self) -> None:
        self.stop_nodedra()
        if self.node is not None:
            self.node.stop()
            self.node = None
        if self.cp is not None:
            self.cp.stop()
            self.cp = None

    def log_tails(self) -> Mapping[str, str]:
        tails: dict[str, str] = {}
        if self.nodedra is not None:
            tails.update(self.nodedra.log_tails(30))
        if self.node is not None:
            tails.update(self.node.log_tails(20))
        return tails


class _Prefixed:
    """A text stream that indents what is written to it (the peer build's progress)."""

    def __init__(self, stream: TextIO, prefix: str) -> None:
        self._stream = stream
        self._prefix = prefix

    def write(self, text: str) -> int:
        self._stream.write(indent(text, self._prefix))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Let SIGTERM stop the demo as Ctrl-C does: cleanly."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _serve(demo: Demo) -> None:
    """Keep everything up until Ctrl-C; fail if nodedra goes away by itself."""
    nodedra = demo.nodedra
    assert nodedra is not None
    section("serving")
    # The addresses below are in the demo's network namespace: another shell reaches them
    # through nsenter.
    enter = f"nsenter --net=/proc/{os.getpid()}/ns/net " if in_private_network() else ""
    say(
        f"  nodedra keeps serving node {demo.node_name}. Look around with:\n"
        f"    export KUBECONFIG={demo.cp.admin_kubeconfig if demo.cp else ''}\n"
        f"    {enter}kubectl get resourceslices,deviceclasses; {enter}kubectl -n "
        f"{DEMO_NAMESPACE} get resourceclaims -o yaml\n"
        f"  metrics: {enter}curl http://127.0.0.1:{nodedra.metrics_port}/metrics, "
        f"health: {enter}curl http://127.0.0.1:{nodedra.health_port}/healthz\n"
        "  Ctrl-C stops everything."
    )
    while nodedra.alive():
        time.sleep(0.5)
    raise DemoError(f"nodedra exited by itself with status {nodedra.returncode}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.peers.local",
        description="nodedra on this machine in a local cluster, with a demo pod.",
    )
    parser.add_argument(
        "--exit-after-demo", action="store_true", help="stop right after the demo (exit 0: ok)"
    )
    parser.add_argument("--node-name", help="the Node's name (default: this host's name)")
    parser.add_argument("--sysfs", default="/sys", help="the sysfs nodedra reads (default /sys)")
    parser.add_argument(
        "--keep", action="store_true", help="keep the working directory (logs) after a success"
    )
    args = parser.parse_args(argv)
    node_name = args.node_name or node_name_of_host()
    # Short: the plugin sockets live below it (at most 107 bytes for a socket path).
    workdir = Path(tempfile.mkdtemp(prefix="nodedra-local-"))
    say(f"nodedra local demo: node {node_name}, sysfs {args.sysfs}, working directory {workdir}")
    demo = Demo(node_name, workdir, Path(args.sysfs))
    ok = serving = False
    with _sigterm_as_interrupt():
        try:
            binaries = demo.peers()
            cp = demo.control_plane(binaries)
            node = demo.start_node(cp, binaries)
            demo.start_nodedra(cp, node)
            demo.run_pods(cp)
            section("demo done: every step worked")
            if args.exit_after_demo:
                code = demo.stop_nodedra()
                if code != 0:
                    raise DemoError(f"nodedra exited with status {code} on SIGTERM")
            else:
                serving = True
                _serve(demo)
            ok = True
        except KeyboardInterrupt:
            say("\ninterrupted: stopping everything")
            ok = serving  # a demo cut short did not show that everything works
        except Exception as err:
            say(f"\nFAILED: {type(err).__name__}: {err}")
            for name, text in demo.log_tails().items():
                say(f"--- {name}")
                say(indent(text or "(empty)"))
        finally:
            demo.close()
            say("all processes stopped")
    if ok and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        say(f"logs kept in {workdir}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
