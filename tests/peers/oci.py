"""OCI image archives made by hand: the test node needs no registry, this machine no Docker.

containerd imports an OCI image layout from a tar archive (``ctr images import``) and names the
image after the ``io.containerd.image.name`` annotation of the index, so the node's images are
written here from the binaries of the peer build: one uncompressed layer holding the binary, a
config naming it as the entrypoint, a manifest and an index. The archive is deterministic (fixed
timestamps and owners), so an unchanged binary gives an image with the same digest.

Images of several prepared layers (nodedra's own, tests.peers.image) go through the same
writer: `write_layers_archive` takes uncompressed layer tars on disk (`Layer`, streamed, never
read into memory whole) and an `ImageConfig`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import re
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"

#: Go's names of the machines, which OCI platforms use.
_GOARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le"}


def host_architecture() -> str:
    """This machine's architecture as an OCI platform names it."""
    machine = platform.machine()
    return _GOARCH.get(machine, machine)


@dataclass(frozen=True)
class ImageSpec:
    """One single-binary image: ``binary`` lands at ``/<path_in_image>`` and is the entrypoint."""

    name: str
    """The full reference the node knows it by, e.g. ``nodedra.test/workload:v1``."""
    binary: Path
    path_in_image: str
    env: Mapping[str, str] = field(default_factory=dict)
    cmd: Sequence[str] = ()

    @property
    def entrypoint(self) -> list[str]:
        return ["/" + self.path_in_image]


@dataclass(frozen=True)
class Layer:
    """A prepared layer: an uncompressed tar archive on disk.

    Uncompressed, so its digest is also its diff ID (what the config's ``rootfs`` lists and
    containerd checks after unpacking): nothing to decompress when importing, nothing to
    recompress when only another layer changed.
    """

    path: Path
    digest: str
    """``sha256:<hex>`` of the file."""
    size: int

    @classmethod
    def of(cls, path: Path) -> Layer:
        """The layer at ``path``, hashed in chunks (layers are many megabytes)."""
        digest = hashlib.sha256()
        size = 0
        with open(path, "rb") as stream:
            while chunk := stream.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
        return cls(path, "sha256:" + digest.hexdigest(), size)


@dataclass(frozen=True)
class ImageConfig:
    """What a container of the image runs, as a Dockerfile's ENTRYPOINT, CMD, ENV, WORKDIR
    and USER say it."""

    entrypoint: Sequence[str]
    cmd: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    working_dir: str = ""
    user: str = ""

    def as_json(self) -> dict[str, Any]:
        """The ``config`` object of the image configuration (empty fields left out, except
        those single-binary images have always written, whose digests must not change)."""
        config: dict[str, Any] = {
            "Entrypoint": list(self.entrypoint),
            "Cmd": list(self.cmd) or None,
            "Env": [f"{k}={v}" for k, v in sorted(self.env.items())],
        }
        if self.working_dir:
            config["WorkingDir"] = self.working_dir
        if self.user:
            config["User"] = self.user
        return config


def _blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def _descriptor(media_type: str, digest: str, data: bytes | int, **extra: Any) -> dict[str, Any]:
    size = data if isinstance(data, int) else len(data)
    return {"mediaType": media_type, "digest": digest, "size": size, **extra}


def _tar_member(
    tar: tarfile.TarFile, name: str, data: bytes | IO[bytes], mode: int, size: int = -1
) -> None:
    """Add a file with fixed owner and timestamp; ``data`` is its content or a stream of
    ``size`` bytes."""
    info = tarfile.TarInfo(name)
    info.size = len(data) if isinstance(data, bytes) else size
    info.mode = mode
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    tar.addfile(info, io.BytesIO(data) if isinstance(data, bytes) else data)


def _layer(spec: ImageSpec) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _tar_member(tar, spec.path_in_image, spec.binary.read_bytes(), 0o755)
    return buffer.getvalue()


def _json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def write_image_archive(spec: ImageSpec, path: Path) -> str:
    """Write ``spec`` as an OCI image layout archive at ``path``; returns the manifest digest."""
    layer_digest, layer = _blob(_layer(spec))
    config = ImageConfig(entrypoint=spec.entrypoint, cmd=spec.cmd, env=spec.env)
    return _write_archive(spec.name, [(layer_digest, layer)], config, path)


def write_layers_archive(
    name: str,
    layers: Sequence[Layer],
    config: ImageConfig,
    path: Path,
    history: Sequence[str] = (),
) -> str:
    """Write an image of prepared ``layers`` (lowest first) as an OCI image layout archive at
    ``path``, named ``name`` for containerd; returns the manifest digest.

    ``history``, when given, says what made each layer (the config's ``history``, one
    ``created_by`` a layer): containerd needs none, but buildah refuses to build on an image
    whose history lists fewer layers than it has (tests.peers.dockerfile_image). The archive
    is written beside ``path`` and renamed into place, so a reader (or a parallel build)
    never sees half of one.
    """
    if not layers:
        raise ValueError(f"image {name} needs at least one layer")
    if history and len(history) != len(layers):
        raise ValueError(f"image {name}: {len(history)} history entries for {len(layers)} layers")
    return _write_archive(name, [(layer.digest, layer) for layer in layers], config, path, history)


def _write_archive(
    name: str,
    layers: Sequence[tuple[str, bytes | Layer]],
    image_config: ImageConfig,
    path: Path,
    history: Sequence[str] = (),
) -> str:
    """The OCI layout of one image: the layers' blobs, its config, manifest and index."""
    arch = host_architecture()
    config_json: dict[str, Any] = {
        "architecture": arch,
        "os": "linux",
        "config": image_config.as_json(),
        # Uncompressed: the layer's digest is its diff ID.
        "rootfs": {"type": "layers", "diff_ids": [digest for digest, _ in layers]},
    }
    if history:
        config_json["history"] = [{"created_by": line} for line in history]
    config_digest, config = _blob(_json(config_json))

    def size(layer: bytes | Layer) -> int:
        return len(layer) if isinstance(layer, bytes) else layer.size

    manifest_digest, manifest = _blob(
        _json(
            {
                "schemaVersion": 2,
                "mediaType": MEDIA_MANIFEST,
                "config": _descriptor(MEDIA_CONFIG, config_digest, config),
                "layers": [
                    _descriptor(MEDIA_LAYER, digest, size(layer)) for digest, layer in layers
                ],
            }
        )
    )
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"
    index = _json(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": [
                _descriptor(
                    MEDIA_MANIFEST,
                    manifest_digest,
                    manifest,
                    platform={"architecture": arch, "os": "linux"},
                    annotations={
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": tag,
                    },
                )
            ],
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        with tarfile.open(partial, mode="w", format=tarfile.PAX_FORMAT) as tar:
            _tar_member(tar, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}), 0o644)
            _tar_member(tar, "index.json", index, 0o644)
            written: set[str] = set()
            for digest, layer in layers:
                if digest in written:
                    continue  # two equal layers are one blob
                written.add(digest)
                member = f"blobs/sha256/{digest.removeprefix('sha256:')}"
                if isinstance(layer, bytes):
                    _tar_member(tar, member, layer, 0o644)
                else:
                    with open(layer.path, "rb") as stream:
                        _tar_member(tar, member, stream, 0o644, layer.size)
            for digest, data in ((config_digest, config), (manifest_digest, manifest)):
                _tar_member(tar, f"blobs/sha256/{digest.removeprefix('sha256:')}", data, 0o644)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return manifest_digest


def archive_image(archive: Path) -> tuple[str, str]:
    """The name ``ctr images import`` gives the image of an OCI archive, and the digest of its
    manifest. The name is what the archive's index gives: its ``io.containerd.image.name``
    annotation, else (buildah writes only that) an ``org.opencontainers.image.ref.name`` that
    is a whole reference, which ``ctr images import`` then names the image by as it stands.
    Raises OSError, tarfile.TarError, KeyError, IndexError or ValueError when ``archive`` is
    not an OCI image archive with a named image."""
    with tarfile.open(archive) as tar:
        index_file = tar.extractfile("index.json")
        if index_file is None:
            raise KeyError("index.json")
        index = json.load(index_file)
    manifest = index["manifests"][0]
    annotations = manifest["annotations"]
    name = str(
        annotations.get("io.containerd.image.name")
        or annotations["org.opencontainers.image.ref.name"]
    )
    if not re.search(r"[/:@]", name):
        # ctr would name the image import-<date>:<tag>, not a name a pod can use.
        raise KeyError(f"a reference name that is only a tag ({name})")
    return name, str(manifest["digest"])
