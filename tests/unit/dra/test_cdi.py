"""Tests of the CDI spec store of prepared claims."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
import yaml

from nodedra.dra.cdi import DEFAULT_CDI_DIR, CDISpecError, CDIStore
from nodedra.dra.cdi_schema import minimum_cdi_version

DRV = "balloons.nri.io"
UID = "0b7a6c2e-6a0d-4c4e-9d64-7f2b1c3d4e5f"
ENV = {"env": ["DRA_BALLOON=b0"]}


@pytest.fixture
def store(tmp_path: Path) -> CDIStore:
    return CDIStore(DRV, tmp_path / "cdi")


def load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


def write(store: CDIStore, uid: str, edits: Any) -> list[str]:
    """Check and write claim ``uid``'s spec, as a prepare does."""
    return store.write_spec(store.claim_spec(uid, edits))


def snapshot(directory: Path) -> dict[str, bytes]:
    if not directory.exists():
        return {}
    return {p.name: p.read_bytes() for p in directory.iterdir()}


# --- construction ------------------------------------------------------------------------


def test_valid_vendor(tmp_path: Path) -> None:
    store = CDIStore(DRV, tmp_path)
    assert store.driver == DRV
    assert store.kind == f"{DRV}/device"
    assert store.directory == tmp_path


@pytest.mark.parametrize("driver", ["", "1.nri.io", "test/nri.io", "nri.io-", "a b"])
def test_invalid_vendor_is_refused(driver: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="invalid CDI vendor"):
        CDIStore(driver, tmp_path)


@pytest.mark.parametrize("directory", [None, ""])
def test_default_directory(directory: str | None) -> None:
    store = CDIStore(DRV, directory)
    assert DEFAULT_CDI_DIR == "/var/run/cdi"
    assert store.directory == Path("/var/run/cdi")


def test_construction_does_not_create_the_directory(tmp_path: Path) -> None:
    CDIStore(DRV, tmp_path / "cdi")
    assert not (tmp_path / "cdi").exists()


def test_spec_path_is_the_transient_spec_name(store: CDIStore) -> None:
    assert store.spec_path(UID) == store.directory / f"{DRV}-device_{UID}.yaml"
    # As GenerateTransientSpecName: '/' cannot take the path out of the directory.
    assert store.spec_path("../x").parent == store.directory
    assert store.spec_path("../x").name == f"{DRV}-device_.._x.yaml"


# --- write, has, remove ------------------------------------------------------------------


def test_has_claim_follows_write_and_remove(store: CDIStore) -> None:
    assert not store.has_claim(UID)
    write(store, UID, [ENV])
    assert store.has_claim(UID)
    store.remove_claim(UID)
    assert not store.has_claim(UID)


def test_has_claim_raises_errors_other_than_a_missing_file(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with pytest.raises(NotADirectoryError):
        CDIStore(DRV, not_a_dir).has_claim(UID)


def test_write_claim_writes_the_edits_verbatim(store: CDIStore) -> None:
    mount = {
        "containerPath": "/etc/balloon",
        "hostPath": "/run/balloon",
        "options": ["ro", "bind"],
    }
    edits: list[dict[str, Any]] = [ENV, {"mounts": [mount], "env": ["A=1", "B=x=y"]}]

    names = write(store, UID, edits)

    assert names == [f"{DRV}/device=claim-{UID}-0", f"{DRV}/device=claim-{UID}-1"]
    spec = load(store.spec_path(UID))
    assert list(spec) == ["cdiVersion", "kind", "devices"]
    assert spec["kind"] == f"{DRV}/device"
    assert spec["cdiVersion"] == "0.3.0"
    assert spec["devices"] == [
        {"name": f"claim-{UID}-0", "containerEdits": ENV},
        {"name": f"claim-{UID}-1", "containerEdits": edits[1]},
    ]
    # Key order is kept, not sorted.
    assert list(spec["devices"][1]["containerEdits"]) == ["mounts", "env"]
    assert list(spec["devices"][1]["containerEdits"]["mounts"][0]) == list(mount)


def test_write_claim_accepts_any_mapping_and_sequence(store: CDIStore) -> None:
    edits = (MappingProxyType({"env": ("A=1",), "additionalGids": (5,)}),)
    write(store, UID, edits)
    spec = load(store.spec_path(UID))
    assert spec["devices"][0]["containerEdits"] == {"env": ["A=1"], "additionalGids": [5]}
    assert spec["cdiVersion"] == "0.7.0"


def test_write_claim_accepts_every_field(store: CDIStore) -> None:
    edits = {
        "env": ["A="],
        "deviceNodes": [
            {
                "path": "/dev/x",
                "hostPath": "/dev/y",
                "type": "c",
                "major": 10,
                "minor": 200,
                "fileMode": 0o666,
                "permissions": "rwm",
                "uid": 0,
                "gid": 2**32 - 1,
            },
            {"path": "/dev/z", "type": "", "permissions": ""},
        ],
        "netDevices": [{"hostInterfaceName": "eth1", "name": "net1"}],
        "hooks": [
            {"hookName": name, "path": "/bin/true", "args": ["true"], "env": ["X=1"], "timeout": 5}
            for name in (
                "prestart",
                "createRuntime",
                "createContainer",
                "startContainer",
                "poststart",
                "poststop",
            )
        ],
        "mounts": [{"hostPath": "tmpfs", "containerPath": "/t", "type": "tmpfs", "options": []}],
        "intelRdt": {
            "closID": "/",
            "l3CacheSchema": "L3:0=f",
            "memBwSchema": "MB:0=50",
            "schemata": ["L3:0=f"],
            "enableMonitoring": True,
        },
        "additionalGids": [0, 2**32 - 1],
    }
    write(store, UID, [edits])
    spec = load(store.spec_path(UID))
    assert spec["devices"][0]["containerEdits"] == edits
    assert spec["cdiVersion"] == "1.1.0"


def test_version_follows_the_edits(store: CDIStore) -> None:
    write(store, "env-only", [ENV])
    mount = {"hostPath": "/a", "containerPath": "/b", "type": "bind", "options": ["bind"]}
    write(store, "typed-mount", [ENV, {"mounts": [mount]}])
    env_only = load(store.spec_path("env-only"))["cdiVersion"]
    typed_mount = load(store.spec_path("typed-mount"))["cdiVersion"]
    assert env_only != typed_mount
    assert (env_only, typed_mount) == ("0.3.0", "0.4.0")


def test_written_file_and_created_directory_are_readable_by_runtimes(store: CDIStore) -> None:
    umask = os.umask(0)
    os.umask(umask)
    write(store, UID, [ENV])
    assert stat.S_IMODE(store.spec_path(UID).stat().st_mode) == 0o644
    assert stat.S_IMODE(store.directory.stat().st_mode) == 0o755 & ~umask


def test_writing_twice_leaves_one_file_with_the_second_content(store: CDIStore) -> None:
    write(store, UID, [ENV, ENV])
    second = {"env": ["SECOND=1"]}
    assert write(store, UID, [second]) == [f"{DRV}/device=claim-{UID}-0"]
    assert os.listdir(store.directory) == [store.spec_path(UID).name]
    assert load(store.spec_path(UID))["devices"] == [
        {"name": f"claim-{UID}-0", "containerEdits": second}
    ]


def test_remove_twice_and_remove_unknown_succeed(store: CDIStore) -> None:
    write(store, UID, [ENV])
    store.remove_claim(UID)
    store.remove_claim(UID)
    store.remove_claim("unknown")
    assert os.listdir(store.directory) == []


def test_remove_without_directory_succeeds(store: CDIStore) -> None:
    store.remove_claim(UID)
    assert not store.directory.exists()


def test_failed_replace_leaves_no_temporary_file(
    store: CDIStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(store, UID, [ENV])
    before = snapshot(store.directory)

    def fail(*_args: object, **_kwargs: object) -> None:
        raise OSError("replace failed")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="replace failed"):
        write(store, UID, [{"env": ["NEW=1"]}])
    with pytest.raises(OSError, match="replace failed"):
        write(store, "other", [ENV])
    assert snapshot(store.directory) == before


# --- refusals ----------------------------------------------------------------------------


def mount(**fields: object) -> dict[str, Any]:
    return {"mounts": [{"hostPath": "/a", "containerPath": "/b", **fields}]}


def node(**fields: object) -> dict[str, Any]:
    return {"deviceNodes": [{"path": "/dev/x", **fields}]}


def hook(**fields: object) -> dict[str, Any]:
    return {"hooks": [{"hookName": "createContainer", "path": "/bin/h", **fields}]}


def net(*devices: dict[str, Any]) -> dict[str, Any]:
    return {"netDevices": list(devices)}


EDITS_AT = f"device 'claim-{UID}-0': containerEdits"

REFUSED: list[tuple[str, str, Any, str]] = [
    # (id, uid, edits, what the message says)
    ("empty uid", "", [ENV], "must be a non-empty string"),
    ("uid with slash", "a/b", [ENV], "invalid CDI device name 'claim-a/b-0'"),
    ("uid with space", "a b", [ENV], "invalid CDI device name"),
    ("no edits", UID, [], "no container edits"),
    ("edits not a list", UID, ENV, "must be a list of container edits"),
    ("empty edits", UID, [{}], f"{EDITS_AT}: empty"),
    ("only empty lists", UID, [{"env": [], "mounts": []}], f"{EDITS_AT}: empty"),
    ("second device empty", UID, [ENV, {}], f"device 'claim-{UID}-1': containerEdits: empty"),
    ("edit not a mapping", UID, [["A=1"]], f"{EDITS_AT}: must be a mapping, not list"),
    ("unknown field", UID, [{"envs": ["A=1"]}], f"{EDITS_AT}.envs: unknown field"),
    ("non-string key", UID, [{1: ["A=1"]}], f"{EDITS_AT}.1: unknown field"),
    ("null value", UID, [{"env": None}], f"{EDITS_AT}.env: must be a list, not null"),
    ("env not a list", UID, [{"env": "A=1"}], f"{EDITS_AT}.env: must be a list, not str"),
    ("env not a string", UID, [{"env": [1]}], f"{EDITS_AT}.env[0]: must be a string, not int"),
    ("env without =", UID, [{"env": ["A=1", "A"]}], f"{EDITS_AT}.env[1]: 'A' must be \"NAME="),
    ("env empty name", UID, [{"env": ["=1"]}], f"{EDITS_AT}.env[0]: '=1' must be \"NAME="),
    ("node without path", UID, [{"deviceNodes": [{"type": "c"}]}], "path: required field"),
    ("node relative path", UID, [node(path="dev/x")], "path: 'dev/x' must be an absolute"),
    ("node bad perms", UID, [node(permissions="rwx")], "permissions: 'rwx' may only contain"),
    ("node perms none", UID, [node(permissions="none")], "permissions: 'none' may only contain"),
    ("node bad type", UID, [node(type="x")], "type: 'x' must be one of b, c, u, p"),
    ("node major str", UID, [node(major="1")], "major: must be a 64-bit integer, not str"),
    ("node uid < 0", UID, [node(uid=-1)], "uid: -1 is out of range"),
    ("node gid > 2^32", UID, [node(gid=2**32)], "gid: 4294967296 is out of range"),
    ("node mode bool", UID, [node(fileMode=True)], "fileMode: must be an integer"),
    ("node unknown", UID, [node(readOnly=True)], "deviceNodes[0].readOnly: unknown field"),
    ("mount no host", UID, [{"mounts": [{"containerPath": "/b"}]}], "hostPath: required field"),
    ("mount no ctr", UID, [{"mounts": [{"hostPath": "/a"}]}], "containerPath: required field"),
    ("mount empty host", UID, [mount(hostPath="")], "hostPath: '' must not be empty"),
    ("mount options str", UID, [mount(options="ro")], "options: must be a list, not str"),
    ("mount option int", UID, [mount(options=[1])], "options[0]: must be a string, not int"),
    ("mount type int", UID, [mount(type=1)], "mounts[0].type: must be a string"),
    ("mount unknown", UID, [mount(propagation="x")], "mounts[0].propagation: unknown field"),
    ("hook bad name", UID, [hook(hookName="prestop")], "hookName: 'prestop' is not a hook name"),
    ("hook no name", UID, [{"hooks": [{"path": "/h"}]}], "hooks[0].hookName: required field"),
    ("hook no path", UID, [{"hooks": [{"hookName": "poststop"}]}], "hooks[0].path: required"),
    ("hook relative", UID, [hook(path="h")], "hooks[0].path: 'h' must be an absolute path"),
    ("hook timeout 0", UID, [hook(timeout=0)], "timeout: 0 is out of range"),
    ("hook bad env", UID, [hook(env=["X"])], "hooks[0].env[0]: 'X' must be \"NAME="),
    ("hook args str", UID, [hook(args="a")], "hooks[0].args: must be a list"),
    ("gid negative", UID, [{"additionalGids": [-1]}], "additionalGids[0]: -1 is out of range"),
    ("gid too big", UID, [{"additionalGids": [2**32]}], "additionalGids[0]: 4294967296 is out"),
    ("gid str", UID, [{"additionalGids": ["1"]}], "additionalGids[0]: must be an integer"),
    ("gid float", UID, [{"additionalGids": [1.0]}], "must be an integer in 0..4294967295"),
    ("gids not list", UID, [{"additionalGids": 1}], "additionalGids: must be a list, not int"),
    ("rdt not mapping", UID, [{"intelRdt": "x"}], "intelRdt: must be a mapping, not str"),
    ("rdt schema typo", UID, [{"intelRdt": {"schema": []}}], "intelRdt.schema: unknown field"),
    ("rdt closID /", UID, [{"intelRdt": {"closID": "a/b"}}], "closID: 'a/b' is not a valid"),
    ("rdt closID ..", UID, [{"intelRdt": {"closID": ".."}}], "closID: '..' is not a valid"),
    ("rdt schemata", UID, [{"intelRdt": {"schemata": "L3"}}], "schemata: must be a list"),
    ("rdt monitoring", UID, [{"intelRdt": {"enableMonitoring": 1}}], "must be a boolean, not int"),
    ("net not list", UID, [{"netDevices": {"name": "a"}}], "netDevices: must be a list"),
    ("net no name", UID, [net({"hostInterfaceName": "eth0"})], "netDevices[0].name: required"),
    ("net empty host", UID, [net({"hostInterfaceName": "", "name": "a"})], "'' must not be"),
    (
        "net duplicate name",
        UID,
        [net({"hostInterfaceName": "a", "name": "n"}, {"hostInterfaceName": "b", "name": "n"})],
        "netDevices[1].name: duplicate value 'n'",
    ),
    (
        "net duplicate host",
        UID,
        [net({"hostInterfaceName": "a", "name": "m"}, {"hostInterfaceName": "a", "name": "n"})],
        "netDevices[1].hostInterfaceName: duplicate value 'a'",
    ),
]


@pytest.mark.parametrize(
    ("uid", "edits", "message"), [case[1:] for case in REFUSED], ids=[case[0] for case in REFUSED]
)
def test_refused_spec_writes_nothing(store: CDIStore, uid: str, edits: Any, message: str) -> None:
    existing = [{"env": ["EXISTING=1"]}]
    write(store, UID, existing)
    before = snapshot(store.directory)

    with pytest.raises(CDISpecError, match=re.escape(message)) as refusal:
        write(store, uid, edits)

    assert repr(uid) in str(refusal.value)
    assert snapshot(store.directory) == before


def test_refusal_does_not_create_the_directory(store: CDIStore) -> None:
    with pytest.raises(CDISpecError):
        write(store, UID, [{}])
    assert not store.directory.exists()


def test_refused_spec_is_a_value_error() -> None:
    assert issubclass(CDISpecError, ValueError)


# --- listing -----------------------------------------------------------------------------


def test_claim_uids_lists_ours_and_leaves_the_rest_alone(store: CDIStore) -> None:
    write(store, "b-uid", [ENV])
    write(store, "a-uid", [ENV])
    foreign = [
        "other.nri.io-device_x.yaml",  # another vendor
        f"{DRV}-gpu_y.yaml",  # another class
        f"{DRV}-device.yaml",  # not transient
        f".{DRV}-device_z.yaml.abc123.tmp",  # our temporary file
        f"{DRV}-device_.yaml",  # empty uid
        f"{DRV}-device_bad uid.yaml",  # a uid write_claim refuses
        f"{DRV}-device_q.json",  # not written by us
        f"{DRV}-device_q.yaml~",
        "README",
    ]
    for name in foreign:
        (store.directory / name).write_text("garbage: [")
    (store.directory / f"{DRV}-device_dir.yaml").mkdir()

    assert store.claim_uids() == ["a-uid", "b-uid"]
    for name in foreign:
        assert (store.directory / name).read_text() == "garbage: ["
    assert (store.directory / f"{DRV}-device_dir.yaml").is_dir()


def test_claim_uids_escapes_the_driver_name(tmp_path: Path) -> None:
    store = CDIStore("a.b", tmp_path)
    (tmp_path / "aXb-device_u.yaml").write_text("")
    write(store, "v", [ENV])
    assert store.claim_uids() == ["v"]


def test_claim_uids_without_directory_is_empty(store: CDIStore) -> None:
    assert store.claim_uids() == []


def test_claim_uids_after_remove(store: CDIStore) -> None:
    write(store, "a", [ENV])
    write(store, "b", [ENV])
    store.remove_claim("a")
    assert store.claim_uids() == ["b"]


# --- minimum version ---------------------------------------------------------------------


def spec_with(edits: dict[str, Any], **fields: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "kind": f"{DRV}/device",
        "devices": [{"name": "claim-u-0", "containerEdits": edits}],
    }
    spec.update(fields)
    return spec


VERSIONS: list[tuple[str, dict[str, Any], str]] = [
    ("env only", spec_with(ENV), "0.3.0"),
    ("untyped mount", spec_with(mount()), "0.3.0"),
    ("empty lists", spec_with({**ENV, "additionalGids": [], "netDevices": []}), "0.3.0"),
    ("mount type", spec_with(mount(type="bind")), "0.4.0"),
    ("spec-level mount type", spec_with(ENV, containerEdits=mount(type="bind")), "0.4.0"),
    ("node host path", spec_with(node(hostPath="/dev/y")), "0.5.0"),
    ("node empty host path", spec_with(node(hostPath="")), "0.3.0"),
    (
        "device name with digit",
        spec_with(ENV, devices=[{"name": "0dev", "containerEdits": ENV}]),
        "0.5.0",
    ),
    ("spec annotations", spec_with(ENV, annotations={"a": "b"}), "0.6.0"),
    (
        "device annotations",
        spec_with(ENV, devices=[{"name": "d", "annotations": {"a": "b"}, "containerEdits": ENV}]),
        "0.6.0",
    ),
    ("dotted class", spec_with(ENV, kind="vendor.com/my.class"), "0.6.0"),
    ("dotted vendor only", spec_with(ENV, kind="vendor.com/device"), "0.3.0"),
    ("empty intelRdt", spec_with({"intelRdt": {}}), "0.7.0"),
    ("intelRdt closID", spec_with({"intelRdt": {"closID": "c"}}), "0.7.0"),
    ("additionalGids", spec_with({"additionalGids": [1]}), "0.7.0"),
    ("monitoring off", spec_with({"intelRdt": {"enableMonitoring": False}}), "0.7.0"),
    ("monitoring on", spec_with({"intelRdt": {"enableMonitoring": True}}), "1.1.0"),
    ("empty schemata", spec_with({"intelRdt": {"schemata": []}}), "1.1.0"),
    ("netDevices", spec_with(net({"hostInterfaceName": "a", "name": "b"})), "1.1.0"),
    (
        "spec-level netDevices",
        spec_with(ENV, containerEdits=net({"hostInterfaceName": "a", "name": "b"})),
        "1.1.0",
    ),
    (
        "newest trigger wins",
        spec_with({**mount(type="bind"), **net({"hostInterfaceName": "a", "name": "b"})}),
        "1.1.0",
    ),
]


@pytest.mark.parametrize(
    ("spec", "version"), [case[1:] for case in VERSIONS], ids=[case[0] for case in VERSIONS]
)
def test_minimum_version(spec: dict[str, Any], version: str) -> None:
    assert minimum_cdi_version(spec) == version


def test_written_version_is_the_minimum(store: CDIStore) -> None:
    write(store, UID, [ENV, node(hostPath="/dev/y")])
    spec = load(store.spec_path(UID))
    assert spec["cdiVersion"] == "0.5.0"
    assert minimum_cdi_version(spec) == spec["cdiVersion"]
