"""The repository's Dockerfile, built by buildah (tests.peers.dockerfile_image), against the
image the other tests run (tests.peers.image), and as the DaemonSet's image on a real node.

The unit test tests/unit/test_image_recipe.py reads the Dockerfile's text; here it has been
run. Its image must hold what tests.peers.image's holds: the same Debian packages at the same
versions (dpkg's status of each image), the same venv at /opt/nodedra (the distributions
installed and every file's path, type, size and mode), and the same ENTRYPOINT, CMD, ENV,
WORKDIR and USER. Then ``kubectl apply -k manifests/`` runs it on a real node as an admin's
cluster would, and its pod serves the node. A cold build takes minutes, so this module runs in
``tox -e dockerfile``, not in the default run.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.peers.build import PeerBinaries
from tests.peers.cluster import resource_slices
from tests.peers.deployment import DeploymentCluster
from tests.peers.image import DEFAULT_NAME, IMAGE_CONFIG, VENV
from tests.peers.image_build import NodedraImage
from tests.peers.nodedra_node import MANIFESTS, ROOT, TOPOLOGY_AWARE

#: The files whose content the comparison reads.
DPKG_STATUS = "var/lib/dpkg/status"
SITE_PACKAGES = f"{VENV.lstrip('/')}/lib/python3.11/site-packages"


@dataclass(frozen=True)
class Entry:
    """What the comparison keeps of a file of the image: its type, size, mode and link."""

    kind: str
    size: int
    mode: int
    link: str


@dataclass(frozen=True)
class ImageContents:
    """An image as a container sees it: its config and its layers applied in order."""

    config: dict[str, Any]
    files: dict[str, Entry]
    dpkg_status: str

    def below(self, directory: str) -> dict[str, Entry]:
        return {p: e for p, e in self.files.items() if p.startswith(directory + "/")}


def _kind(member: tarfile.TarInfo) -> str:
    for kind, test in (("dir", member.isdir), ("symlink", member.issym), ("link", member.islnk)):
        if test():
            return kind
    return "file" if member.isreg() else f"type {member.type!r}"


def _blob(archive: tarfile.TarFile, digest: str) -> bytes:
    member = archive.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
    assert member is not None, f"the archive has no blob {digest}"
    return member.read()


def _layer_members(data: bytes) -> Iterator[tuple[tarfile.TarInfo, tarfile.TarFile]]:
    """A layer's entries (plain or gzip: buildah compresses, tests.peers.image does not)."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as layer:
        for member in layer:
            yield member, layer


def read_image(image: NodedraImage) -> ImageContents:
    """The config and the merged layers of an image's archive, whiteouts applied (OCI:
    ``.wh.<name>`` deletes a lower entry, ``.wh..wh..opq`` empties its directory)."""
    files: dict[str, Entry] = {}
    status = ""
    with tarfile.open(image.archive) as archive:
        index_file = archive.extractfile("index.json")
        assert index_file is not None
        (descriptor,) = json.load(index_file)["manifests"]
        assert descriptor["digest"] == image.digest
        manifest = json.loads(_blob(archive, descriptor["digest"]))
        config = json.loads(_blob(archive, manifest["config"]["digest"]))
        for layer in manifest["layers"]:
            for member, layer_tar in _layer_members(_blob(archive, layer["digest"])):
                path = member.name.removeprefix("./").rstrip("/")
                parent, _, name = path.rpartition("/")
                if name == ".wh..wh..opq":
                    files = {p: e for p, e in files.items() if not p.startswith(parent + "/")}
                    continue
                if name.startswith(".wh."):
                    gone = f"{parent}/{name[4:]}" if parent else name[4:]
                    files = {
                        p: e for p, e in files.items() if p != gone and not p.startswith(gone + "/")
                    }
                    continue
                files[path] = Entry(
                    _kind(member),
                    member.size if member.isreg() else 0,
                    member.mode & 0o7777,  # Go's tar writes the type bits too, Python's not
                    member.linkname,
                )
                if path == DPKG_STATUS:
                    content = layer_tar.extractfile(member)
                    assert content is not None
                    status = content.read().decode()
    assert status, f"{image.archive} has no {DPKG_STATUS}"
    return ImageContents(config, files, status)


def installed_packages(status: str) -> dict[str, str]:
    """``package:architecture`` -> version of the packages dpkg's status file says are
    installed."""
    packages = {}
    for stanza in re.split(r"\n\s*\n", status.strip()):
        fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", stanza, re.MULTILINE))
        if fields.get("Status") == "install ok installed":
            packages[f"{fields['Package']}:{fields['Architecture']}"] = fields["Version"]
    return packages


def distributions(contents: ImageContents) -> dict[str, str]:
    """name -> version of the distributions installed in the venv (its ``.dist-info``
    directories, named ``<name>-<version>.dist-info``)."""
    found = {}
    for path, entry in contents.below(SITE_PACKAGES).items():
        name = path.removeprefix(SITE_PACKAGES + "/")
        if entry.kind == "dir" and "/" not in name and name.endswith(".dist-info"):
            distribution, _, version = name.removesuffix(".dist-info").rpartition("-")
            found[distribution.lower()] = version
    return found


def _differences(name: str, ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """What differs between two mappings, one line each (at most 40)."""
    lines = [
        f"{name} {key}: Dockerfile {ours.get(key, '(none)')}, test build "
        f"{theirs.get(key, '(none)')}"
        for key in sorted(ours.keys() | theirs.keys())
        if ours.get(key) != theirs.get(key)
    ]
    return lines[:40] + ([f"... and {len(lines) - 40} more"] if len(lines) > 40 else [])


@pytest.fixture(scope="module")
def both(
    dockerfile_image: NodedraImage, nodedra_image: NodedraImage
) -> tuple[ImageContents, ImageContents]:
    """The Dockerfile's image and the test build's, read."""
    return read_image(dockerfile_image), read_image(nodedra_image)


def test_dockerfile_image_is_the_test_build(
    both: tuple[ImageContents, ImageContents], dockerfile_image: NodedraImage
) -> None:
    """Same packages, same venv, same configuration; nothing of the build left behind."""
    ours, theirs = both
    assert dockerfile_image.name == DEFAULT_NAME

    wanted = IMAGE_CONFIG.as_json()
    for contents in (ours, theirs):
        config = contents.config["config"]
        found = {key: config.get(key) for key in wanted}
        found["Env"] = sorted(found["Env"] or [])
        assert found == {**wanted, "Env": sorted(wanted["Env"])}

    ours_packages = installed_packages(ours.dpkg_status)
    theirs_packages = installed_packages(theirs.dpkg_status)
    assert any(name.startswith("python3.11:") for name in ours_packages), ours_packages
    differences = _differences("package", ours_packages, theirs_packages)
    assert not differences, (
        "the two builds installed different Debian packages (a version alone differing means "
        "the archive had a point release between the two cached builds: remove the cache "
        "entries image-base-* and dockerfile-* and build again):\n" + "\n".join(differences)
    )

    ours_dists, theirs_dists = distributions(ours), distributions(theirs)
    assert {"nodedra", "kopf", "kubernetes", "grpcio", "protobuf"} <= ours_dists.keys()
    assert "pip" not in ours_dists, "pip is left in the venv"
    differences = _differences("distribution", ours_dists, theirs_dists)
    assert not differences, "the venvs hold different distributions:\n" + "\n".join(differences)

    # Every file of the venv, down to the byte code: the same wheels installed the same way.
    differences = _differences(
        "venv file", dict(ours.below(VENV.lstrip("/"))), dict(theirs.below(VENV.lstrip("/")))
    )
    assert not differences, "the venvs differ:\n" + "\n".join(differences)

    # The RUN mounts (image/ at /image, the wheels at /wheels) leave nothing in the image.
    tops = {path.split("/", 1)[0] for path in ours.files}
    assert tops == {path.split("/", 1)[0] for path in theirs.files}
    assert not {"image", "wheels", "src"} & tops


@pytest.fixture
def deployed(
    node_binaries: PeerBinaries,
    dra_gates: dict[str, bool],
    dockerfile_image: NodedraImage,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[DeploymentCluster]:
    """A cluster whose real node's containerd has the Dockerfile's image (imported from
    buildah's archive as if pulled), with ``kubectl apply -k manifests/`` done."""
    cluster = DeploymentCluster(
        node_binaries,
        tmp_path_factory.mktemp("dockerfile-deploy"),
        dra_gates,
        [dockerfile_image.archive],
        repo=ROOT,
    )
    with cluster:
        cluster.kubectl("apply", "-k", str(MANIFESTS))
        yield cluster


@pytest.mark.timeout(900)
def test_dockerfile_image_runs_as_the_daemonset(
    deployed: DeploymentCluster, dockerfile_image: NodedraImage
) -> None:
    """The DaemonSet of manifests/ runs the Dockerfile's image: its pod gets Ready (registered
    with the kubelet, NRI connected) and the node's ResourceSlices are published."""
    assert deployed.node.images[DEFAULT_NAME] == dockerfile_image.digest
    deployed.rollout_status()
    pod = deployed.wait_single_ready_pod()
    (container,) = pod["status"]["containerStatuses"]
    assert container["image"] == DEFAULT_NAME
    assert container["restartCount"] == 0
    slices = resource_slices(deployed.cp, deployed.node.node_name, TOPOLOGY_AWARE)
    assert slices, "no ResourceSlice of the node"
    assert sum(len(s["spec"].get("devices") or []) for s in slices) > 0
