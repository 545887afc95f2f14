"""nodedra's container image, built without Docker (tests.peers.image), on a real node.

The image is built once per session from image/ (what the Dockerfile installs), before the test
run leaves the machine's network. Here it is read as containerd would unpack it (its layers:
no device nodes, the venv's entry point, nothing but the venv in nodedra's layer), then
imported into a real node's containerd and run there: ``nodedra version`` answers with the
version of these sources, on Debian's Python 3.11.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import uuid
from dataclasses import dataclass
from typing import Any

from nodedra import __version__
from tests.conftest import RealNodeFactory
from tests.peers.image import IMAGE_CONFIG, VENV
from tests.peers.image_base import PYTHON
from tests.peers.image_build import NodedraImage
from tests.peers.node import RealNode


@dataclass(frozen=True)
class LayerEntries:
    """One layer of the archive: its digest and its entries, in order."""

    digest: str
    members: list[tarfile.TarInfo]
    files: dict[str, bytes]
    """The content of the few files the tests look into, by path."""

    def names(self) -> set[str]:
        return {m.name.rstrip("/") for m in self.members}


#: Files whose content the tests read.
_READ = (
    f"{VENV.lstrip('/')}/bin/nodedra",
    f"{VENV.lstrip('/')}/lib/python3.11/site-packages/nodedra/__pycache__/cli.cpython-311.pyc",
)


def _json_member(archive: tarfile.TarFile, name: str) -> Any:
    member = archive.extractfile(name)
    assert member is not None, f"the archive has no {name}"
    return json.load(member)


def _json_blob(archive: tarfile.TarFile, digest: str) -> Any:
    return _json_member(archive, f"blobs/sha256/{digest.removeprefix('sha256:')}")


def _read_image(image: NodedraImage) -> tuple[dict[str, Any], list[LayerEntries]]:
    """The image's config and its layers, read from the archive as containerd reads it:
    index, manifest, config, layer blobs (each checked against its digest)."""
    layers = []
    with tarfile.open(image.archive) as archive:
        index = _json_member(archive, "index.json")
        (descriptor,) = index["manifests"]
        assert descriptor["digest"] == image.digest
        assert descriptor["annotations"]["io.containerd.image.name"] == image.name
        manifest = _json_blob(archive, descriptor["digest"])
        config = _json_blob(archive, manifest["config"]["digest"])
        for layer in manifest["layers"]:
            blob = archive.extractfile(f"blobs/sha256/{layer['digest'].removeprefix('sha256:')}")
            assert blob is not None, f"the archive has no layer blob {layer['digest']}"
            data = blob.read()
            assert "sha256:" + hashlib.sha256(data).hexdigest() == layer["digest"]
            assert len(data) == layer["size"]
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                members = tar.getmembers()
                files = {}
                for member in members:
                    if member.name in _READ and member.isreg():
                        content = tar.extractfile(member)
                        assert content is not None
                        files[member.name] = content.read()
            layers.append(LayerEntries(layer["digest"], members, files))
    return config, layers


def test_image_layers_hold_the_venv_and_no_device_nodes(nodedra_image: NodedraImage) -> None:
    config, layers = _read_image(nodedra_image)
    assert config["rootfs"]["diff_ids"] == [layer.digest for layer in layers]
    assert config["config"] == IMAGE_CONFIG.as_json()
    assert len(layers) == 2, "a base layer and nodedra's"
    base, nodedra = layers

    devices = [
        f"{layer.digest[:19]}: {m.name}"
        for layer in layers
        for m in layer.members
        if m.ischr() or m.isblk()
    ]
    assert devices == [], f"device nodes in the image (runtimes make /dev): {devices}"

    # The base is a Debian system with the interpreter; nodedra's layer is only the venv.
    assert {"usr/bin/python3.11", "usr/bin/dpkg", "var/lib/dpkg/status"} <= base.names()
    gone = ("usr/share/man/", "var/lib/apt/lists/", "var/cache/apt/archives/", "dev/")
    kept = {"var/cache/apt/archives/partial"}  # apt's own directory, empty
    stripped = sorted(n for n in base.names() if n.startswith(gone) and n not in kept)
    assert stripped == [], f"the base layer holds what a container needs not: {stripped[:20]}"
    tops = {n.split("/", 1)[0] for n in nodedra.names()}
    assert tops == {"opt"}, f"install.sh changed more than /opt: {sorted(tops)}"
    assert not any("/bin/pip" in n for n in nodedra.names()), "pip is left in the venv"

    entry = f"{VENV.lstrip('/')}/bin/nodedra"
    (member,) = [m for m in nodedra.members if m.name == entry]
    assert member.isreg(), f"{entry} is not a file"
    assert member.mode & 0o111, f"{entry} is not executable: mode {oct(member.mode)}"
    assert nodedra.files[entry].startswith(f"#!{VENV}/bin/python\n".encode())
    links = {m.name: m.linkname for m in nodedra.members if m.issym()}
    assert links[f"{VENV.lstrip('/')}/bin/python3.11"] == PYTHON

    # Every entry of nodedra's layer has one fixed time, so its .pyc files must not depend on
    # the sources' times: hash-based (PEP 552 flags 0b11), or they would never be used.
    pyc = nodedra.files[_READ[1]]
    assert int.from_bytes(pyc[4:8], "little") == 0b11, "nodedra's .pyc files are not hash-based"
    assert {m.mtime for m in nodedra.members} == {0}


def _run(node: RealNode, image: str, *argv: str) -> str:
    """Run ``argv`` in a container of ``image`` on the node (ctr run, the node's runc), in a
    cgroup below the node's root (so the node's teardown would find a leftover); its output."""
    name = f"image-test-{uuid.uuid4().hex[:8]}"
    return node.ctr(
        "run",
        "--rm",
        "--snapshotter",
        "overlayfs",
        "--cgroup",
        f"{node.cgroups.path}/{name}",
        image,
        name,
        *argv,
        timeout=120,
    )


def test_nodedra_version_in_a_container_on_a_real_node(
    nodedra_image: NodedraImage, real_node_factory: RealNodeFactory
) -> None:
    node = real_node_factory()
    name = node.import_image(nodedra_image.archive)
    assert name == nodedra_image.name == "docker.io/library/nodedra:" + __version__
    assert node.images[name] == nodedra_image.digest

    assert _run(node, name, "nodedra", "version").strip() == f"nodedra {__version__}"

    # The venv's interpreter is Debian's python3.11 (dpkg knows the file; Debian's sysconfig
    # has its install schemes), not some other CPython 3.11.
    script = (
        "import json, os, sys, sysconfig; print(json.dumps({"
        "'version': sys.version_info[:3], 'prefix': sys.prefix, 'base': sys.base_prefix, "
        "'executable': os.path.realpath(sys.executable), "
        "'schemes': sysconfig.get_scheme_names()}))"
    )
    python = json.loads(_run(node, name, "python", "-c", script))
    assert python["version"][:2] == [3, 11], python
    assert python["prefix"] == VENV, python
    assert python["base"] == "/usr", python
    assert python["executable"] == PYTHON, python
    assert "deb_system" in python["schemes"], f"not Debian's sysconfig: {python['schemes']}"
    owner = _run(node, name, "dpkg-query", "--search", PYTHON).strip()
    assert owner == f"python3.11-minimal: {PYTHON}"
    version = _run(node, name, "dpkg-query", "--show", "--showformat=${Version}", "python3.11")
    assert re.fullmatch(r"3\.11\.\d+-\d+\+deb12u\d+", version.strip()), version
