"""The CPU map: ``/status`` built from a real manager and policy, served by the real WSGI
server, checked against a /proc tree and drawn by ``nodedra status``.

The manager pins through its own RuntimeOwner (``ContainerPinner``), driven as the NRI
plugin drives it; nothing connects to a runtime (the socket does not exist). /proc trees
are written to scratch directories, beside one look at this machine's own /proc.
"""

from __future__ import annotations

import io
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nodedra import cpumap, endpoints, httpserver, status
from nodedra.cli import main
from nodedra.dra import ClaimRef, driver_name
from nodedra.nri import Container, CPUSet, PluginOptions, Pod
from nodedra.observability import Metrics
from nodedra.policy import Grant, make_policy, parse_config
from nodedra.policy.ledger import env_suffix
from nodedra.resmgr import ManagerOptions, ResourceManager
from nodedra.resmgr.pinning import Books, ContainerView, Holdings, Reservation
from nodedra.statuscopy import StatusCopy
from nodedra.topology import CPU, NUMANode, Topology, format_cpu_list, parse_cpu_list
from tests.unit.dra.fakes import NODE, FakeCluster, make_claim, result
from tests.unit.policy.conftest import topology

SHAPE = "two-socket-smt2-numa4"
RESERVED = "0,28"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
POD = Pod("sandbox-1", "pod-uid-1", "shop", "checkout")
OTHER = Pod("sandbox-2", "pod-uid-2", "shop", "cart")


class Node:
    """A started manager with a real policy, pinning on (best effort, no runtime)."""

    def __init__(self, tmp: Path, policy: str) -> None:
        self.policy_name = policy
        self.driver = driver_name(policy)
        self.topology = topology(SHAPE)
        self.cluster = FakeCluster()
        self.manager = ResourceManager(
            make_policy(self.topology, parse_config({"policy": policy, "reservedCPUs": RESERVED})),
            self.cluster,
            ManagerOptions(
                node_name=NODE,
                state_dir=tmp / "state",
                registrar_dir=tmp / "registry",
                plugin_data_dir=tmp / "plugin",
                cdi_dir=tmp / "cdi",
                pinning="best-effort",
                nri=PluginOptions(socket_path=tmp / "no-runtime.sock"),
            ),
            lambda reason: None,
        )
        self.manager.start()

    def prepare(self, uid: str, name: str, device: str, pod: Pod) -> frozenset[int]:
        """A claim reserved for ``pod``, prepared as the kubelet does; its CPUs."""
        extra = {"consumedCapacity": {"cpu": "2"}} if self.policy_name == "topology-aware" else {}
        claim = make_claim(
            uid,
            [result("cpus", device, driver=self.driver, pool=NODE, **extra)],
            namespace="shop",
            name=name,
        )
        claim["status"]["reservedFor"] = [{"resource": "pods", "name": pod.name, "uid": pod.uid}]
        self.cluster.claims[("shop", name)] = claim
        answer = self.manager.plugin.node_prepare([ClaimRef("shop", name, uid)])[uid]
        assert answer.error is None
        return frozenset().union(*(g.cpus for g in self.manager.policy.grants(uid)))

    def device(self, index: int) -> str:
        return f"cpudevnuma00{index}" if self.policy_name == "topology-aware" else f"cpu00{index}"


@pytest.fixture(params=["topology-aware", "static"])
def node(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path, request.param)
    yield n
    n.manager.stop()


def holding(uid: str, pod: Pod, name: str = "main") -> Container:
    """A container naming claim ``uid``'s result 0 in its environment (no CDI names)."""
    env = frozenset({f"DRA_CPUSET_{env_suffix(uid, 0)}", "PATH"})
    return Container(f"ctr-{pod.name}-{name}", pod.id, name, (), env, CPUSet(""))


def plain(pod: Pod, name: str) -> Container:
    return Container(f"ctr-{pod.name}-{name}", pod.id, name, (), frozenset(), CPUSet(""))


def every_cpu(cpu_map: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for n in cpu_map["numa_nodes"] for core in n["cores"] for c in core["cpus"]]


def test_the_map_says_who_holds_each_cpu_and_where_containers_should_run(node: Node) -> None:
    first = node.prepare("uid-a", "checkout-cpus", node.device(1), POD)
    pinner = node.manager.containers
    assert pinner is not None
    pinner.synchronize([POD, OTHER], [holding("uid-a", POD), plain(OTHER, "web")])

    cpu_map = status.cpu_map(node.manager, node.topology, NODE)
    assert cpu_map is not None
    cpus = every_cpu(cpu_map)
    assert sorted(c["id"] for c in cpus) == sorted(node.topology.cpus), "every CPU, once"
    by_state: dict[str, set[int]] = {}
    for cpu in cpus:
        by_state.setdefault(cpu["state"], set()).add(cpu["id"])
    assert by_state["claimed"] == first
    assert {c["claim"] for c in cpus if c["state"] == "claimed"} == {"uid-a"}
    assert by_state["reserved"] == parse_cpu_list(RESERVED)
    isolated = node.topology.isolated
    assert isolated, "the fixture isolates CPUs"
    assert by_state["isolated"] == isolated - first, "kept for claims, out of the shared pool"
    shared = set(node.topology.cpus) - first - isolated
    assert by_state["shared"] == shared - parse_cpu_list(RESERVED)
    assert parse_cpu_list(cpu_map["shared"]) == shared
    for numa in cpu_map["numa_nodes"]:  # each core's threads, in their NUMA node
        for core in numa["cores"]:
            ids = {c["id"] for c in core["cpus"]}
            assert all(node.topology.cpus[i].siblings == ids for i in ids)
            assert all(node.topology.cpus[i].node == numa["id"] for i in ids)

    (claim,) = cpu_map["claims"]
    assert (claim["uid"], claim["namespace"], claim["name"]) == ("uid-a", "shop", "checkout-cpus")
    assert claim["pods"] == [{"uid": POD.uid, "namespace": "shop", "name": "checkout"}]
    assert parse_cpu_list(claim["cpus"]) == first
    assert [(r["request"], r["device"]) for r in claim["results"]] == [("cpus", node.device(1))]

    on_claim, on_pool = cpu_map["containers"]
    assert (on_claim["pod"]["name"], on_claim["name"], on_claim["claims"]) == (
        "checkout",
        "main",
        {"uid-a": [0]},
    )
    assert parse_cpu_list(on_claim["cpus"]) == first
    assert on_claim["in_sync"] is True, "the Synchronize's answer told the runtime"
    assert on_pool["claims"] == {}
    assert on_pool["cpus"] == cpu_map["shared"]
    assert cpu_map["runtime_connected"] is False
    assert json.loads(json.dumps(cpu_map)) == cpu_map, "plain JSON"

    # A second claim for the running cart pod: its container is behind until updated.
    second = node.prepare("uid-b", "cart-cpus", node.device(2), OTHER)
    cpu_map = status.cpu_map(node.manager, node.topology, NODE)
    assert cpu_map is not None
    assert [c["uid"] for c in cpu_map["claims"]] == ["uid-a", "uid-b"], "by their first CPU"
    assert not second & parse_cpu_list(cpu_map["shared"])
    (web,) = [c for c in cpu_map["containers"] if c["name"] == "web"]
    assert parse_cpu_list(web["cpus"]) == set(node.topology.cpus) - first - second - isolated
    assert web["in_sync"] is False, "told the old pool"


def test_the_map_is_not_read_while_anyone_holds_the_lock(node: Node) -> None:
    """A reader of the books never makes the kubelet or the runtime wait for it: it does
    not wait for the lock either, and tries again later."""
    assert node.manager.holdings() is not None
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        with node.manager:
            taken.set()
            done.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert taken.wait(10)
        assert node.manager.holdings() is None
    finally:
        done.set()
        holder.join(10)
    assert node.manager.holdings() is not None


def test_readers_get_the_copy_and_never_the_lock(node: Node) -> None:
    """Sixteen readers while a runtime event holds the lock: each answered at once, from the
    copy taken before; the copy is taken again, once, after the books changed."""
    copy = StatusCopy(node.manager, node.topology, NODE)
    port, stop = httpserver.serve("127.0.0.1", 0, httpserver.status_app(copy.body))
    address = f"127.0.0.1:{port}"
    try:
        with pytest.raises(cpumap.StatusError, match=r"answered 503.*starting"):
            cpumap.fetch(address)
        copy.start()
        wait_until(lambda: copy.body() is not None)
        before = cpumap.fetch(address)
        assert before["claims"] == []
        holds = node.manager.holds
        with node.manager:  # as a runtime event holds it
            answers: list[dict[str, Any]] = []
            readers = [
                threading.Thread(target=lambda: answers.append(cpumap.fetch(address, 10)))
                for _ in range(16)
            ]
            for reader in readers:
                reader.start()
            for reader in readers:
                reader.join(30)
            assert answers == [before] * 16
            assert node.manager.holds == holds + 1, "no reader, and not the copy, took it"
        cpus = node.prepare("uid-a", "checkout-cpus", node.device(1), POD)
        wait_until(lambda: cpumap.fetch(address)["claims"] != [])
        (claim,) = cpumap.fetch(address)["claims"]
        assert parse_cpu_list(claim["cpus"]) == cpus
        assert cpumap.fetch(address)["as_of"] > before["as_of"]
    finally:
        copy.stop()
        stop()


def test_a_copy_is_taken_only_after_someone_held_the_lock(node: Node) -> None:
    copy = StatusCopy(node.manager, node.topology, NODE)
    assert copy.refresh()
    first = copy.body()
    assert copy.refresh()
    assert copy.body() is first, "nothing held the lock since"
    with node.manager:
        pass
    assert copy.refresh()
    assert copy.body() is not first


def test_status_has_a_listener_of_its_own_and_the_command_reads_it(
    node: Node, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cpus = node.prepare("uid-a", "checkout-cpus", node.device(1), POD)
    pinner = node.manager.containers
    assert pinner is not None
    pinner.synchronize([POD], [holding("uid-a", POD)])
    proc = tmp_path / "proc"
    mems = format_cpu_list(
        frozenset().union(*(g.mems for g in node.manager.policy.grants("uid-a")))
    )
    fake_process(proc, 4242, f"ctr-{POD.name}-main", format_cpu_list(cpus), mems)
    copy = StatusCopy(node.manager, node.topology, NODE)
    assert copy.refresh()
    port, stop = httpserver.serve("127.0.0.1", 0, httpserver.status_app(copy.body))
    metrics_port, stop_metrics = httpserver.serve(
        "127.0.0.1", 0, httpserver.metrics_app(Metrics().registry, lambda: (True, {}))
    )
    try:
        served = cpumap.fetch(f"0.0.0.0:{port}")  # any interface: this machine
        assert (
            main(["status", "--address", f"127.0.0.1:{port}", "--json", "--proc", str(proc)]) == 0
        )
        printed = json.loads(capsys.readouterr().out)
        assert main(["status", "--address", f"127.0.0.1:{port}", "--proc", str(proc)]) == 0
        text = capsys.readouterr().out
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/status", timeout=10) as r:
            assert b"nodedra_orphan_claims" in r.read(), "the metrics' port has no map"
    finally:
        stop()
        stop_metrics()
    assert {k: v for k, v in served.items() if k != "as_of"} == status.cpu_map(
        node.manager, node.topology, NODE
    )
    (container,) = printed["containers"]
    assert container["kernel"] == {
        "source": "proc",
        "where": str(proc / "4242"),
        "pid": 4242,
        "cpus": format_cpu_list(cpus),
        "mems": mems,
        "check": "match",
    }
    assert {k: v for k, v in printed.items() if k != "containers"} == {
        k: v for k, v in served.items() if k != "containers"
    }
    assert "\x1b[" not in text, "no colour off a terminal"
    assert f"as of {served['as_of']}" in text
    assert "claim shop/checkout-cpus" in text
    assert f"shop/checkout main  CPUs {format_cpu_list(cpus)}  ok: pid 4242" in text


def test_a_burst_of_readers_gets_a_bounded_number_of_threads() -> None:
    """Readers beyond ``MAX_THREADS`` wait in the listen queue, and are all answered."""
    inside, most = [0], [0]
    count, go = threading.Lock(), threading.Event()

    def slow(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        with count:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        go.wait(30)
        with count:
            inside[0] -= 1
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    port, stop = httpserver.serve("127.0.0.1", 0, slow)
    answers: list[bytes] = []

    def read() -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as response:
            answers.append(response.read())

    readers = [threading.Thread(target=read) for _ in range(3 * httpserver.MAX_THREADS)]
    try:
        for reader in readers:
            reader.start()
        wait_until(lambda: inside[0] >= httpserver.MAX_THREADS)
        go.wait(0.5)  # time for more to come in, were there no bound
        assert most[0] == httpserver.MAX_THREADS
    finally:
        go.set()
        for reader in readers:
            reader.join(30)
        stop()
    assert answers == [b"ok"] * len(readers)
    assert most[0] == httpserver.MAX_THREADS


def test_the_command_says_why_it_has_no_map(capsys: pytest.CaptureFixture[str]) -> None:
    answers = [json.dumps({"schema": 2, "numa_nodes": []}).encode()]
    port, stop = httpserver.serve("127.0.0.1", 0, httpserver.status_app(lambda: answers[0]))
    try:
        assert main(["status", "--address", f"127.0.0.1:{port}"]) == 1
        assert "a CPU map of schema 2, this command reads schema 1" in capsys.readouterr().err
        assert cpumap.SCHEMA == status.SCHEMA
    finally:
        stop()  # nobody listens there now
    assert main(["status", "--address", f"127.0.0.1:{port}"]) == 1
    assert f"cannot read http://127.0.0.1:{port}/status" in capsys.readouterr().err
    assert main(["status", "--address", ""]) == 2
    assert "no address" in capsys.readouterr().err


def wait_until(condition: Callable[[], object], timeout: float = 30.0) -> None:
    """Wait for ``condition`` to hold; fail after ``timeout`` seconds (a hang, not a speed)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.01)


# /proc ------------------------------------------------------------------------------------


def fake_process(proc: Path, pid: int, cgroup: str, cpus: str, mems: str = "0-3") -> None:
    """A /proc/<pid> whose cgroup path ends in ``cgroup`` and that may run on ``cpus``."""
    directory = proc / str(pid)
    directory.mkdir(parents=True)
    (directory / "cgroup").write_text(
        f"12:cpuset:/kubepods/besteffort/podx/{cgroup}\n0::/kubepods/besteffort/podx/{cgroup}\n"
    )
    (directory / "status").write_text(
        f"Name:\tprobe\nPid:\t{pid}\nCpus_allowed_list:\t{cpus}\nMems_allowed_list:\t{mems}\n"
    )


def containers_map(*containers: dict[str, Any]) -> dict[str, Any]:
    return {"numa_nodes": [], "claims": [], "containers": list(containers)}


def entry(cid: str, cpus: str, mems: str = "") -> dict[str, Any]:
    return {"id": cid, "cpus": cpus, "mems": mems}


def test_each_container_is_found_by_its_cgroup_and_compared(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    fake_process(proc, 300, "aaaa", "2-3")  # cgroupfs: the ID is the directory
    fake_process(proc, 301, "aaaa", "2")  # a later process that narrowed itself
    fake_process(proc, 310, "cri-containerd-bbbb.scope", "4-5")  # systemd driver
    fake_process(proc, 320, "crio-conmon-cccc.scope", "9")  # CRI-O's monitor: not it
    fake_process(proc, 321, "crio-cccc.scope", "6", mems="1")
    fake_process(proc, 330, "crio-eeee", "8")  # CRI-O with cgroupfs
    (proc / "self").mkdir()  # not a process directory
    (proc / "400").mkdir()  # a process gone before its files were read
    checked = cpumap.check(
        containers_map(
            entry("aaaa", "2-3"),
            entry("bbbb", "4,5,6"),
            entry("cccc", "6", mems="0"),
            entry("dddd", "7"),
            entry("eeee", "8"),
        ),
        None,
        proc,
    )
    processes = [c["kernel"] for c in checked["containers"]]
    assert [(p["pid"], p["check"]) for p in processes] == [
        (300, "match"),
        (310, "mismatch"),
        (321, "mismatch"),  # the right CPUs, the wrong memory node
        (None, "not checked"),
        (330, "match"),
    ]
    assert processes[1]["cpus"] == "4-5"
    assert {p["source"] for i, p in enumerate(processes) if i != 3} == {"proc"}
    assert processes[3]["detail"] == (
        f"no cgroup root given; and no process of it is visible in {proc}"
    )
    assert cpumap.check({"numa_nodes": [], "containers": None}, None, proc)["containers"] is None


# Drawing ----------------------------------------------------------------------------------


def small_topology() -> Topology:
    """Two NUMA nodes of two cores of two threads: CPUs 0-3 and their siblings 4-7."""
    cpus = {
        i: CPU(i, 0, 0, None, i % 4, (i % 4) // 2, frozenset({i % 4, i % 4 + 4}), None, False)
        for i in range(8)
    }
    nodes = {
        n: NUMANode(n, frozenset(i for i in range(8) if (i % 4) // 2 == n), 8 << 30, {}, {})
        for n in (0, 1)
    }
    return Topology(cpus, nodes, frozenset(), frozenset())


def small_map(containers: bool = True) -> dict[str, Any]:
    """Claim A holds CPUs 1,5 (reserved for checkout), B holds 2; 0,4 are reserved."""
    grants = {
        "uid-a": (Grant("cpus", "cpudevnuma000", frozenset({1, 5}), 64 << 20, frozenset({0})),),
        "uid-b": (Grant("cpus", "cpu002", frozenset({2}), 0, frozenset({1})),),
    }
    books = Books(
        grants=grants,
        reservations={
            "uid-a": Reservation("shop", "checkout-cpus", frozenset({POD.uid})),
            "uid-b": Reservation("", "", frozenset({"pod-uid-9"})),  # a pod NRI never named
        },
        online=frozenset(range(8)),
        allocated=frozenset({1, 2, 5}),
    )
    views = (
        ContainerView(
            holding("uid-a", POD),
            POD,
            CPUSet("1,5", "0"),
            CPUSet("1,5", "0"),
            {"uid-a": frozenset({0})},
        ),
        ContainerView(plain(OTHER, "web"), OTHER, CPUSet("0,3-4,6-7"), CPUSet("0-7"), {}),
        ContainerView(plain(OTHER, "log"), OTHER, CPUSet("0,3-4,6-7"), CPUSet("0,3-4,6-7"), {}),
    )
    holdings = Holdings(
        books, frozenset({0, 4}), views if containers else None, {POD.uid: POD}, True
    )
    return status.build(
        holdings, small_topology(), node="n1", driver="topology-aware.nri.io", pinning="required"
    )


EXPECTED = """\
node n1   driver topology-aware.nri.io   pinning required, runtime connected
CPUs 0-7: reserved 0,4, claimed 1-2,5, shared pool 0,3-4,6-7

NUMA node 0: CPUs 0-1,4-5, memory 8 GiB
  [0:R 4:R] [1:A 5:A]

NUMA node 1: CPUs 2-3,6-7, memory 8 GiB
  [2:B 6:.] [3:. 7:.]

R reserved   . shared pool   A, B, ...: the claims below
  A  claim shop/checkout-cpus  CPUs 1,5  pods shop/checkout
     uid uid-a
     result 0: request cpus, device cpudevnuma000, CPUs 1,5, memory nodes 0 (64 MiB)
  B  claim (name unknown)  CPUs 2  pods (uid pod-uid-9)
     uid uid-b
     result 0: request cpus, device cpu002, CPUs 2, memory nodes 1

containers on claims (1):
  A  shop/checkout main  CPUs 1,5  ok: pid 11 runs on 1,5
containers on the shared pool (2): 1 ok, 1 update pending
  .  shop/cart web  CPUs 0,3-4,6-7  not checked; update pending (runtime told 0-7)
(not checked, 1: neither the cgroup nor a process of the container is readable here;
 the first: no cgroup root given; and no process of it is visible in PROC)
"""


def checked_small_map(tmp_path: Path) -> dict[str, Any]:
    proc = tmp_path / "proc"
    fake_process(proc, 11, f"ctr-{POD.name}-main", "1,5", mems="0")
    fake_process(proc, 12, f"ctr-{OTHER.name}-log", "0,3-4,6-7")
    return cpumap.check(small_map(), None, proc)


def test_the_text_draws_numa_nodes_cores_claims_and_containers(tmp_path: Path) -> None:
    expected = EXPECTED.replace("PROC", str(tmp_path / "proc"))
    assert cpumap.render_text(checked_small_map(tmp_path)) == expected


def test_colour_marks_each_claim_and_changes_nothing_else(tmp_path: Path) -> None:
    cpu_map = checked_small_map(tmp_path)
    coloured = cpumap.render_text(cpu_map, colour=True)
    assert ANSI.sub("", coloured) == EXPECTED.replace("PROC", str(tmp_path / "proc"))
    a, b = cpumap.CLAIM_COLOURS[:2]
    assert f"\x1b[{a}m1:A\x1b[0m \x1b[{a}m5:A\x1b[0m" in coloured
    assert f"\x1b[{b}m2:B\x1b[0m" in coloured
    assert f"\x1b[{cpumap.DIM}m0:R\x1b[0m" in coloured
    assert f"\x1b[{cpumap.GOOD}mok: pid 11" in coloured
    assert f"\x1b[{cpumap.UNKNOWN}mnot checked" in coloured


def test_a_narrow_terminal_wraps_the_cores_and_a_mismatch_is_shouted(tmp_path: Path) -> None:
    cpu_map = checked_small_map(tmp_path)
    cpu_map["containers"][0]["kernel"].update(cpus="1", check="mismatch")
    text = cpumap.render_text(cpu_map, width=12)
    assert "  [0:R 4:R]\n  [1:A 5:A]\n" in text
    assert "MISMATCH: pid 11 runs on 1" in text
    off = cpumap.render_text(small_map(containers=False))
    assert "containers: pinning is off" in off


def test_the_json_is_the_map() -> None:
    cpu_map = small_map()
    assert json.loads(cpumap.render_json(cpu_map)) == cpu_map


def test_claims_are_lettered_without_r() -> None:
    labels = [cpumap.label(i) for i in range(27)]
    assert labels[:3] == ["A", "B", "C"]
    assert "R" not in labels
    assert labels[16:18] == ["Q", "S"]
    assert labels[24:27] == ["Z", "AA", "AB"]


class Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize(
    ("tty", "environ", "colour"),
    [
        (True, {}, True),
        (False, {}, False),
        (True, {"NO_COLOR": "1"}, False),
        (True, {"NO_COLOR": ""}, False),
        (True, {"TERM": "dumb"}, False),
    ],
)
def test_colour_only_on_a_terminal_that_wants_it(
    tty: bool, environ: dict[str, str], colour: bool
) -> None:
    assert cpumap.use_colour(Stream(tty), environ) is colour


@pytest.mark.parametrize(
    ("address", "url"),
    [
        ("0.0.0.0:9464", "http://127.0.0.1:9464/status"),
        (":9464", "http://127.0.0.1:9464/status"),
        ("10.1.2.3:80", "http://10.1.2.3:80/status"),
        ("[::]:9464", "http://[::1]:9464/status"),
        ("[fd00::1]:9464", "http://[fd00::1]:9464/status"),
    ],
)
def test_the_address_is_that_of_the_metrics(address: str, url: str) -> None:
    assert endpoints.url(address, "/status") == url


def test_the_quiet_cpus_say_what_is_kept_off_the_claims_and_what_is_left(tmp_path: Path) -> None:
    cpu_map = checked_small_map(tmp_path)
    assert "quiet CPUs" not in cpumap.render_text(cpu_map), "off: not a word"
    cpu_map["quiet_cpus"] = {
        "interrupts": True,
        "unboundWork": True,
        "claimed": "1-2,5",
        "sources": 12,
        "left": [
            {
                "source": "IRQ 25 (virtio0-input.0)",
                "cpus": "2",
                "why": "Input/output error (the kernel keeps it where it is)",
            }
        ],
    }
    text = cpumap.render_text(cpu_map)
    assert (
        "\nquiet CPUs: device interrupts and unbound kernel work kept off claimed CPUs 1-2,5\n"
        "  still on 2: IRQ 25 (virtio0-input.0): "
        "Input/output error (the kernel keeps it where it is)\n"
    ) in text
    cpu_map["quiet_cpus"] |= {
        "hostProcesses": True,
        "unavailable": {"hostProcesses": "cannot reach the system bus at /run/dbus/x: refused"},
    }
    text = cpumap.render_text(cpu_map)
    assert (
        "\nquiet CPUs: device interrupts, unbound kernel work and host processes kept off "
        "claimed CPUs 1-2,5\n"
    ) in text
    assert (
        "\n  not kept off: hostProcesses: cannot reach the system bus at /run/dbus/x: refused\n"
    ) in text
