"""``nodedra cleanup``: only nodedra's files go, and nothing while nodedra still runs.

nodedra's files are made by nodedra's own writers (the CDI store, the checkpoint, the lock
files, sockets bound as the plugin binds them), beside files of other vendors with names as
close to ours as they could legitimately be.
"""

from __future__ import annotations

import socket
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from nodedra.cleanup import RUNTIME_FIRST, NodePaths, cleanup, command
from nodedra.cli import main
from nodedra.dra.cdi import CDIStore
from nodedra.dra.metadata import METADATA_DIR
from nodedra.lib.locks import FileLock
from nodedra.quiet import RECORD
from nodedra.quiet.keeper import read_record, write_record
from nodedra.resmgr.checkpoint import FILE_NAME, Checkpoint, State

TOPOLOGY_AWARE = "topology-aware.nri.io"
STATIC = "static.nri.io"
POD_UID = "0f5e7a4c-3b1d-4e2a-9c8b-7d6e5f4a3b2c"


def dead_socket(path: Path) -> None:
    """A socket file whose process is gone, as a killed nodedra leaves it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))


@pytest.fixture
def node() -> Iterator[NodePaths]:
    """The node's directories, under a short path: a socket's path is at most 107 bytes."""
    with tempfile.TemporaryDirectory(prefix="ndc-") as root:
        yield NodePaths(
            registry_dir=Path(root, "plugins_registry"),
            plugins_dir=Path(root, "plugins"),
            cdi_dir=Path(root, "cdi"),
            state_dir=Path(root, "nodedra"),
        )


def args(node: NodePaths) -> list[str]:
    return [
        "cleanup",
        "--registry-dir",
        str(node.registry_dir),
        "--plugins-dir",
        str(node.plugins_dir),
        "--cdi-dir",
        str(node.cdi_dir),
        "--state-dir",
        str(node.state_dir),
    ]


def nodedras_files(node: NodePaths) -> set[Path]:
    """What a nodedra that served claims with both drivers and was killed leaves behind."""
    made: set[Path] = set()
    for driver in (TOPOLOGY_AWARE, STATIC):
        store = CDIStore(driver, node.cdi_dir)
        spec = store.claim_spec("c1a1m-uid", [{"env": ["DRA_CPUSET_0=1"]}])
        store.write_spec(spec)
        made.add(store.spec_path("c1a1m-uid"))
        data = node.plugins_dir / driver
        for lock in ("nri.lock", "serialize.lock"):
            with FileLock(data / lock):
                pass
        dead_socket(data / f"dra-{POD_UID}.sock")
        dead_socket(node.registry_dir / f"{driver}-{POD_UID}-reg.sock")
        made |= {data / "nri.lock", data / "serialize.lock", data / f"dra-{POD_UID}.sock"}
        made.add(node.registry_dir / f"{driver}-{POD_UID}-reg.sock")
    dead_socket(node.registry_dir / f"{TOPOLOGY_AWARE}-reg.sock")  # without POD_UID
    dead_socket(node.registry_dir / ".nodedra-0a1b2c3d.sock")  # a start cut short
    made |= {
        node.registry_dir / f"{TOPOLOGY_AWARE}-reg.sock",
        node.registry_dir / ".nodedra-0a1b2c3d.sock",
    }
    leftover = node.cdi_dir / f".{TOPOLOGY_AWARE}-device_c2.yaml.x1y2.tmp"  # a crash's
    leftover.write_text("{")
    made.add(leftover)
    metadata = node.plugins_dir / TOPOLOGY_AWARE / METADATA_DIR / "ns_claim" / "cpus"
    metadata.mkdir(parents=True)
    (metadata / "metadata.json").write_text("{}")
    made.add(metadata / "metadata.json")
    Checkpoint(node.state_dir / FILE_NAME).save(State("topology-aware", TOPOLOGY_AWARE, {}))
    made |= set(node.state_dir.iterdir())
    return made


def foreign_files(node: NodePaths) -> set[Path]:
    """Other vendors' files in the same directories, named as near ours as they can be."""
    files = {
        node.cdi_dir / "example.com-device_c1a1m-uid.yaml",  # another vendor, same class
        node.cdi_dir / f"{TOPOLOGY_AWARE}-gpu_c1a1m-uid.yaml",  # another class
        node.cdi_dir / f"{TOPOLOGY_AWARE}-device.yaml",  # no claim of ours
        node.cdi_dir / "nvidia.yaml",
        node.registry_dir / "gpu.example.com-reg.sock",
        node.registry_dir / f"{TOPOLOGY_AWARE}.example.com-reg.sock",
        node.plugins_dir / "gpu.example.com" / "dra.sock",
        node.plugins_dir / "gpu.example.com" / "serialize.lock",
    }
    for path in files:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("not nodedra's")
    return files


def files_under(node: NodePaths) -> set[Path]:
    roots = (node.registry_dir, node.plugins_dir, node.cdi_dir, node.state_dir)
    return {p for root in roots if root.exists() for p in root.rglob("*") if not p.is_dir()}


def test_only_nodedras_files_go_and_each_is_named(
    node: NodePaths, capsys: pytest.CaptureFixture[str]
) -> None:
    ours = nodedras_files(node)
    theirs = foreign_files(node)
    assert files_under(node) == ours | theirs

    assert main(args(node)) == 0

    assert files_under(node) == theirs
    assert not node.state_dir.exists(), "the state directory itself is nodedra's"
    for driver in (TOPOLOGY_AWARE, STATIC):
        assert not (node.plugins_dir / driver).exists()
    out = capsys.readouterr().out
    removed = {Path(line.removeprefix("removed ")) for line in out.splitlines()[:-1]}
    dirs = {node.state_dir, *(node.plugins_dir / d for d in (TOPOLOGY_AWARE, STATIC))}
    assert removed >= ours | dirs
    assert not removed & theirs
    assert out.splitlines()[-1] == f"nodedra cleanup: removed {len(removed)} paths of nodedra's"


def test_a_second_run_finds_nothing(node: NodePaths, capsys: pytest.CaptureFixture[str]) -> None:
    nodedras_files(node)
    theirs = foreign_files(node)
    assert main(args(node)) == 0
    capsys.readouterr()
    assert main(args(node)) == 0
    assert capsys.readouterr().out == (
        "nodedra cleanup: no file of nodedra's was left on this node\n"
    )
    assert files_under(node) == theirs


def test_a_node_nodedra_never_ran_on_is_left_as_it_is(
    node: NodePaths, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args(node)) == 0
    assert "no file of nodedra's was left" in capsys.readouterr().out
    for directory in (node.registry_dir, node.plugins_dir, node.cdi_dir, node.state_dir):
        assert not directory.exists(), f"{directory} was created"


def test_the_runtime_step_is_said_first(
    node: NodePaths, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every run says it, before anything else: nothing on the node tells whether the
    runtime still requires nodedra."""
    main(args(node))
    err = capsys.readouterr().err
    assert err.splitlines()[0] == f"nodedra cleanup: {RUNTIME_FIRST}"
    assert "required_plugins" in err


@pytest.fixture
def serving(node: NodePaths) -> Iterator[Path]:
    """A live nodedra's DRA socket, listening, beside a killed one's."""
    path = node.plugins_dir / TOPOLOGY_AWARE / "dra-9d8c7b6a-1111-2222-3333-444455556666.sock"
    path.parent.mkdir(parents=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))
        sock.listen()
        yield path


def test_refuses_while_nodedra_serves(
    node: NodePaths, serving: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodedras_files(node)
    before = files_under(node)
    assert main(args(node)) == 1
    assert files_under(node) == before
    err = capsys.readouterr().err
    assert f"nodedra still runs on this node ({serving} answers); nothing was removed" in err
    assert "kubectl -n nodedra delete daemonset nodedra" in err


def test_refuses_while_nodedra_holds_its_runtime_lock(
    node: NodePaths, capsys: pytest.CaptureFixture[str]
) -> None:
    """An instance that stands by serves no socket here in the test, but the connected one
    holds nri.lock for as long as it runs."""
    nodedras_files(node)
    before = files_under(node)
    lock = node.plugins_dir / STATIC / "nri.lock"
    with FileLock(lock):
        assert main(args(node)) == 1
    assert files_under(node) == before
    assert f"({lock} is locked by a running process)" in capsys.readouterr().err


def test_foreign_files_in_the_state_directory_stay(
    node: NodePaths, capsys: pytest.CaptureFixture[str]
) -> None:
    """An admin's copy of the checkpoint is not nodedra's to remove: the directory stays
    with it, and the cleanup says so."""
    nodedras_files(node)
    kept = node.state_dir / "checkpoint.json.before-downgrade"
    kept.write_text("{}")
    assert main(args(node)) == 0
    assert sorted(node.state_dir.iterdir()) == [kept]
    assert f"left {kept}: not a file of nodedra's" in capsys.readouterr().out


def test_claims_still_prepared_are_named_and_their_files_go(
    node: NodePaths, capsys: pytest.CaptureFixture[str]
) -> None:
    """Their containers run on; what the admin needs to hear is that the kubelet cannot
    unprepare them any more, so their pods, once deleted, stay Terminating."""
    nodedras_files(node)
    held: dict[str, object] = {"uid-1": {"grants": []}, "uid-2": {"grants": []}}
    reserved = {"uid-1": {"namespace": "team", "name": "db-cpus", "pods": ["pod-uid"]}}
    Checkpoint(node.state_dir / FILE_NAME).save(
        State("topology-aware", TOPOLOGY_AWARE, held, reserved)
    )
    assert main(args(node)) == 0
    err = capsys.readouterr().err
    assert "claim team/db-cpus is still prepared on this node" in err
    assert "claim with UID uid-2 is still prepared on this node" in err
    assert "a pod of it deleted from now on stays Terminating" in err
    assert not node.state_dir.exists()


def test_an_unreadable_checkpoint_does_not_stop_the_cleanup(
    node: NodePaths, capsys: pytest.CaptureFixture[str]
) -> None:
    nodedras_files(node)
    (node.state_dir / FILE_NAME).write_bytes(b"\0" * 100)
    assert main(args(node)) == 0
    assert "cannot tell which claims are still prepared: " in capsys.readouterr().err
    assert not node.state_dir.exists()


def test_a_removal_that_fails_is_named_after_what_was_removed(
    node: NodePaths, capsys: pytest.CaptureFixture[str]
) -> None:
    """A spec's name taken by a directory with something in it: the removal fails, the
    cleanup says which path and stops; what it removed before is printed, and a second run
    after the fix finishes the job."""
    nodedras_files(node)
    blocker = node.cdi_dir / f"{TOPOLOGY_AWARE}-device_zz.yaml"
    (blocker / "inside").mkdir(parents=True)
    assert main(args(node)) == 1
    captured = capsys.readouterr()
    assert (
        f"nodedra cleanup: cannot remove {blocker}: Directory not empty; "
        "run it again once that is fixed"
    ) in captured.err
    assert f"removed {node.cdi_dir / f'{STATIC}-device_c1a1m-uid.yaml'}" in captured.out
    (blocker / "inside").rmdir()
    assert main(args(node)) == 0
    assert files_under(node) == set()


def quiet_host(node: NodePaths, root: Path) -> NodePaths:
    """A host whose interrupt 24 and workqueues a killed nodedra left narrowed to 0-1, and
    the record of what they had (this boot's)."""
    (root / "irq" / "24").mkdir(parents=True)
    (root / "irq" / "24" / "smp_affinity_list").write_text("0-1\n")
    (root / "irq" / "default_smp_affinity").write_text("03\n")
    (root / "workqueue").mkdir()
    (root / "workqueue" / "cpumask").write_text("03\n")
    (root / "boot_id").write_text("boot-1\n")
    originals = {s: frozenset(range(4)) for s in ("irq/24", "irq/default", "workqueue")}
    write_record(node.state_dir / RECORD, "boot-1", originals)
    return replace(
        node,
        irq_dir=root / "irq",
        workqueue_dir=root / "workqueue",
        irqbalance_dir=root / "irqbalance",
        boot_id=root / "boot_id",
    )


def test_the_host_s_work_gets_its_cpus_back_before_the_record_goes(
    node: NodePaths, tmp_path: Path
) -> None:
    paths = quiet_host(node, tmp_path)
    report = cleanup(paths)
    assert (tmp_path / "irq" / "24" / "smp_affinity_list").read_text() == "0-3"
    assert (tmp_path / "workqueue" / "cpumask").read_text() == "0000000f"
    assert (tmp_path / "irq" / "default_smp_affinity").read_text() == "0000000f"
    assert node.state_dir / RECORD in report.removed
    assert not node.state_dir.exists()


def test_without_the_host_s_files_the_record_stays_and_says_so(
    node: NodePaths, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The plain cleanup DaemonSet mounts neither: the sources stay narrowed (until the next
    boot), and the record of what they had stays for a cleanup that can."""
    paths = quiet_host(node, tmp_path)
    assert (
        command(replace(paths, workqueue_dir=tmp_path / "not-mounted"), sys.stdout, sys.stderr) == 0
    )
    out, err = capsys.readouterr()
    assert (tmp_path / "irq" / "24" / "smp_affinity_list").read_text() == "0-3"
    assert f"not given back: workqueue: {tmp_path / 'not-mounted'} is not there" in out
    assert f"left {node.state_dir / RECORD}: what the host's work had before" in out
    assert "deploy/overlays/quiet-cpus-cleanup/" in err
    assert read_record(node.state_dir / RECORD, "boot-1")


def test_without_the_system_bus_a_narrowed_slice_is_named_and_kept_on_record(
    node: NodePaths, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A slice nodedra narrowed is given back through systemd: where the system bus is not
    mounted, the slice is named as still narrowed and the record stays."""
    paths = replace(quiet_host(node, tmp_path), system_bus=tmp_path / "no-bus")
    record = read_record(node.state_dir / RECORD, "boot-1")
    write_record(node.state_dir / RECORD, "boot-1", {**record, "unit/system.slice": frozenset()})
    assert command(paths, sys.stdout, sys.stderr) == 0
    out, _ = capsys.readouterr()
    assert (tmp_path / "irq" / "24" / "smp_affinity_list").read_text() == "0-3"
    assert "not given back: system.slice (host processes): cannot reach the system bus" in out
    assert read_record(node.state_dir / RECORD, "boot-1")["unit/system.slice"] == frozenset()
