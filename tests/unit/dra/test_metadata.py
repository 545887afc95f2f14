"""Device metadata (KEP-5304): the files, their mounts, and their place in prepare and unprepare."""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodedra.dra import ClaimError, ClaimRef, metadata
from nodedra.dra.claims import AllocationResult
from nodedra.dra.metadata import POD_CLAIM_NAME_ANNOTATION, MetadataStore
from tests.peers.cluster import poll
from tests.unit.dra.fakes import DRIVER, make_claim, result
from tests.unit.dra.test_plugin import Rig

REF = ClaimRef("team-a", "db", "uid-1")
ROOT = "/var/run/kubernetes.io/dra-device-attributes"


def results(*pairs: tuple[str, str]) -> list[AllocationResult]:
    return [AllocationResult(request, DRIVER, "node-1", device) for request, device in pairs]


def stream(content: bytes) -> list[dict[str, Any]]:
    """The JSON objects of a metadata file, in order (as a reader decodes the stream)."""
    decoder, text, objects, at = json.JSONDecoder(), content.decode(), [], 0
    while text[at:].strip():
        found, end = decoder.raw_decode(text, at)
        objects.append(found)
        at = end
        while at < len(text) and text[at].isspace():
            at += 1
    return objects


def claim_of(ref: ClaimRef, annotations: dict[str, Any] | None = None) -> dict[str, Any]:
    claim = make_claim(ref.uid, [], namespace=ref.namespace, name=ref.name)
    if annotations is not None:
        claim["metadata"]["annotations"] = annotations
    return claim


@pytest.fixture
def store(tmp_path: Path) -> MetadataStore:
    return MetadataStore(DRIVER, tmp_path / "plugin")


def test_one_file_per_request_with_its_devices_newest_version_first(
    store: MetadataStore, tmp_path: Path
) -> None:
    attributes = [{"cpus": {"string": "2"}}, {"cpus": {"string": "3"}}, {"cpus": {"string": "8"}}]
    made = store.claim_metadata(
        REF,
        claim_of(REF),
        results(("cpus", "cpu002"), ("cpus", "cpu003"), ("spare", "cpu008")),
        attributes,
    )
    cpus, spare = made.files
    assert cpus.path == tmp_path / "plugin/dra-device-metadata/team-a_db/cpus/metadata.json"
    assert cpus.container_path == f"{ROOT}/resourceclaims/db/cpus/{DRIVER}-metadata.json"
    assert (cpus.first_result, spare.first_result) == (0, 2)
    beta, alpha = stream(cpus.content)
    assert beta == {
        "kind": "DeviceMetadata",
        "apiVersion": "metadata.resource.k8s.io/v1beta1",
        "metadata": {"name": "db", "namespace": "team-a", "uid": "uid-1", "generation": 1},
        "requests": [
            {
                "name": "cpus",
                "devices": [
                    {
                        "driver": DRIVER,
                        "pool": "node-1",
                        "name": "cpu002",
                        "attributes": {"cpus": {"string": "2"}},
                    },
                    {
                        "driver": DRIVER,
                        "pool": "node-1",
                        "name": "cpu003",
                        "attributes": {"cpus": {"string": "3"}},
                    },
                ],
            }
        ],
    }
    assert alpha == {**beta, "apiVersion": "metadata.resource.k8s.io/v1alpha1"}
    assert [d["name"] for d in stream(spare.content)[0]["requests"][0]["devices"]] == ["cpu008"]


def test_the_first_result_of_each_request_mounts_its_file_read_only(
    store: MetadataStore,
) -> None:
    made = store.claim_metadata(
        REF,
        claim_of(REF),
        results(("a", "cpu000"), ("a", "cpu001"), ("b", "cpu004")),
        [{}, {}, {}],
    )
    edits = made.with_mounts([{"env": ["X=0"]}, {"env": ["X=1"]}, {"env": ["X=4"], "mounts": []}])
    assert edits[1] == {"env": ["X=1"]}
    for index, file in ((0, made.files[0]), (2, made.files[1])):
        (mount,) = edits[index]["mounts"]
        assert mount == {
            "hostPath": str(file.path),
            "containerPath": file.container_path,
            "options": ["ro", "bind"],
        }


def test_a_claim_from_a_template_is_found_under_the_pods_name_for_it(
    store: MetadataStore,
) -> None:
    claim = claim_of(REF, {POD_CLAIM_NAME_ANNOTATION: "pinned"})
    (file,) = store.claim_metadata(REF, claim, results(("cpus/fast", "cpu001")), [{}]).files
    assert (
        file.container_path == f"{ROOT}/resourceclaimtemplates/pinned/cpus/{DRIVER}-metadata.json"
    )
    assert file.path.parent.name == "cpus"
    first = stream(file.content)[0]
    assert first["podClaimName"] == "pinned"
    assert first["requests"][0]["name"] == "cpus/fast"  # the subrequest chosen, as the results say


@pytest.mark.parametrize(
    ("claim", "pairs", "attributes", "message"),
    [
        (claim_of(REF), [("cpus", "cpu0")], [], "described 0 devices for 1 allocation results"),
        (claim_of(REF), [("..", "cpu0")], [{}], "request name '..' is not a DNS label"),
        (
            claim_of(REF, {POD_CLAIM_NAME_ANNOTATION: "a/b"}),
            [("cpus", "cpu0")],
            [{}],
            "annotation resource.kubernetes.io/pod-claim-name is 'a/b'",
        ),
        (
            claim_of(REF),
            [("cpus", "cpu0")],
            [{f"a{i}": {"int": i} for i in range(33)}],
            "device cpu0 has 33 attributes, more than the 32",
        ),
        (
            claim_of(REF),
            [("cpus", "cpu0")],
            [{"cpus": {"list": [1]}}],
            "device cpu0's attribute 'cpus' is {'list': [1]}",
        ),
    ],
)
def test_what_cannot_be_written_fails_the_claim_naming_it(
    store: MetadataStore,
    claim: dict[str, Any],
    pairs: list[tuple[str, str]],
    attributes: list[dict[str, Any]],
    message: str,
) -> None:
    with pytest.raises(ClaimError, match=re.escape(message)) as caught:
        store.claim_metadata(REF, claim, results(*pairs), attributes)
    assert str(REF) in str(caught.value)


def test_removal_leaves_a_namesakes_files_and_the_sweep_keeps_the_held(
    store: MetadataStore,
) -> None:
    old, new, other = REF, ClaimRef(REF.namespace, REF.name, "uid-2"), ClaimRef("b", "c", "u3")
    store.write(store.claim_metadata(old, claim_of(old), results(("a", "cpu0")), [{}]))
    store.write(store.claim_metadata(new, claim_of(new), results(("b", "cpu1")), [{}]))
    store.write(store.claim_metadata(other, claim_of(other), results(("a", "cpu2")), [{}]))
    assert {uid: len(paths) for uid, paths in store.claim_uids().items()} == {
        "uid-1": 1,
        "uid-2": 1,
        "u3": 1,
    }
    store.remove_claim(old)
    assert sorted(store.claim_uids()) == ["u3", "uid-2"]
    store.remove_claim(old)  # gone already: nothing to do
    (store.claim_dir("b", "c") / "leftover").mkdir()  # a crash between mkdir and the file
    (store.claim_dir("b", "c") / "a" / ".metadata.json.x1.tmp").write_text("{")
    (store.claim_dir("b", "c") / "unreadable").mkdir()
    (store.claim_dir("b", "c") / "unreadable" / "metadata.json").write_text("{")
    assert store.remove_leftovers() == [".metadata.json.x1.tmp"]
    assert sorted(store.remove_unheld(frozenset({"u3"}))) == ["", "uid-2"]
    assert sorted(store.claim_uids()) == ["u3"]
    assert not store.claim_dir(REF.namespace, REF.name).exists()
    assert sorted(p.name for p in store.claim_dir("b", "c").iterdir()) == ["a"], "only u3's left"
    mode = (store.claim_dir("b", "c") / "a" / "metadata.json").stat().st_mode & 0o777
    assert mode == 0o644, "containers may run as any user"


def test_a_claim_known_by_its_uid_alone_has_its_files_removed_wherever_they_are(
    store: MetadataStore,
) -> None:
    """An orphan released from a checkpoint that kept no name: its files name its UID."""
    old, new, other = REF, ClaimRef(REF.namespace, REF.name, "uid-2"), ClaimRef("b", "c", "u3")
    store.write(store.claim_metadata(old, claim_of(old), results(("a", "cpu0")), [{}]))
    store.write(store.claim_metadata(new, claim_of(new), results(("b", "cpu1")), [{}]))
    store.write(store.claim_metadata(other, claim_of(other), results(("a", "cpu2")), [{}]))
    (store.claim_dir("b", "c") / "unreadable").mkdir()
    (store.claim_dir("b", "c") / "unreadable" / "metadata.json").write_text("{")
    store.remove_claim(ClaimRef("", "", "uid-1"))
    assert sorted(store.claim_uids()) == ["", "u3", "uid-2"], "uid-1's files are gone"
    store.remove_claim(ClaimRef("", "", ""))
    assert sorted(store.claim_uids()) == ["", "u3", "uid-2"], "no UID: no file of a claim"
    store.remove_emptied()
    claim_dir = store.claim_dir(REF.namespace, REF.name)
    assert sorted(p.name for p in claim_dir.iterdir()) == ["b"], "its directory went too"


# --- in a prepare and an unprepare ----------------------------------------------------


def metadata_files(rig: Rig) -> list[str]:
    root = rig.plugin.metadata.directory
    return sorted(str(p.relative_to(root)) for p in root.glob("*/*/metadata.json"))


def test_a_prepared_claim_has_its_metadata_mounted_and_unprepare_removes_it(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path)
    rig.plugin.allow_claims()
    ref = rig.add(make_claim("u1", [result("cpus", "cpu-0"), result("cpus", "cpu-1")]))
    (answer,) = rig.plugin.node_prepare([ref]).values()
    assert answer.error is None
    assert metadata_files(rig) == ["default_claim-u1/cpus/metadata.json"]
    spec = json.loads((rig.cdi_dir / rig.specs()[0]).read_text())
    first, second = spec["devices"]
    (mount,) = first["containerEdits"]["mounts"]
    assert Path(mount["hostPath"]) == rig.plugin.metadata.claim_dir("default", "claim-u1") / (
        "cpus/metadata.json"
    )
    assert "mounts" not in second["containerEdits"]
    devices = stream(Path(mount["hostPath"]).read_bytes())[0]["requests"][0]["devices"]
    assert [d["attributes"] for d in devices] == [
        {"device": {"string": "cpu-0"}},
        {"device": {"string": "cpu-1"}},
    ]
    assert rig.plugin.node_unprepare([ref]) == {"u1": None}
    assert metadata_files(rig) == []
    assert rig.specs() == []


def test_metadata_that_cannot_be_written_fails_the_claim_and_releases_it(
    tmp_path: Path,
) -> None:
    blocked = tmp_path / "plugins" / DRIVER / "dra-device-metadata"
    blocked.parent.mkdir(parents=True)
    blocked.write_text("a file where the directory should be")
    rig = Rig(tmp_path)
    rig.plugin.allow_claims()
    good = rig.add(make_claim("good", [result("cpus", "cpu-0")]))
    (answer,) = rig.plugin.node_prepare([good]).values()
    assert "writing its device metadata to" in str(answer.error)
    assert "claim default/claim-good (good)" in str(answer.error)
    assert rig.policy.releases == ["good"]
    assert rig.specs() == []


def test_the_directories_a_removal_empties_go_at_the_next_sweep(store: MetadataStore) -> None:
    """Off the unprepare's time: its files go at once, its directories with the sweep,
    and a namesake's request directory stays."""
    old, new = REF, ClaimRef(REF.namespace, REF.name, "uid-2")
    store.write(store.claim_metadata(old, claim_of(old), results(("a", "cpu0")), [{}]))
    store.write(store.claim_metadata(new, claim_of(new), results(("b", "cpu1")), [{}]))
    claim_dir = store.claim_dir(REF.namespace, REF.name)
    store.remove_claim(old)
    assert sorted(p.name for p in claim_dir.iterdir()) == ["a", "b"]
    assert not (claim_dir / "a" / "metadata.json").exists()
    store.remove_emptied()
    assert sorted(p.name for p in claim_dir.iterdir()) == ["b"]
    store.remove_claim(new)
    store.remove_emptied()
    assert not claim_dir.exists()
    assert store.directory.is_dir(), "the store's own directory stays"


def test_the_sweeper_removes_emptied_directories_inside_the_locks_it_is_given(
    store: MetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metadata, "SWEEP_DELAY", 0.05)
    held = threading.Lock()
    sweeps_held: list[bool] = []

    @contextlib.contextmanager
    def hold() -> Iterator[None]:
        with held:
            sweeps_held.append(True)
            yield

    store.write(store.claim_metadata(REF, claim_of(REF), results(("a", "cpu0")), [{}]))
    store.start_sweeping(hold)
    try:
        store.remove_claim(REF)
        claim_dir = store.claim_dir(REF.namespace, REF.name)
        poll(lambda: (not claim_dir.exists()) or None, 30, lambda: "the sweep")
    finally:
        store.stop_sweeping(hold)
    assert sweeps_held, "swept outside the locks"
    store.write(store.claim_metadata(REF, claim_of(REF), results(("a", "cpu0")), [{}]))
    store.remove_claim(REF)
    store.stop_sweeping(hold)  # a stop sweeps what is left
    assert not store.claim_dir(REF.namespace, REF.name).exists()
